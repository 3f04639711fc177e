# User steps `pkg.module:function`, each called as function(ctx). `--forcerun custom`
# reruns all of them. A user step whose runtime names a `tpu` goes to a pod with --profile tpu.


rule custom:
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
        tpu=M.tpu,
        tpu_zone=M.tpu_zone,
    wildcard_constraints:
        artifact=M.constraint("custom"),
    shell:
        marin.JOB_SHELL
