"""cohort.models."""
