"""The `train` step: training a mixture-of-experts language model with JAX.

Modules, in the order a run uses them: `config` (the recipe, checked without JAX),
`distributed` (joining the processes of a multi-host run), `optim` (AdamW / Muon and
the schedule), `loop` (the jitted step, metrics, evaluation), `checkpoint` (orbax
save and resume), `recipe` (the recipe the checkpoints belong to, checked before a
resume), `metrics` (JSONL and the loss curve), `step` (`train(ctx)`, the
entry point) and `load` (`load_trained`, the trained model back for evaluation).
This package's top level imports nothing heavy: experiment checkers import
`marin_rules.train.config` without JAX.
"""
