"""Evaluation with lm-evaluation-harness: the `evaluate` step and the `marin` lm-eval model.

Modules, in the order data flows: `config.py` (the step's options and checker; no
JAX, no lm-eval), `tasks.py` (local task YAML + JSONL from held-out plays),
`scoring.py` (the array-level Scorer interface, and the JAX model behind it),
`lm.py` (the lm-eval model `marin`), `baseline.py` (the unigram baseline,
`marin-unigram`), `report.py` (headline metrics, standard errors, the results table
and chart), `step.py` (`evaluate(ctx)`), `cli.py` (`lm_eval` with our models
registered). This package's top level imports nothing heavy.
"""
