# Near-duplicate removal: a corpus -> the same corpus less its near-duplicates. See marin_rules/data/dedup.py.
# One signing job per shard of the artifact's runtime.shards (default 1), on whatever
# executor runs the workflow; the `dedup` job then clusters and writes the corpus.


rule dedup_shard:
    input:
        unpack(M.inputs),
    output:
        update(M.shard_pattern()),
    log:
        M.shard_log_pattern(),
    params:
        **M.job_params(),
    resources:
        marin_attempt=M.attempt_resource,
    wildcard_constraints:
        artifact=M.constraint("dedup"),
        shard=marin.SHARD_CONSTRAINT,
    threads: M.shard_threads
    shell:
        marin.SHARD_SHELL


rule dedup:
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
        artifact=M.constraint("dedup"),
    shell:
        marin.JOB_SHELL
