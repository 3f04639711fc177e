# Snakemake's report: pictures and tables of every built artifact, browsable by category.
#   snakemake --report report.html                  write the report (or report.zip): gathers first
#   snakemake marin_report                          only gather them into marin-report/ (runs no step)
# Snakemake embeds only local files a job declares with report(...): artifacts may live
# on gs://, so this rule copies what a reader wants into one local folder (see
# marin_rules/inspect/gather.py). Only built artifacts are shown; nothing is built for it.
report: "../report/workflow.rst"


import os as _os
import sys as _sys
from marin_rules.inspect.gather import built_keys as _built_keys, gathered_stamp as _gathered_stamp


def _reported(wildcards=None):
    return _built_keys(M.experiment, M.recorded)


def _report_inputs(wildcards=None):
    """The built artifacts' records, and a stamp of what is gathered (experiment, prefix,
    built keys): rewritten when that changes, so marin-report/ is gathered again for
    another experiment or prefix, not only for a newer record."""
    built = _reported()
    stamp = _gathered_stamp(".snakemake/marin-report-inputs.json", M.experiment, M.prefix, built)
    return [M.record_path(k) for k in built] + [stamp]


rule marin_report:
    localrule: True
    input:
        _report_inputs,
    output:
        report(
            directory("marin-report"),
            patterns=["{category,[^/]+}/{artifact}/{file,[^/]+\\.(?:png|svg|html)}"],
            caption="../report/artifact.rst",
            category="{category}",
            subcategory="{artifact}",
            labels={"artifact": "{artifact}", "file": "{file}"},
        ),
    params:
        python=_sys.executable,
        experiment=_os.path.abspath(M.experiment.path),
        prefix=M.prefix,
        built=_reported,
    shell:
        "{params.python:q} -m marin_rules.inspect.gather --experiment {params.experiment:q}"
        " --prefix {params.prefix:q} --out {output:q} --built {params.built:q}"
