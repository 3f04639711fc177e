"""The job runner: each step runs in its own process, `python -m marin_rules.job`.

Model: `main` (the process: log, lease, forced rebuilds, upstream checks) and `run`
(calling the step: signals, success and failure records). The process owns its main
thread and its signals, so SIGTERM/SIGINT stop a step wherever it is.
"""
