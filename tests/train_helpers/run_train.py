"""Run the train step in its own process: `python run_train.py SPEC.json`.

SPEC holds `output`, `config`, `deps`, `runtime` (a StepContext's fields) and
optionally `compile_cache` (a JAX persistent compilation cache directory, so the
test's processes compile each program once), `save_looks_s` (each checkpoint save
moves `time.perf_counter` on by that many seconds: a slow save, without waiting) and
`stop_after_save` (a step: the job's stop handlers are installed, and SIGTERM comes
right after that step's save began). Prints the result as the last line
of stdout (JSON). The tests kill it, rerun it, and run several at once as the
processes of one multi-host run.
"""

from __future__ import annotations

import json
import sys


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("compile_cache"):
        import jax

        jax.config.update("jax_compilation_cache_dir", spec["compile_cache"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if spec.get("save_looks_s"):
        import time

        from marin_rules.train import checkpoint

        real_clock, real_save, skipped = time.perf_counter, checkpoint.save, [0.0]
        time.perf_counter = lambda: real_clock() + skipped[0]

        def save(*args, **kwargs):
            skipped[0] += spec["save_looks_s"]
            return real_save(*args, **kwargs)

        checkpoint.save = save
    if spec.get("stop_after_save"):  # as a job is stopped: SIGTERM just after that save began
        import os
        import signal

        from marin_rules.job.run import install_stop_handlers
        from marin_rules.train import checkpoint

        install_stop_handlers()
        started_save = checkpoint.save

        def save_then_stop(manager, step, *args, **kwargs):
            started_save(manager, step, *args, **kwargs)
            if step == spec["stop_after_save"]:
                os.kill(os.getpid(), signal.SIGTERM)  # JobTerminated is raised here, the save in flight

        checkpoint.save = save_then_stop
    from marin_rules.artifacts.context import StepContext
    from marin_rules.train.step import train

    ctx = StepContext(
        name="checkpoints/test", version="v1", config=spec["config"], deps=spec["deps"],
        runtime=spec.get("runtime", {}), output=spec["output"],
    )  # fmt: skip
    result = train(ctx)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
