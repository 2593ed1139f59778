"""cohort.data."""
