"""Errors that name what to fix.

`ConfigError` carries the dotted path of the offending field inside an artifact's
`config` (or `deps`, `runtime`); the experiment loader prefixes it with the artifact's
`name@version`, giving one line such as
`checkpoints/nano-moe@v1: config.optimizer.learning_rate: expected a number > 0, got 'fast'`.
"""

from __future__ import annotations


class MarinError(Exception):
    """Base class for errors meant to be shown to the user as one line."""


class ConfigError(MarinError):
    """A bad value in an experiment file; `field` is a dotted path such as
    `config.optimizer.learning_rate` (steps' checkers give it relative to `config`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def within(self, parent: str) -> "ConfigError":
        """The same error with `parent.` in front of its field."""
        field = f"{parent}.{self.field}" if self.field else parent
        return ConfigError(field, self.message)


class ExperimentError(MarinError):
    """A whole-experiment problem: a cycle, a missing dependency, a bad key."""


class DriftError(MarinError):
    """A pinned artifact (`expect_fingerprint:`) whose recipe no longer matches."""


class StepError(MarinError):
    """A step failed for a reason the user can fix (empty corpus, missing source)."""
