# Adopted data: an entry's `adopt: {source, kind}` (marin_rules/adopt.py). The job checks
# the source's layout and writes the record (the source, its listing, a digest); it
# copies nothing unless `copy: true`.


rule adopt:
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
        artifact=M.constraint("adopt"),
    shell:
        marin.JOB_SHELL
