"""Helpers for the train step's tests: synthetic token data and subprocess runners."""
