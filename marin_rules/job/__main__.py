"""`python -m marin_rules.job ...`: build one artifact (see marin_rules.job.main).

A job stopped by a signal (exit status 128 + N) has written its failure record and
released its lease by the time `main` returns; it then leaves the pod's distributed
runtime (process 0 hosts the coordinator the other processes need until they have
written their own failure records) and exits at once, without the interpreter's
teardown (atexit handlers, a user step's too, do not run), which crashed the process
(SIGSEGV) when the signal came while XLA was compiling in its own threads. So does a job
whose signal came after its record was written (exit status 0: the build is finished)."""

import os
import sys

from marin_rules.job.main import main
from marin_rules.job.run import stopped_after_record

code = main()
late = code == 0 and stopped_after_record()
if late:  # the record was written before the signal came: the build is finished
    print(f"marin-rules: {late} came after the step's record was written: the build is finished", file=sys.stderr)
if code >= 128 or late:
    sys.stdout.flush()
    sys.stderr.flush()
    if "jax" in sys.modules:
        import jax

        if jax.distributed.is_initialized():
            jax.distributed.shutdown()
    os._exit(code)
sys.exit(code)
