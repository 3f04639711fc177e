# Export to other ecosystems' layouts (a Hugging Face folder). See marin_rules/export/.


rule export_hf:
    localrule: True
    input:
        unpack(M.inputs),
    output:
        M.record_pattern(),
    wildcard_constraints:
        artifact=M.constraint("export_hf"),
    run:
        M.run_job(wildcards, rule, jobid)
