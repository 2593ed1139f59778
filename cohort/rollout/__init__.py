"""cohort.rollout."""
