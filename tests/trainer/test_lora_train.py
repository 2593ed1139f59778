"""LoRA training end to end: it learns through vLLM, the base never moves, only the adapter is optimized, the reference
is the adapter disabled, resume is exact, and a push that leaves the engine on the base is caught.

The task is test_train_e2e's: the reward is the share of "7" in the completion; the random tiny model starts near 0.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from cohort.config.resolve import load_config  # noqa: E402
from cohort.models.lora import LoraPolicy  # noqa: E402
from cohort.trainer import checkpoint  # noqa: E402
from cohort.trainer.trainer import Trainer  # noqa: E402
from cohort.trainer.run import run_training  # noqa: E402
from cohort.trainer.lora_sync import adapter_effect  # noqa: E402
from cohort.trainer.sync_check import SyncCheckError  # noqa: E402
from tests.builders import tiny_run, write_doubling

REWARD_MODULE = textwrap.dedent('''
    def sevens(prompts, completions, **kwargs):
        return [c.count("7") / max(1, len(c)) for c in completions]
''')


@pytest.fixture
def user_setup(tmp_path, monkeypatch):
    (tmp_path / "lora_test_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lora_test_rewards", raising=False)
    data = tmp_path / "train.jsonl"
    write_doubling(data, 32)
    return tmp_path, data


def _overrides(model_dir, data, run_dir, engine, *extra):
    return tiny_run(model_dir, data, run_dir, f"engine.name={engine}", "rollout.max_completion_length=6",
                    "train.prompts_per_step=4", "train.micro_batch_size=8", "train.max_steps=30", "train.learning_rate=2e-2",
                    "lora.rank=8", "algorithm.beta=0.01", "rewards=[{name: 'lora_test_rewards:sevens'}]", *extra)


def _base_tensors(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


@pytest.mark.vllm
def test_lora_learns_through_vllm_and_leaves_the_base_bit_identical(user_setup, tiny_model_dir, vllm_engine):
    tmp_path, data = user_setup
    run_dir = tmp_path / "run-vllm"
    trainer = Trainer(load_config(None, _overrides(tiny_model_dir, data, run_dir, "vllm")), engine=vllm_engine)
    assert isinstance(trainer.parts.lora, LoraPolicy) and trainer.parts.ref_model is None  # no reference copy under LoRA
    in_optimizer = {id(p) for group in trainer.parts.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for _, p in trainer.parts.lora.trainable_parameters()}  # the adapter only
    assert all(".lora_A." in n or ".lora_B." in n for n, p in trainer.parts.policy.named_parameters() if id(p) in in_optimizer)
    base_before = _base_tensors(trainer.parts.policy)
    run_training(trainer)
    trainer.close()
    assert all(torch.equal(base_before[n], p) for n, p in trainer.parts.policy.named_parameters() if n in base_before)  # 29 syncs
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(l["reward"] for l in lines[:5]) / 5, sum(l["reward"] for l in lines[-5:]) / 5
    assert first < 0.15 and last > 0.6, (first, last)
    followed = [l["sync/adapter_followed"] for l in lines if "sync/adapter_followed" in l]
    assert followed and all(0.9 < f < 1.1 for f in followed)  # the engine holds base + adapter, not the base
    assert any(l.get("kl", 0) > 0 for l in lines)  # the adapter-disabled reference is used (beta = 0.01)
    assert trainer.sync.last_canary_gap < 1e-4
    # final/: the adapter alone, and a merged checkpoint that from_pretrained loads and that is not the base
    from transformers import AutoModelForCausalLM

    assert (run_dir / "final" / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(str(run_dir / "final"), local_files_only=True)
    start = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), local_files_only=True)
    gap = (merged.model.layers[0].mlp.down_proj.weight - start.model.layers[0].mlp.down_proj.weight).abs().max()
    assert gap > 1e-4
    assert torch.equal(merged.model.embed_tokens.weight, start.model.embed_tokens.weight)  # not targeted: unchanged


def test_adapter_effect_passes_a_fresh_engine_and_catches_one_left_on_the_base():
    base = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    trainer = base + torch.tensor([0.2, -0.1, 0.3, 0.1])  # the adapter moves the canaries by rms ~0.19
    ok = adapter_effect(trainer + 1e-6, trainer, base, floor_rms=1e-6)
    # followed = <e - b, t - b> / |t - b|^2 = 1 + 1e-6 * sum(t - b) / |t - b|^2 = 1 + 1e-6 * 0.5 / 0.15 ~ 1.0000033
    assert abs(ok["sync/adapter_followed"] - 1.0) < 1e-5
    with pytest.raises(SyncCheckError, match="shows 0% of the adapter's change"):
        adapter_effect(base.clone(), trainer, base, floor_rms=1e-6)  # the engine kept the base: followed = 0
    quiet = adapter_effect(base.clone(), base + 1e-7, base, floor_rms=1e-6)  # B = 0 at the start: nothing to judge
    assert "sync/adapter_followed" not in quiet


@pytest.mark.vllm
def test_a_sync_that_leaves_the_engine_on_the_base_is_caught(user_setup, tiny_model_dir, vllm_engine, monkeypatch):
    """A name mismatch that drops the adapter: merged weights replaced by the base's, as an engine skipping them would hold."""
    tmp_path, data = user_setup
    monkeypatch.setattr(LoraPolicy, "merged_weight", lambda self, name: self.layers[name].get_base_layer().weight.detach())
    trainer = Trainer(load_config(None, _overrides(tiny_model_dir, data, tmp_path / "stale", "vllm", "train.max_steps=10")),
                      engine=vllm_engine)
    with pytest.raises(Exception, match="weight sync check failed") as err:
        run_training(trainer)
    trainer.close()
    assert "SyncCheckError" in repr(err.value) or "sync check" in str(err.value)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.slow
