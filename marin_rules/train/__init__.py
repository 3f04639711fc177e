"""The `train` step: training a mixture-of-experts language model with JAX.

Modules, in the order a run uses them: `config` (the recipe, checked without JAX),
`distributed` (joining the processes of a multi-host run), `optim` (AdamW / Muon by
parameter role, and the schedule), `steps` (the jitted init, train and eval steps,
global batches), `loop` (the run: steps, validation, checkpoints), `report` (timing,
records, the result, `model.json`), `unigram` (the baseline loss), `checkpoint`
(orbax save and resume), `recipe` (the recipe the checkpoints belong to, checked
before a resume), `metrics` (JSONL and the loss curve), `step` (`train(ctx)`, the
entry point) and `load` (`load_trained`, the trained model back for evaluation).
This package's top level imports nothing heavy: experiment checkers import
`marin_rules.train.config` without JAX.
"""
