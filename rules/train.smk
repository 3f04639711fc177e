# Training: JAX mixture-of-experts language model. See marin_rules/train/.
# resources: tpu = the artifact's runtime.tpu or "default": with `--profile tpu` the tpu
# executor sends these jobs to TPU pods; everything else runs on this host.


rule train:
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
        artifact=M.constraint("train"),
    threads: 2
    shell:
        marin.JOB_SHELL
