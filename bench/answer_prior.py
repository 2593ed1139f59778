"""Held-out breakdown of a reasoning-gym run against its answer prior (issue 54, part 3's measurements).

    python bench/answer_prior.py CONFIG.yaml [--model RUN_DIR/final] [--label NAME] [--out bench/answer_prior.json]

Scores model.path (or --model) greedily on the config's held-out rows with `cohort eval`'s own function and prints,
as JSON: accuracy, the best constant answer's accuracy, the accuracy on the items whose key is not among the two most
common keys ("beyond"), and the distribution of the model's answers (the reward's own answer extraction). With --out
the record is appended under its label. A thin script until the evaluation's own breakdown lands (branch eval54).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from cohort.config.resolve import load_config
from cohort.data.run_data import load_data
from cohort.plan.validate import validate_config
from cohort.rewards.reasoning_gym import ReasoningGymScore, extract
from cohort.trainer.evaluate import evaluate_model


def breakdown(keys: list[str], answers: list[str | None], correct: list[bool], top: int = 2) -> dict:
    """The numbers above from each item's key, the model's extracted answer and whether it scored 1.0."""
    n = len(keys)
    key_counts = Counter(keys)
    common = [k for k, _ in key_counts.most_common(top)]
    beyond = [i for i in range(n) if keys[i] not in common]
    return {"n": n, "accuracy": sum(correct) / n,
            "constant_answer": common[0], "constant_accuracy": key_counts[common[0]] / n,
            "common_keys": common, "beyond_n": len(beyond),
            "beyond_accuracy": sum(correct[i] for i in beyond) / len(beyond) if beyond else None,
            "key_distribution": dict(key_counts.most_common(8)),
            "answer_distribution": dict(Counter("(none)" if a is None else a for a in answers).most_common(8)),
            "accuracy_by_key": {k: sum(correct[i] for i in range(n) if keys[i] == k) / c for k, c in key_counts.most_common(6)}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--model")
    ap.add_argument("--label", default="base")
    ap.add_argument("--out")
    args = ap.parse_args()
    overrides = [f"model.path={args.model}"] if args.model else []
    cfg = validate_config(load_config(args.config, overrides)).config  # (model.dtype auto settled, as cohort eval does)
    _, evals, specs = load_data(cfg)
    start = time.perf_counter()
    result = evaluate_model(cfg)
    spec = {k: v for k, v in specs[0].items() if k not in ("name", "weight")}
    scorer = ReasoningGymScore(spec["task"], spec["config"], spec["seed"], spec["size"], spec["answer_format"])
    texts = result["completions"]
    scores = scorer(completions=texts, rg_index=[r["rg_index"] for r in evals.rows])
    record = {"label": args.label, "config": args.config, "model": cfg.model.path, "eval_s": time.perf_counter() - start,
              **breakdown([str(r["answer"]).strip() for r in evals.rows], [extract(t, spec["answer_format"]) for t in texts],
                          [s >= 1.0 for s in scores]),
              "cohort_eval_accuracy": result["accuracy"]}
    print(json.dumps(record, indent=1))
    if args.out:
        path = Path(args.out)
        records = json.loads(path.read_text()) if path.exists() else {}
        records[args.label] = record
        path.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
