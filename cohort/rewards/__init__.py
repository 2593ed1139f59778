"""cohort.rewards."""
