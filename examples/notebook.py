"""Train from Python, as in a notebook: the embedded tiny model on the built-in arith task, with a lambda as the reward.

    python examples/notebook.py

`cohort.train` takes what `cohort train` takes (a dict, a YAML path or a CohortConfig, and dotted
overrides) plus Python objects: reward functions with TRL's contract
`fn(prompts, completions, **columns) -> list[float | None]` (`def` or `async def`, mixed freely with
built-in names such as "think_format"), and datasets as a `datasets.Dataset`, a list of dicts or file
paths. With no config and no data it runs the embedded demo (`tiny:arith`, task `arith`, whose rows
carry an `answer` column); the lambda below replaces the task's own reward.
"""

import json

import cohort


def main() -> None:
    summary = cohort.train(
        overrides=["train.max_steps=20", "run.output_dir=runs/notebook"],
        reward_funcs=[lambda prompts, completions, answer, **columns: [float(c.strip() == a) for c, a in zip(completions, answer)]],
    )
    print(json.dumps({k: v for k, v in summary.items() if k != "final_metrics"}, indent=2))  # final_metrics: the last step's
    print(f"held-out accuracy {summary['eval/accuracy_before']:.1%} -> {summary['eval/accuracy_after']:.1%}; "
          f"the trained model is in {summary['run_dir']}/final")


if __name__ == "__main__":  # vLLM may start worker processes that re-import this file
    main()
