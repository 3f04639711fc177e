# Near-duplicate removal: a corpus -> the same corpus less its near-duplicates. See marin_rules/data/dedup.py.


rule dedup:
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
        artifact=M.constraint("dedup"),
    shell:
        marin.JOB_SHELL
