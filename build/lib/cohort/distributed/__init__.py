"""cohort.distributed: process groups, FSDP sharding, rank 0's engine and rewards; never the trainer (cohort.launch runs it)."""
