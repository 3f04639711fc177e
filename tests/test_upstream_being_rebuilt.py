"""A consumer's job that finds an upstream incomplete or unbuilt while another run holds
that upstream's live lease is told to wait for that run, not to force a rebuild.

On gs:// a forced rebuild moves the old build aside object by object, its record last:
a consumer starting meanwhile saw the record beside missing files and was told to run
`snakemake -f` on a healthy model, racing the rebuild under way (an outside report).
The lease is real (`artifacts.lease.acquire`, held by this process); files are written
as a finished step leaves them (test_inspect_status.build)."""

from __future__ import annotations

import os

import pytest

from marin_rules.artifacts.errors import MarinError
from marin_rules.artifacts.identity import artifact_location
from marin_rules.artifacts.lease import acquire
from marin_rules.experiment import load_experiment
from marin_rules.job.context import check_upstreams
from test_inspect_status import build, experiment_file  # noqa: F401 (fixture)


@pytest.mark.parametrize("damage", ["data file moved", "record moved"])
def test_an_upstream_being_rebuilt_by_another_run_says_wait_for_it_not_force_it(experiment_file, tmp_path, damage):  # noqa: F811
    prefix = str(tmp_path / "artifacts")
    experiment = load_experiment(experiment_file)
    build(prefix, experiment, "raw/s@v1")
    location = artifact_location(prefix, experiment["raw/s@v1"].id)
    os.remove(os.path.join(location, "data.bin" if damage == "data file moved" else ".artifact.json"))
    consumer = experiment["tokenizers/bpe@v1"]
    with pytest.raises(MarinError) as alone:  # no run holds it: the damage, and the rebuild command
        check_upstreams(consumer, experiment, prefix, {})
    assert "rebuild it with: snakemake -f" in str(alone.value)
    lease = acquire(location, is_done=lambda: False, wait=False)  # another run's forced rebuild, under way
    try:
        with pytest.raises(MarinError) as waiting:
            check_upstreams(consumer, experiment, prefix, {})
    finally:
        lease.release()
    message = str(waiting.value)
    assert message.startswith("tokenizers/bpe@v1: upstream raw/s@v1")
    assert "; another run is building it now (lease held by " in message
    assert message.endswith("): run snakemake again once that run has finished, and this step reads its build")
    assert "snakemake -f" not in message
