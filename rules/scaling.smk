# Scaling suite: fit a law on a sweep of train runs, check its prediction. See marin_rules/scaling/.


rule scaling_fit:
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
        artifact=M.constraint("scaling_fit"),
    shell:
        marin.JOB_SHELL


rule scaling_check:
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
        artifact=M.constraint("scaling_check"),
    shell:
        marin.JOB_SHELL
