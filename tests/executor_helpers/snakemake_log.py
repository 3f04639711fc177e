"""Reading what the submitting `snakemake` printed, for the tpu executor's tests."""

from __future__ import annotations

import re


def outer_jobid(log: str, artifact_path: str) -> int:
    """The job id the submitting run gave the job of `artifact_path` (`raw/a/v1`): the
    `jobid:` of the job block Snakemake printed with `wildcards: artifact=<path>`."""
    found = re.findall(
        r"^    jobid: (\d+)\n(?:    [^\n]*\n)*?    wildcards: artifact=" + re.escape(artifact_path) + r"\n", log, re.M
    )
    assert len(found) == 1, f"no single job of {artifact_path} in:\n{log[-4000:]}"
    return int(found[0])
