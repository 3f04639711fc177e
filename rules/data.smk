# Data steps: raw text -> tokenizer -> token shards. See marin_rules/data/.


rule download:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("download"),
    run:
        M.run_job(wildcards, rule, jobid)


rule train_tokenizer:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("train_tokenizer"),
    run:
        M.run_job(wildcards, rule, jobid)


rule tokenize:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("tokenize"),
    threads: 2
    run:
        M.run_job(wildcards, rule, jobid)
