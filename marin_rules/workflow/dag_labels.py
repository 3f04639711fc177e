"""`name@version` labels in `snakemake --dag`: the one patch of Snakemake internals.

Model: Snakemake labels each job of `--dag` with its rule and the wildcards it adds
(`artifact: tokenized/shakespeare/v1`), through the private method
`DAG.new_wildcards(job)`, and offers no public hook to label a job otherwise. In the
main process this module wraps that method so a job whose `artifact` wildcard names an
artifact of the experiment shows `artifact: tokenized/shakespeare@v1`. It was written
against Snakemake 9.27 and installs only there: under any other version (or if the
method is gone) it does nothing and the labels stay Snakemake's own `name/version`.
`tests/test_dag_labels.py` fails when the wrapped method changes. `marin dag` draws
the same picture without Snakemake or Graphviz.
"""

from __future__ import annotations

from typing import Callable

SNAKEMAKE_SERIES = "9.27."  # the version whose DAG.new_wildcards(job) -> set[(name, value)] this wraps


def supported(version: str) -> bool:
    return version.startswith(SNAKEMAKE_SERIES)


def install(key_of_path: Callable[[str], str | None]) -> bool:
    """Label `--dag` jobs `artifact: name@version` (`key_of_path("a/b/v1")` -> "a/b@v1",
    or None to keep Snakemake's label). Returns whether the labels were installed."""
    import snakemake
    from snakemake.dag import DAG

    original = getattr(DAG, "new_wildcards", None)
    if original is None or not supported(snakemake.__version__):
        return False
    original = getattr(original, "__wrapped__", original)

    def new_wildcards(self, job):
        wildcards = original(self, job)
        artifact = dict(job.wildcards.items()).get("artifact") if job.wildcards else None
        key = key_of_path(artifact) if artifact is not None else None
        if key is None:
            return wildcards
        return {(name, key if name == "artifact" else value) for name, value in wildcards} or {("artifact", key)}

    new_wildcards.__wrapped__ = original
    DAG.new_wildcards = new_wildcards
    return True
