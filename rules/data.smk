# Data steps: raw text -> tokenizer -> token shards. See marin_rules/data/.


rule download:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        update(M.record_pattern()),
    log:
        M.log_pattern(),
    params:
        **M.job_params(),
    resources:
        marin_attempt=M.attempt_resource,
    wildcard_constraints:
        artifact=M.constraint("download"),
    shell:
        marin.JOB_SHELL


rule train_tokenizer:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        update(M.record_pattern()),
    log:
        M.log_pattern(),
    params:
        **M.job_params(),
    resources:
        marin_attempt=M.attempt_resource,
    wildcard_constraints:
        artifact=M.constraint("train_tokenizer"),
    shell:
        marin.JOB_SHELL


# One job per shard of the artifact's runtime.shards (default 1): these go to whatever
# executor runs the workflow; the `tokenize` job then gathers them and writes the record.
rule tokenize_shard:
    input:
        unpack(M.inputs),
    output:
        update(M.shard_pattern()),
    log:
        M.shard_log_pattern(),
    params:
        **M.job_params(),
    resources:
        marin_attempt=M.attempt_resource,
    wildcard_constraints:
        artifact=M.constraint("tokenize"),
        shard=marin.SHARD_CONSTRAINT,
    threads: M.shard_threads
    shell:
        marin.SHARD_SHELL


rule tokenize:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        update(M.record_pattern()),
    log:
        M.log_pattern(),
    params:
        **M.job_params(),
    resources:
        marin_attempt=M.attempt_resource,
    wildcard_constraints:
        artifact=M.constraint("tokenize"),
    shell:
        marin.JOB_SHELL
