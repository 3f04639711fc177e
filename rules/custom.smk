# User steps `pkg.module:function`, each called as function(ctx). `--forcerun custom`
# reruns all of them.


rule custom:
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    resources:
        # under the `tpu` executor: a TPU pod of the artifact's runtime.tpu (in runtime.zone), else
        # none (runs on the submitting host)
        tpu=lambda wildcards: M.experiment.by_path[wildcards.artifact].runtime.get("tpu") or "",
        tpu_zone=lambda wildcards: M.experiment.by_path[wildcards.artifact].runtime.get("zone") or "",
    wildcard_constraints:
        artifact=M.constraint("custom"),
    run:
        M.run_job(wildcards, rule, jobid)
