"""Builders the training tests share: the doubling dataset they learn on and the overrides of a tiny-model run.

Import them as `from tests.builders import ...` (pytest runs from the repository root). Fixtures stay in conftest.py;
these are plain functions, so a test passes its own sizes and reward in the call and a reader sees them there.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_doubling(path: Path, n: int, *, answers: bool = True) -> Path:
    """`n` JSONL rows `{"prompt": "a+a=", "answer": "2a"}` for a = 0..n-1 (no answer column when `answers` is False:
    a test's own reward function scores the completions); returns `path`."""
    rows = ({"prompt": f"{a}+{a}=", **({"answer": str(2 * a)} if answers else {})} for a in range(n))
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tiny_run(model_dir, data, run_dir, *extra: str) -> list[str]:
    """The dotted overrides a tiny-model training test starts from: the model, the data (prompts of at most 16 tokens),
    G = 4 completions per prompt, the run directory, no progress bar, metrics to JSONL only; then `extra`, where a
    later override of the same field wins."""
    return [f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "rollout.num_generations=4",
            f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]", *extra]


def stop_early(model_dir: Path, scaffold_messages: list[dict]) -> Path:
    """Declare half of the vocabulary outside the chat template's own tokens (those that render `scaffold_messages`
    with a generation prompt, <|im_end|> and the pad) stop tokens in generation_config.json, so a random model's turns
    end after a few tokens and multi-turn rollouts happen without a trained model; returns `model_dir`."""
    from cohort.models.pretrained import load_tokenizer

    tok = load_tokenizer(model_dir)
    scaffold = tok.apply_chat_template(scaffold_messages, tokenize=False, add_generation_prompt=True)
    used = set(tok(scaffold, add_special_tokens=False)["input_ids"])
    im_end, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    free = [i for i in range(len(tok)) if i not in used and i not in (im_end, pad)]
    config = json.loads((model_dir / "generation_config.json").read_text())
    config["eos_token_id"] = [im_end, pad] + free[::2]
    (model_dir / "generation_config.json").write_text(json.dumps(config))
    return model_dir