def test_lora_resume_is_exact(user_setup, tiny_model_dir, dtype):
    """hf engine, beta > 0, LoRA dropout on, a checkpoint inside a generation batch: resuming at step 3 ends identical
    (bfloat16: train.precision=mixed with the base held in bf16, read again from model.path on resume)."""
    tmp_path, data = user_setup
    extra = (f"model.dtype={dtype}", "train.max_steps=6", "train.steps_per_generation=2", "train.prompts_per_step=2", "lora.dropout=0.1",
             "run.save_every=1", "run.keep_checkpoints=10", "run.log_completions_every=1", "run.num_completions_to_log=16")
    ref = tmp_path / "ref"
    trainer = Trainer(load_config(None, _overrides(tiny_model_dir, data, ref, "hf", *extra)))
    run_training(trainer)
    trainer.close()
    saved = checkpoint.list_checkpoints(ref)[2]  # step 3: inside the second generation batch
    assert json.loads((saved / "meta.json").read_text())["mid_generation"]
    weights = sorted(p.name for p in (saved / "model").iterdir() if p.suffix == ".safetensors" or "adapter" in p.name)
    assert weights == ["adapter_config.json", "adapter_model.safetensors"]  # the adapter only (+ tokenizer), no base weights
    moments = torch.load(saved / "state.pt", weights_only=True)["parts"]["optimizer"]["state"]
    assert len(moments) == 2 * 7 * 2  # AdamW state for the 28 adapter tensors only
    copy = tmp_path / "resumed"
    shutil.copytree(ref, copy)
    shutil.rmtree(copy / "final")
    resumed = Trainer(load_config(copy / "config.yaml", [f"run.output_dir={copy}"]))
    run_training(resumed, resume_from=saved)
    resumed.close()
    assert (ref / "completions.jsonl").read_text() == (copy / "completions.jsonl").read_text()
    a = load_file(str(ref / "final" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(copy / "final" / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-exact
    assert max(float(a[k].abs().max()) for k in a if "lora_B" in k) > 1e-3  # and the adapter did train (B starts at 0)


@pytest.mark.vllm
def test_lora_learns_with_a_local_server(user_setup, tiny_model_dir):
    """engine.mode=local_server: the merged weights travel over HTTP to a `cohort serve` child under the base names."""
    tmp_path, data = user_setup
    run_dir = tmp_path / "run-local-server"
    trainer = Trainer(load_config(None, _overrides(tiny_model_dir, data, run_dir, "vllm", "engine.mode=local_server")))
    try:
        run_training(trainer)
    finally:
        trainer.close()
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(l["reward"] for l in lines[:5]) / 5, sum(l["reward"] for l in lines[-5:]) / 5
    assert first < 0.15 and last > 0.6, (first, last)
    followed = [l["sync/adapter_followed"] for l in lines if "sync/adapter_followed" in l]
    assert followed and all(0.9 < f < 1.1 for f in followed)
    assert all(l.get("sync/bytes_sent", 0) > 0 for l in lines[:-1])  # a push after every step but the last


@pytest.mark.parametrize("precision", ["mixed", "pure"])
@pytest.mark.slow
def test_lora_in_bfloat16_trains_float32_adapters_and_leaves_the_base(user_setup, tiny_model_dir, precision):
    """model.dtype=bfloat16: the frozen base is held in bfloat16 under mixed and pure alike (no float32 masters for
    weights that never change: cohort.models.lora.base_dtype) and peft keeps the adapter in float32 either way, so
    only adapter tensors reach AdamW. Four steps on the transformers engine; the base is untouched and the adapter moved."""
    tmp_path, data = user_setup
    trainer = Trainer(load_config(None, _overrides(tiny_model_dir, data, tmp_path / precision, "hf", "train.max_steps=4",
                                                   "model.dtype=bfloat16", f"train.precision={precision}")))
    base_before = _base_tensors(trainer.parts.policy)
    assert {p.dtype for _, p in trainer.parts.lora.trainable_parameters()} == {torch.float32}
    # every matrix of the base in bf16 (mixed used to hold them as float32 masters); mixed keeps the norms in float32
    assert {t.dtype for t in base_before.values() if t.dim() == 2} == {torch.bfloat16}
    assert {t.dtype for t in base_before.values() if t.dim() < 2} == {torch.float32 if precision == "mixed" else torch.bfloat16}
    optimized = {id(p) for group in trainer.parts.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for _, p in trainer.parts.lora.trainable_parameters()}  # the adapter, nothing else
    run_training(trainer)
    assert all(p.grad is None for n, p in trainer.parts.policy.named_parameters() if n in base_before)  # no base gradients
    moments = trainer.parts.optimizer.state.values()
    assert len(moments) == 2 * 7 * 2 and {m["exp_avg"].dtype for m in moments} == {torch.float32}
    trainer.close()
    assert all(torch.equal(base_before[n], p) for n, p in trainer.parts.policy.named_parameters() if n in base_before)
    assert max(float(p.detach().abs().max()) for n, p in trainer.parts.lora.trainable_parameters() if "lora_B" in n) > 0
    config = json.loads((tmp_path / precision / "final" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"  # the merged final/ in model.dtype


@pytest.mark.vllm
def test_lora_in_bfloat16_mixed_syncs_a_bf16_base_through_a_local_server(user_setup, tiny_model_dir):
    """model.dtype=bfloat16 under mixed: a bf16 base, merged pushes to a bf16 vLLM child, and the sync check's float32
    sensitivity pass run by upcasting the base one module at a time (float32_weights). 12 honest syncs, no false
    alarm; the engine follows the adapter; the base stays bit-identical through every merge."""
    tmp_path, data = user_setup
    run_dir = tmp_path / "run-bf16"
    trainer = Trainer(load_config(None, _overrides(tiny_model_dir, data, run_dir, "vllm", "engine.mode=local_server",
                                                   "model.dtype=bfloat16", "train.max_steps=12")))
    base_before = _base_tensors(trainer.parts.policy)
    try:
        run_training(trainer)
    finally:
        trainer.close()
    assert {t.dtype for t in base_before.values() if t.dim() == 2} == {torch.bfloat16}
    assert all(torch.equal(base_before[n], p) for n, p in trainer.parts.policy.named_parameters() if n in base_before)
    # bf16 autocast vs float32 on the random tiny model: ~1e-2 nats per token (0 would mean no float32 pass happened)
    assert 1e-3 < trainer.sync.check.sensitivity < 0.1, trainer.sync.check.sensitivity
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(1 for l in lines if "sync/canary_gap_mean" in l) >= 10  # checked syncs, none failed
    followed = [l["sync/adapter_followed"] for l in lines if "sync/adapter_followed" in l]
    assert followed and all(0.8 < f < 1.2 for f in followed), followed
