"""cohort.distributed."""
