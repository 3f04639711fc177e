# Training: JAX mixture-of-experts language model. See marin_rules/train/.
# With `--profile tpu` these jobs go to TPU pods; everything else runs locally.


rule train:
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("train"),
    threads: 2
    run:
        M.run_job(wildcards, rule, jobid)
