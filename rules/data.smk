# Data steps: raw text -> tokenizer -> token shards. See marin_rules/data/.


rule download:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    log:
        M.log_pattern(),
    params:
        **M.job_params(),
    wildcard_constraints:
        artifact=M.constraint("download"),
    shell:
        marin.JOB_SHELL


rule train_tokenizer:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    log:
        M.log_pattern(),
    params:
        **M.job_params(),
    wildcard_constraints:
        artifact=M.constraint("train_tokenizer"),
    shell:
        marin.JOB_SHELL


rule tokenize:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    log:
        M.log_pattern(),
    params:
        **M.job_params(),
    wildcard_constraints:
        artifact=M.constraint("tokenize"),
    threads: 2
    shell:
        marin.JOB_SHELL
