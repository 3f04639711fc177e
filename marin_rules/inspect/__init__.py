"""Looking at artifacts without running anything: status with reasons, the priced plan,
diffs between two builds, an artifact's history, and a picture of the experiment.

Every module here reads records from a prefix (local or gs://) through
`marin_rules.inspect.reading` and writes nothing to it; none imports JAX or Snakemake.
"""
