# marin-rules: every step from raw text to evaluated model is a versioned artifact
# {prefix}/{name}/{version}, built once, recorded in .artifact.json (the declared output).
#
#   snakemake -n                                    plan (drift warnings on stderr)
#   snakemake                                       build the default experiment
#   snakemake --configfile experiments/X.yaml       another experiment (never merged)
#   snakemake --config target=checkpoints/nano-moe@v1   one artifact and what it needs
#   snakemake --forcerun train                      rebuild every training job and its consumers
from marin_rules import snakemake as marin
from marin_rules.cluster.pod import refuse_unreachable_prefix

M = marin.begin(workflow, config)


onstart:
    refuse_unreachable_prefix(workflow.executor_plugin.name, workflow.executor_settings, M.prefix)


rule all:
    default_target: True
    localrule: True
    input:
        M.targets(),


include: "rules/data.smk"
include: "rules/dedup.smk"
include: "rules/train.smk"
include: "rules/evaluate.smk"
include: "rules/export.smk"
include: "rules/scaling.smk"
include: "rules/custom.smk"
