"""The artifact core: identity, canonical JSON, fingerprints, records, drift, storage.

Model: an artifact is `name@version`, stored at `{prefix}/{name}/{version}`, built
once, and described by a success record `.artifact.json` written last. This package
imports only the standard library, `xxhash`, `fsspec` and `yaml` (and, for leases on
gs://, the google-cloud-storage client that gcsfs brings); it knows no JAX and no Snakemake.
"""
