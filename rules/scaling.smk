# Scaling suite: fit a law on a sweep of train runs, check its prediction. See marin_rules/scaling/.


rule scaling_fit:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("scaling_fit"),
    run:
        M.run_job(wildcards, rule, jobid)


rule scaling_check:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("scaling_check"),
    run:
        M.run_job(wildcards, rule, jobid)
