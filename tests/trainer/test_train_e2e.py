"""End to end: a user's model directory, JSONL dataset and reward module train with both engines.

The reward is the share of the character "7" in the completion. The random tiny
model starts near 0 (about 1 in 259 tokens is "7"); a working GRPO loop drives it
to nearly 1 within 30 steps at lr 3e-3 (measured: 0.00 → 1.00 with hf and vllm by
step ~20). A broken sign, a stale engine or a missing gradient leaves it near 0.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import yaml

from cohort.config.resolve import load_config
from cohort.models.devices import has_bf16_units
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training
from tests.builders import tiny_run

REWARD_MODULE = textwrap.dedent('''
    import asyncio
    CALLS = []

    def sevens(prompts, completions, completion_ids, answer, **kwargs):
        CALLS.append(sorted(kwargs) + ["answer"])
        return [c.count("7") / max(1, len(c)) for c in completions]

    async def sevens_async(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [c.count("7") / max(1, len(c)) for c in completions]
''')


@pytest.fixture
def user_setup(tmp_path, monkeypatch):
    (tmp_path / "user_rewards_e2e.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a), "source": "unit"}) + "\n" for a in range(32)))
    return tmp_path, data


def _config(tmp_path, data, model_dir, engine, reward):
    return load_config(None, tiny_run(
        model_dir, data, tmp_path / ("run-" + engine), f"engine.name={engine}", "rollout.max_completion_length=6",
        "train.prompts_per_step=4", "train.micro_batch_size=8", "train.max_steps=30", "train.learning_rate=3e-3",
        f"rewards=[{{name: '{reward}'}}]"))


def _check_run(run_dir, model_dir):
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == list(range(1, 31))
    for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio", "loss",
                "entropy", "clip_ratio/region_mean", "grad_norm", "learning_rate", "tokens/generated", "timing/generate_s",
                "timing/reward_s", "timing/logprob_s", "timing/update_s", "timing/step_s"):
        assert key in lines[5], key
    first, last = sum(l["reward"] for l in lines[:5]) / 5, sum(l["reward"] for l in lines[-5:]) / 5
    assert first < 0.15 and last > 0.8, (first, last)
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(str(run_dir / "final"))
    start = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert not torch.equal(final.model.embed_tokens.weight, start.model.embed_tokens.weight)
    assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
    assert (run_dir / "completions.jsonl").read_text().strip()


@pytest.mark.slow
def test_user_reward_module_learns_with_hf(user_setup, tiny_model_dir):
    tmp_path, data = user_setup
    trainer = Trainer(_config(tmp_path, data, tiny_model_dir, "hf", "user_rewards_e2e:sevens"))
    run_training(trainer)
    trainer.close()
    _check_run(tmp_path / "run-hf", tiny_model_dir)
    import user_rewards_e2e

    # every non-prompt column reached the reward as a keyword argument
    assert user_rewards_e2e.CALLS[0] == ["source", "answer"]


@pytest.mark.vllm
def test_async_user_reward_learns_with_vllm(user_setup, tiny_model_dir, vllm_engine):
    tmp_path, data = user_setup
    trainer = Trainer(_config(tmp_path, data, tiny_model_dir, "vllm", "user_rewards_e2e.sevens_async"), engine=vllm_engine)
    run_training(trainer)
    trainer.close()
    _check_run(tmp_path / "run-vllm", tiny_model_dir)
    # the engine ended on the trained policy: its canary agreed with the trainer after every sync
    assert trainer.sync.last_canary_gap < 1e-4


@pytest.mark.slow
def test_reward_model_scores_reach_the_trainer(tmp_path, tiny_model_dir, tiny_reward_model_dir):
    """A `reward_model` reward in cohort train: each logged reward equals a direct forward of the classifier."""
    import transformers

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"the answer is {w}"}) + "\n" for w in ("one", "two", "three", "four")))
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=32", "engine.name=hf",
        "rollout.num_generations=2", "rollout.max_completion_length=4", "train.prompts_per_step=2", "train.micro_batch_size=4",
        "train.max_steps=2", "train.steps_per_generation=2", "data.shuffle=false",
        f"rewards=[{{name: reward_model, model: '{tiny_reward_model_dir}'}}]",
        f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=1",
    ])
    trainer = Trainer(cfg)
    run_training(trainer)
    trainer.close()
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_reward_model_dir))
    rm = transformers.AutoModelForSequenceClassification.from_pretrained(str(tiny_reward_model_dir)).eval()
    logged = [json.loads(l) for l in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(logged) == 8  # 4 per step, 2 steps
    # one generation batch of 8 serves both steps (steps_per_generation 2, prompts in file order): each step logs the
    # slice it trained on, so step 1 shows the first two prompts (each twice) and step 2 the last two
    assert [(r["step"], r["prompt"].split()[-1]) for r in logged] == [
        (1, "one"), (1, "one"), (1, "two"), (1, "two"), (2, "three"), (2, "three"), (2, "four"), (2, "four")]
    for row in logged:
        with torch.inference_mode():
            direct = rm(**tok(row["prompt"] + row["completion"], return_tensors="pt")).logits[0, 0].item()
        assert abs(row["reward"] - direct) < 1e-5
    metrics = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "rewards/reward_model/mean" in metrics[0]


@pytest.fixture
def model_512(tiny_model_dir_512):
    return tiny_model_dir_512


def six_token_prompts(tmp_path):
    data = tmp_path / "six.jsonl"  # "12+34=": six characters, six tokens with the char tokenizer
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n" for a in range(10, 14) for b in range(30, 34)))
    return data


def test_a_512_position_model_with_short_prompts_validates_at_the_field_defaults(tmp_path, model_512):
    # before: "data.max_prompt_length + rollout.max_completion_length = 512 + 8 = 520 exceeds the model's
    # max_position_embeddings = 512" for data.max_prompt_length = 512 (its old default): the configured ceiling, not the data
    from cohort.plan.validate import validate_config

    data = six_token_prompts(tmp_path)
    for extra in (["data.max_prompt_length=512", "rollout.max_completion_length=8"], []):
        plan = validate_config(load_config(None, [f"model.path={model_512}", f"data.train_files=[{data}]", *extra])).batch
        assert plan.max_tokens_per_sequence == 6 + (8 if extra else 256)  # the longest prompt kept + the completion


@pytest.mark.slow
def test_a_512_position_model_trains_with_the_default_config(tmp_path, model_512, capsys):
    """`cohort train model.path=M data.train_files=[D]` and nothing else but the run's length and engine."""
    from cohort import cli

    data, run_dir = six_token_prompts(tmp_path), tmp_path / "run"
    code = cli.main(["train", f"model.path={model_512}", f"data.train_files=[{data}]", "rewards=[{name: numeric_match}]",
                     "train.max_steps=2", "engine.name=hf", f"run.output_dir={run_dir}", "run.progress=false"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[0] == ("config: the field defaults (a model or data of your own: the demo preset is only for the "
                                   "embedded model on a built-in task) + 7 overrides; model.dtype auto = float32 ("
                                   + ("0.3M parameters on cpu: bfloat16 pays from 3M there)" if has_bf16_units(torch.device("cpu"))
                                      else "no bfloat16 units on cpu)"))  # (the reason follows this machine's CPU)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    # the documented field defaults, not the demo's preset (lr 3e-4, 24-token prompts, 8-token completions, 32 prompts)
    assert saved["train"]["learning_rate"] == 1e-6 and saved["data"]["max_prompt_length"] is None
    assert saved["rollout"]["max_completion_length"] == 256 and saved["train"]["prompts_per_step"] == 8
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # the random model rarely ends early (EOS is 1 of 259 tokens): completions run far past the preset's 8 tokens
    assert all(8 < m["completions/mean_length"] <= 256 for m in metrics), [m["completions/mean_length"] for m in metrics]
    assert "filtered" not in out


@pytest.mark.vllm
def test_a_512_position_model_trains_with_the_default_config_through_vllm(tmp_path, model_512):
    # the engine is sized by the data: the longest prompt kept (6) + the default completion (256) + 1 = 263 tokens
    data = six_token_prompts(tmp_path)
    cfg = load_config(None, [f"model.path={model_512}", f"data.train_files=[{data}]", "rewards=[{name: numeric_match}]",
                             "train.max_steps=2", f"run.output_dir={tmp_path / 'run'}", "run.progress=false"])
    assert (cfg.engine.name, cfg.data.max_prompt_length, cfg.rollout.max_completion_length) == ("vllm", None, 256)
    trainer = Trainer(cfg)
    try:
        assert trainer.parts.engine.llm.llm_engine.model_config.max_model_len == 6 + 256 + 1
        summary = run_training(trainer)
    finally:
        trainer.close()
    assert summary["steps"] == 2 and trainer.sync.last_canary_gap < 1e-3  # step 2 sampled from the updated weights
