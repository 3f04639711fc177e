# Near-duplicate removal: a corpus -> the same corpus less its near-duplicates. See marin_rules/data/dedup.py.


rule dedup:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("dedup"),
    run:
        M.run_job(wildcards, rule, jobid)
