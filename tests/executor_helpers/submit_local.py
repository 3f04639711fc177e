"""A batch system's submit command on this host, for snakemake-executor-plugin-cluster-generic.

`python submit_local.py JOBSCRIPT` starts the job script as its own process in a new
session (as a batch scheduler would start it, sharing nothing with Snakemake but the
disk), its output to `cluster-logs/<script name>.out` in the working folder, prints
the process id as the job id and returns at once. The plugin then waits for the
`jobfinished`/`jobfailed` marker the job script writes.
"""

from __future__ import annotations

import os
import subprocess
import sys

jobscript = sys.argv[-1]
os.makedirs("cluster-logs", exist_ok=True)
with open(os.path.join("cluster-logs", os.path.basename(jobscript) + ".out"), "w") as out:
    job = subprocess.Popen(
        ["bash", jobscript], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
print(job.pid)
