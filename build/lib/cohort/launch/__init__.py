"""cohort.launch: what runs a Trainer somewhere else (torchrun children, Ray actors); above the trainer, below the CLI and API."""
