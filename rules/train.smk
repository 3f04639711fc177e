# Training: JAX mixture-of-experts language model. See marin_rules/train/.
# With `--profile tpu` these jobs go to TPU pods; everything else runs locally.


rule train:
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    resources:
        # under the `tpu` executor: a TPU pod of the artifact's runtime.tpu (in runtime.zone), else
        # the executor's --tpu-type
        tpu=lambda wildcards: M.experiment.by_path[wildcards.artifact].runtime.get("tpu") or "default",
        tpu_zone=lambda wildcards: M.experiment.by_path[wildcards.artifact].runtime.get("zone") or "",
    wildcard_constraints:
        artifact=M.constraint("train"),
    threads: 2
    run:
        M.run_job(wildcards, rule, jobid)
