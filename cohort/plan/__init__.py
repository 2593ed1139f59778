"""A run's plan, read from its config before anything loads, and every check of a config with its fix.

- batch.py: the batch arithmetic and the run's mode (`batch_plan` -> `BatchPlan`); run_mode.py: the two facts of a
  config that decide which scheduler rules combine;
- memory.py: the checkpoint's facts from its headers, the training process's memory, one GPU's split with vLLM;
- printout.py: what `cohort plan` prints;
- validate.py: `validate_config`, the one entry point that runs every check (its own, and loss_checks.py's,
  pipeline_checks.py's, teacher_checks.py's and the checks each package keeps beside what it checks: data, models,
  rewards, tools, agents) and returns a `RunPlan` (run_plan.py: the resolved config, the `BatchPlan` and what was
  read to check it, which the trainer's setup reuses).

This package's __init__ imports nothing, so `cohort plan`'s batch arithmetic (batch.py) loads without torch; the
checks (validate.py) read the data, the tokenizer and the weights' headers.
"""
