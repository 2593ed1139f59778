"""Held-out breakdown of a reasoning-gym model against its answer prior (issue 54, part 3's measurements).

    python bench/answer_prior.py CONFIG.yaml [--model RUN_DIR/final] [--label NAME] [--out bench/answer_prior.json]

Scores model.path (or --model: a run's final/ or checkpoints/step-N/model) greedily on the config's held-out rows with
`cohort eval`'s own function (cohort/trainer/evaluate.py: accuracy, the best constant answer's, the accuracy beyond
the two most common answers, the model's answers) and adds two readings of the same answers, for the levers' write-up:
- `accuracy_by_reference`: the share of the items with each of the six most common references that the model answered
  with that reference (the scorer's reading of both sides, cohort/rewards/answer_reading.py);
- `chance_accuracy`: what the model's answer distribution scores if its answers ignored the question, the sum over
  answers a of (share of items it answered a) x (share of items whose reference is a). Accuracy above it is the
  question read; a balanced guess beats the constant answer beyond the common answers without reading anything.
With --unseen-by OTHER.yaml the record also has `unseen`: the same fields over the held-out items whose question is in
none of OTHER's rows (train or held-out), for a model trained on OTHER first (a curriculum's earlier stage), whose
rows may hold some of this config's held-out questions; an item counts as right when its read answer equals its read
reference (the full score of a task with one right answer, such as gcd).
With --out the record is stored under its label in that JSON file (other labels kept).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from cohort.config.resolve import load_config
from cohort.plan.run_environment import run_data
from cohort.plan.run_rewards import reward_specs
from cohort.plan.validate import validate_config
from cohort.rewards import RewardSet
from cohort.rewards.answer_reading import answer_reader, read_pairs
from cohort.trainer.evaluate import answer_breakdown, evaluate_model


def readings(answers: list, references: list) -> dict:
    """accuracy_by_reference and chance_accuracy (module docstring) from the read answers and references."""
    refs = Counter(r for r in references if r is not None)
    said = Counter(a for a in answers if a is not None)
    n = len(references)
    by_ref = {ref: sum(1 for a, r in zip(answers, references) if r == ref and a == ref) / count
              for ref, count in refs.most_common(6)}
    return {"accuracy_by_reference": by_ref, "chance_accuracy": sum(said[a] * refs[a] for a in said) / (n * n)}


def questions(rows) -> list[str]:
    """Each row's prompt as one text (its messages' contents), what two tasks' rows are compared by."""
    return ["\n".join(m["content"] for m in p) if isinstance(p := r["prompt"], list) else str(p) for r in rows]


def unseen_items(rows: list, seen: set[str], answers: list, references: list) -> tuple[list[int], np.ndarray]:
    """(indices of the rows whose question is not in `seen`, whether each one's read answer equals its reference)."""
    keep = [i for i, q in enumerate(questions(rows)) if q not in seen]
    return keep, np.array([answers[i] is not None and answers[i] == references[i] for i in keep], dtype=bool)


def unseen_breakdown(other: str, rewards, rows: list, texts: list, columns: dict, answers: list, references: list) -> dict:
    """The breakdown (cohort eval's fields) over the held-out items whose question none of `other`'s rows ask."""
    other_plan = validate_config(load_config(other, []))
    train, evals, _ = run_data(other_plan.config, other_plan.environment)
    seen = set(questions(train.rows) + (questions(evals.rows) if evals is not None else []))
    keep, correct = unseen_items(rows, seen, answers, references)
    breakdown = answer_breakdown(rewards, [texts[i] for i in keep], {c: [v[i] for i in keep] for c, v in columns.items()},
                                 correct)
    return {"seen_by": other, "n": len(keep), "accuracy": float(correct.mean()) if keep else None, **breakdown}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--model")
    ap.add_argument("--label", default="base")
    ap.add_argument("--out")
    ap.add_argument("--unseen-by", help="another config: also break down the held-out items none of its rows ask")
    args = ap.parse_args()
    overrides = [f"model.path={args.model}"] if args.model else []
    plan = validate_config(load_config(args.config, overrides))  # (model.dtype auto settled, as cohort eval does)
    cfg = plan.config
    start = time.perf_counter()
    result = evaluate_model(cfg, num_samples=0, pass_k=1, temperature=1.0, environment=plan.environment)
    _, evals, task_specs = run_data(cfg, plan.environment)
    rewards = RewardSet.from_specs(reward_specs(cfg, plan.environment, task_specs))  # (the run's rewards, as eval's)
    texts = result.pop("completions")
    columns = {c: [r.get(c) for r in evals.rows] for c in evals.columns}
    answers, references = read_pairs(answer_reader(rewards), texts, columns)
    record = {"label": args.label, "config": args.config, "model": cfg.model.path, "eval_s": time.perf_counter() - start,
              **result, **readings(answers, references)}
    if args.unseen_by:
        record["unseen"] = unseen_breakdown(args.unseen_by, rewards, evals.rows, texts, columns, answers, references)
    print(json.dumps(record, indent=1))
    if args.out:
        path = Path(args.out)
        records = json.loads(path.read_text()) if path.exists() else {}
        records[args.label] = record
        path.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
