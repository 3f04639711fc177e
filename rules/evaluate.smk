# Evaluation with lm-eval (the `marin` model, local held-out tasks). See marin_rules/eval/.


rule evaluate:
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
        artifact=M.constraint("evaluate"),
    threads: 2
    shell:
        marin.JOB_SHELL
