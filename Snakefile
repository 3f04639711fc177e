# marin-rules: every step from raw text to evaluated model is a versioned artifact
# {prefix}/{name}/{version}, built once, recorded in .artifact.json (the declared output).
#
#   snakemake -n                                    plan (drift warnings on stderr)
#   snakemake                                       build the default experiment
#   snakemake --configfile experiments/X.yaml       another experiment (never merged)
#   snakemake --config target=checkpoints/nano-moe@v1   one artifact and what it needs
#   snakemake --forcerun train                      rebuild every training job and its consumers
#
# Each job runs `python -m marin_rules.job` (marin.JOB_SHELL, every value quoted by `:q`);
# its output goes to the rule's log, shown by --show-failed-logs.
import marin_rules.workflow as marin

M = marin.begin(workflow, config)


onstart:
    # one onstart: a second one would replace this one. Snakemake has locked the working
    # directory: forced builds are set aside now, not while planning (Session.start).
    marin.on_start()


onsuccess:
    marin.on_success()


rule all:
    localrule: True
    input:
        M.targets(),
        marin.report_inputs(),  # only under `snakemake --report`: see rules/report.smk


include: "rules/adopt.smk"
include: "rules/data.smk"
include: "rules/dedup.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/export.smk"
include: "rules/scaling.smk"
include: "rules/custom.smk"
include: "rules/report.smk"

# Our rules' names as Snakemake registered them (prefixed when used as a module).
M.name_rules(rules)
