"""cohort.algorithms."""
