"""`python -m marin_rules.job ...`: build one artifact (see marin_rules.job.main).

A job stopped by a signal (exit status 128 + N) has written its failure record and
released its lease by the time `main` returns; it then leaves the pod's distributed
runtime (process 0 hosts the coordinator the other processes need until they have
written their own failure records) and exits at once, without the interpreter's
teardown (atexit handlers, a user step's too, do not run), which crashed the process
(SIGSEGV) when the signal came while XLA was compiling in its own threads."""

import os
import sys

from marin_rules.job.main import main

code = main()
if code >= 128:
    sys.stdout.flush()
    sys.stderr.flush()
    if "jax" in sys.modules:
        import jax

        if jax.distributed.is_initialized():
            jax.distributed.shutdown()
    os._exit(code)
sys.exit(code)
