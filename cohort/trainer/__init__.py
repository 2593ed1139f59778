"""cohort.trainer."""
