"""Training precision (cohort/models/precision.py): float32 master weights under bf16 mixed, what pure bf16 loses,
what is saved where, what validation refuses and what `cohort plan` counts.

All runs use the transformers engine on a random tiny Qwen2 (fast, no vLLM start); the
bf16 runs through vLLM and the weight-sync check are in test_sync_check.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.models.precision import resolve_precision
from cohort.plan.memory import memory_estimate, model_facts
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training
from cohort.plan.validate import validate_config
from tests.builders import write_doubling


@pytest.fixture
def setup_dir(tmp_path, monkeypatch):
    # reward: the share of "7" plus 0.1 per character, so completions of one group differ and every weight gets a gradient
    (tmp_path / "user_rewards_precision.py").write_text(
        "def score(prompts, completions, **kw):\n    return [c.count('7') / max(1, len(c)) + 0.1 * len(c) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "train.jsonl"
    write_doubling(data, 32, answers=False)
    return tmp_path, data


def _config(tmp_path, data, model_dir, *extra):
    return load_config(None, [
        f"model.path={model_dir}", f"data.train_files=[{data}]", "engine.name=hf", "rollout.num_generations=4",
        "rollout.max_completion_length=6", "train.prompts_per_step=4", "train.micro_batch_size=16", "train.max_steps=2",
        "rewards=[{name: user_rewards_precision.score}]", "run.progress=false", "run.loggers=[jsonl]", *extra])


@pytest.mark.slow
def test_mixed_precision_updates_float32_masters_as_float32_does_where_pure_bf16_rounds_updates_away(setup_dir, tiny_model_dir):
    tmp_path, data = setup_dir

    def trainer(name, *extra):
        return Trainer(_config(tmp_path, data, tiny_model_dir, "train.learning_rate=1e-6", f"run.output_dir={tmp_path / name}",
                       *extra))

    reference = trainer("fp32")
    batch = reference.generate_batch()  # one batch, so the three updates differ only by precision
    deltas, changed = {}, {}
    try:
        for name, extra in (("fp32", ()), ("mixed", ("model.dtype=bfloat16",)), ("pure", ("model.dtype=bfloat16", "train.precision=pure"))):
            t = trainer(name + "-run", *extra)
            before = {n: p.detach().float().clone() for n, p in t.parts.policy.named_parameters()}
            t.update(batch, list(range(len(batch))))
            deltas[name] = torch.cat([(p.detach().float() - before[n]).flatten() for n, p in t.parts.policy.named_parameters()])
            changed[name] = float((deltas[name] != 0).float().mean())
            assert t.parts.policy.dtype == (torch.bfloat16 if name == "pure" else torch.float32)
            t.close()
    finally:
        reference.close()
    # AdamW's first step moves every weight with a non-zero gradient by about lr (m̂ / √v̂ = g / |g|): float32 changes all
    # of them; mixed keeps float32 masters, so it does too (measured 1.0000 and 1.0000) ...
    assert changed["fp32"] > 0.99 and changed["mixed"] == pytest.approx(changed["fp32"], abs=1e-3)
    # ... and by the same amount: 98.3% of the mixed deltas are within 1e-7 of float32's (the rest are near-zero gradients
    # whose sign bf16 flipped: a delta of +lr instead of -lr)
    assert float(((deltas["mixed"] - deltas["fp32"]).abs() <= 1e-7).float().mean()) > 0.95
    # pure bf16: a weight near 0.2 has a bf16 spacing of ~1e-3, so an update of 1e-6 rounds away (measured: 0.35% changed)
    assert changed["pure"] < 0.05


def test_final_model_is_saved_in_bf16_and_checkpoints_keep_float32_masters(setup_dir, tiny_model_dir):
    tmp_path, data = setup_dir
    run_dir = tmp_path / "run"
    trainer = Trainer(_config(tmp_path, data, tiny_model_dir, "model.dtype=bfloat16", "train.learning_rate=1e-3",
                              "run.save_every=2", f"run.output_dir={run_dir}"))
    try:
        run_training(trainer)
        master = {n: p.detach().clone() for n, p in trainer.parts.policy.named_parameters()}
    finally:
        trainer.close()
    final = run_dir / "final"
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(str(final / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert {f.get_tensor(k).dtype for k in keys} == {torch.bfloat16}
        assert "lm_head.weight" not in keys  # the tied head is saved once, as the embedding
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), master["model.embed_tokens.weight"].to(torch.bfloat16))
    [checkpoint] = sorted((run_dir / "checkpoints").iterdir())
    with safe_open(str(checkpoint / "model" / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("model.norm.weight"), master["model.norm.weight"])  # float32, bit for bit
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(final)).dtype == torch.bfloat16  # dtype "auto" reads config.json


def test_float16_mixed_is_refused_with_the_fix_and_pure_is_allowed(tiny_model_dir, setup_dir):
    tmp_path, data = setup_dir
    with pytest.raises(ConfigError, match="float16 mixed precision needs loss scaling.*use model.dtype=bfloat16"):
        validate_config(_config(tmp_path, data, tiny_model_dir, "model.dtype=float16"))
    validate_config(_config(tmp_path, data, tiny_model_dir, "model.dtype=float16", "train.precision=pure"))
    assert not resolve_precision("float32", "mixed").mixed and not resolve_precision("bfloat16", "pure").mixed


def test_plan_counts_float32_masters_under_mixed_precision(setup_dir, tiny_model_dir):
    tmp_path, data = setup_dir
    facts = model_facts(str(tiny_model_dir))
    p = facts.num_params

    def rows(*extra):
        cfg = _config(tmp_path, data, tiny_model_dir, *extra)
        return {name: size for name, size, _ in memory_estimate(cfg, validate_config(cfg).batch, facts)}

    mixed, pure = rows("model.dtype=bfloat16"), rows("model.dtype=bfloat16", "train.precision=pure")
    # mixed: weights, gradients 4 B each, AdamW 8 B, plus a 2 B autocast copy; pure: 2 + 2 + 4 B, no copy
    assert (mixed["weights"], mixed["gradients"], mixed["AdamW moments"], mixed["autocast weight copies"]) == (4 * p, 4 * p, 8 * p, 2 * p)
    assert (pure["weights"], pure["AdamW moments"]) == (2 * p, 4 * p) and "autocast weight copies" not in pure
