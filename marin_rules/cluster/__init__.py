"""Pod backends: running one job's command on every host of a TPU slice (or N local processes)."""
