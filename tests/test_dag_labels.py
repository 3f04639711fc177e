"""`snakemake --dag` labels jobs `artifact: name@version` (marin_rules/workflow/dag_labels.py).

The labels wrap a private Snakemake method: these tests fail when a Snakemake upgrade
changes it, so the version check in dag_labels.py is updated on purpose."""

from __future__ import annotations

import inspect
import snakemake

from marin_rules.workflow import dag_labels


def test_the_wrapped_method_is_the_one_the_labels_were_written_for():
    import snakemake.api  # noqa: F401 - snakemake.dag imports cleanly after the API
    from snakemake.dag import DAG

    assert dag_labels.supported(snakemake.__version__), snakemake.__version__
    method = getattr(DAG.new_wildcards, "__wrapped__", DAG.new_wildcards)
    assert list(inspect.signature(method).parameters) == ["self", "job"]
    assert "return new_wildcards" in inspect.getsource(method)
