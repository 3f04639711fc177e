# User steps `pkg.module:function`, each called as function(ctx). `--forcerun custom`
# reruns all of them.


rule custom:
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("custom"),
    run:
        M.run_job(wildcards, rule, jobid)
