# Export to other ecosystems' layouts (a Hugging Face folder). See marin_rules/export/.


rule export_hf:
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
        artifact=M.constraint("export_hf"),
    shell:
        marin.JOB_SHELL
