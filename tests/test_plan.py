"""`cohort plan`: bad configurations rejected with their fields and a fix, the schedule, the memory estimate.

tests/test_config.py covers the first batch-arithmetic checks; here are the
others, one test each, all through `validate_config` (what `cohort train` runs
before loading anything).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from cohort import cli
from cohort.config import ConfigError, load_config
from cohort.plan import batch_plan, format_plan, memory_estimate, model_facts
from cohort.validation import validate_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    return path


@pytest.fixture
def big_model_dir(tmp_path):
    """config.json of a 7B-like model (32 layers, 8 KV heads of 128, 32k positions) and a token safetensors file."""
    from safetensors.torch import save_file

    d = tmp_path / "big"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768}))
    save_file({"w": torch.zeros(4)}, str(d / "model.safetensors"))
    return d


def reject(overrides, *expected):
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, overrides))
    text = str(err.value)
    for piece in expected:
        assert piece in text, text
    return text


def test_save_every_beyond_max_steps():
    reject(["train.max_steps=100", "run.save_every=500"],
           "run.save_every = 500 > train.max_steps = 100: no checkpoint would be written", "use a value <= 100 (e.g. 10) or 0")


def test_keep_no_checkpoints():
    reject(["run.keep_checkpoints=0"], "run.keep_checkpoints = 0: must be >= 1", "use 2")


def test_periodic_eval_without_eval_data(data_file):
    reject([f"data.train_files=[{data_file}]", "run.eval_every=10"],
           "run.eval_every = 10 but there is no eval data", "set data.eval_files or run.eval_every=0")


def test_adam_beta_of_one():
    reject(["train.adam_beta2=1.0"], "train.adam_beta2 = 1.0: must be in [0, 1)", "0.9 and 0.999 are the defaults")


def test_negative_grad_clip():
    reject(["train.max_grad_norm=-1"], "train.max_grad_norm = -1.0: must be >= 0", "0 turns clipping off")


def test_zero_sync_tolerance():
    reject(["rollout.sync_check_tolerance=0"], "rollout.sync_check_tolerance = 0.0: must be > 0", "unset it (null) for the calibrated check")


def test_a_kept_prompt_longer_than_the_model_positions_is_refused_before_loading(tmp_path, tiny_model_dir, monkeypatch):
    # the random tiny model has max_position_embeddings = 128 and one token per character: a 100-character prompt is
    # kept whole under data.max_prompt_length = 100, and 100 + 64 = 164 > 128. Room for the prompt: 128 − 64 = 64;
    # room for the completion beside it: 128 − 100 = 28.
    import cohort.models.loading as loading

    monkeypatch.setattr(loading, "load_policy", lambda *a, **k: pytest.fail("weights loaded before the check"))
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "9" * 96 + "+1=?", "answer": "x"}) + "\n")
    reject([f"model.path={tiny_model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=100",
            "rollout.max_completion_length=64"],
           f"the longest prompt kept ({data}:2: 100 tokens) + rollout.max_completion_length = 100 + 64 = 164 exceeds the model's "
           "max_position_embeddings = 128; lower data.max_prompt_length to 64 (longer prompts then follow data.overlong_prompts) "
           "or unset it (None: what fits the model), or lower rollout.max_completion_length to 28")


def test_the_fit_check_uses_the_data_not_the_configured_ceiling(data_file, tiny_model_dir):
    # 100 + 64 > 128 positions was refused from the config alone; the longest prompt here is "0+1=" (4 tokens): 4 + 64 fits
    plan = validate_config(load_config(None, [f"model.path={tiny_model_dir}", f"data.train_files=[{data_file}]",
                                              "data.max_prompt_length=100", "rollout.max_completion_length=64"]))
    assert plan.max_tokens_per_sequence == 4 + 64
    assert plan.prompt_tokens_from == f"the longest prompt kept, {data_file}:1"


def test_no_room_for_a_prompt_is_refused_even_without_the_data(data_file):
    # tiny:arith's tokenizer is built with the model, so its prompts are not measured; its 128 positions are known
    reject([f"data.train_files=[{data_file}]", "rollout.max_completion_length=128"],
           "rollout.max_completion_length = 128 leaves no room for a prompt in the model's max_position_embeddings = 128",
           "lower it (e.g. to 64)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="rollout.kv_cache_gib is the CPU backend's KV cache")
def test_kv_cache_too_small_for_one_sequence(big_model_dir):
    # K and V × 32 layers × 8 heads × 128 dims × 4 bytes = 262,144 bytes per token; 512 + 8192 tokens = 2.125 GiB > 1 GiB
    reject([f"model.path={big_model_dir}", "rollout.engine=vllm", "data.max_prompt_length=512",
            "rollout.max_completion_length=8192", "rollout.kv_cache_gib=1"],
           "rollout.kv_cache_gib = 1.0 (1 GiB) cannot hold one sequence of 8704 tokens (2.12 GiB at 262,144 bytes per token)",
           "raise rollout.kv_cache_gib to at least 3")


def test_output_dir_inside_a_file(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    reject([f"run.output_dir={blocker}/run"], f"run.output_dir = '{blocker}/run': '{blocker}' is a file", "choose another run.output_dir")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_wandb_logger_without_wandb():
    reject(["run.loggers=[jsonl, wandb]"], "run.loggers includes 'wandb' but the wandb package is not installed",
           "`pip install wandb` or remove wandb from run.loggers")


def test_generation_batch_not_a_multiple_of_the_step():
    # 4 prompts × G=4 = 16 completions per step; 24 is a multiple of G but not of 16
    reject(["rollout.num_generations=4", "train.prompts_per_step=4", "rollout.generation_batch_size=24"],
           "rollout.generation_batch_size = 24 is not a multiple of the completions per optimizer step", "use 16")


def test_delta_inside_the_clip_range():
    reject(["algorithm.delta=1.1", "algorithm.epsilon_high=0.2"], "algorithm.delta = 1.1: must exceed 1 + algorithm.epsilon_high = 1.2",
           "TRL suggests 1.5–2")


def test_warmup_longer_than_the_run():
    reject(["train.max_steps=10", "train.warmup_steps=20"], "train.warmup_steps = 20: must be between 0 and train.max_steps = 10")


def test_lower_clip_bound_not_positive():
    reject(["algorithm.epsilon_low=1.0"], "algorithm.epsilon_low = 1.0: must be < 1", "use 0.2")


def test_every_problem_is_reported_at_once():
    text = reject(["run.keep_checkpoints=0", "train.max_grad_norm=-1", "rollout.top_p=0"])
    assert "3 problem(s)" in text


# --------------------------------------------------------------------------- the printout


def test_plan_prints_the_schedule_and_memory(tiny_model_dir, data_file, capsys):
    code = cli.main(["plan", f"model.path={tiny_model_dir}", f"data.train_files=[{data_file}]", "rollout.max_completion_length=100",
                     "rollout.num_generations=8", "train.prompts_per_step=16", "train.steps_per_generation=4",
                     "train.micro_batch_size=16", "algorithm.beta=0.01", "run.save_every=10"])
    out = capsys.readouterr().out
    assert code == 0
    for line in ("generation batch      64 prompts × G=8 = 512 completions",
                 "micro-batches         8 of ≤16 completions (gradient accumulation over 8)",
                 "off-policy lag        3 optimizer step(s)",
                 # the longest prompt in data_file is "0+1=", 4 tokens: 128 completions × (4 + 100) = 13,312
                 f"tokens per step       ≤ 13,312 (128 × (longest prompt 4 + max_completion_length 100)); the longest prompt "
                 f"kept, {data_file}:1",
                 "checkpoints           every 10 steps, newest 2 kept",
                 "memory of the training process (rough estimate; 329,216 parameters)",
                 "weights                 1.26 MiB   329,216 parameters × 4 B (float32)",
                 "AdamW moments           2.51 MiB",
                 "reference model         1.26 MiB",
                 "docs/algorithms.md#what-the-loss-value-means"):
        assert line in out, line


def test_plan_says_when_it_did_not_read_the_prompts(data_file, capsys):
    assert cli.main(["plan", f"data.train_files=[{data_file}]", "rollout.max_completion_length=8"]) == 0
    out = capsys.readouterr().out
    assert ("tokens per step       not bounded here: data.max_prompt_length is None and the prompts were not measured (a tiny:* model's "
            "tokenizer is built with the model); each sequence is at most the model's positions") in out


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_plan_accepts_every_example(example, capsys):
    assert cli.main(["plan", str(example)]) == 0
    assert "batch plan" in capsys.readouterr().out


def test_model_facts_count_parameters_from_the_headers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}  # the tied LM head counts once
    facts = model_facts(str(tiny_model_dir))
    assert facts.num_params == sum(unique.values()) == 329_216
    assert (facts.hidden_size, facts.num_layers, facts.num_kv_heads, facts.head_dim, facts.max_positions) == (128, 2, 2, 32, 128)


def test_activation_estimate_is_close_to_what_autograd_saves(tiny_model_dir):
    """The estimate (8·hidden + 4·intermediate values per token per layer) against the bytes autograd really keeps.

    Measured on the tiny model (16 × 116 tokens): estimate 29.0 MiB, saved 32.8 MiB.
    """
    from transformers import AutoModelForCausalLM

    from cohort.models.logprobs import decoder_and_head

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "data.max_prompt_length=16", "rollout.max_completion_length=100",
                             "rollout.num_generations=4", "train.prompts_per_step=4", "train.micro_batch_size=16"])
    estimate = dict((name, size) for name, size, _ in memory_estimate(cfg, batch_plan(cfg), model_facts(str(tiny_model_dir))))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    model.train()
    params = {p.data_ptr() for p in model.parameters()}
    saved: dict[tuple[int, int], int] = {}

    def keep(t):
        if t.data_ptr() not in params:
            saved[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t

    body, _ = decoder_and_head(model)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        body(input_ids=torch.randint(0, 256, (16, 116))).last_hidden_state.sum()
    measured = sum(saved.values())
    assert 0.75 < estimate["activations"] / measured < 1.25, (estimate["activations"], measured)


# --------------------------------------------------------------------------- streaming and dynamic sampling


def test_stream_update_on_names_every_field_that_makes_it_inexact():
    reject(["rollout.stream_update=on", "algorithm.name=reinforce_pp", "algorithm.loss_type=bnpo", "train.steps_per_generation=2",
            "train.prompts_per_step=2", "rollout.num_generations=4"],
           "rollout.stream_update = on, but", "algorithm.name = reinforce_pp", "algorithm.loss_type = bnpo",
           "train.steps_per_generation = 2", "(or set rollout.stream_update=auto/off)")
    reject(["rollout.stream_update=on", "algorithm.beta=0.1", "algorithm.kl_controller=adaptive"], "algorithm.beta = 0.1")
    validate_config(load_config(None, ["rollout.stream_update=on", "algorithm.beta=0.1"]))  # KL in the loss, fixed: exact


def test_dynamic_sampling_is_refused_where_a_constant_group_still_has_advantages():
    reject(["rollout.dynamic_sampling=true", "algorithm.name=reinforce_pp"],
           "rollout.dynamic_sampling = true with algorithm.name = reinforce_pp")
    reject(["rollout.dynamic_sampling=true", "rollout.overlap=true"], "rollout.dynamic_sampling = true with rollout.overlap")
    reject(["rollout.dynamic_sampling=true", "rollout.max_refill_rounds=-1"], "rollout.max_refill_rounds = -1")
    validate_config(load_config(None, ["rollout.dynamic_sampling=true", "algorithm.name=rloo"]))


def test_plan_says_whether_the_update_streams_and_what_waits_for_the_batch(data_file, capsys):
    base = [f"data.train_files=[{data_file}]", "rollout.max_completion_length=8"]
    cli.main(["plan", *base, "rollout.mode=local_server"])
    assert "streamed update       on: each finished group's forward/backward runs while the rest generate" in capsys.readouterr().out
    cli.main(["plan", *base])
    assert ("streamed update       off (rollout.mode = colocate: the engine shares the trainer's cores): rewards per group"
            in capsys.readouterr().out)
    cli.main(["plan", *base, "rollout.mode=local_server", "algorithm.scale_rewards=batch", "rollout.dynamic_sampling=true"])
    out = capsys.readouterr().out
    assert "streamed update       off (algorithm.scale_rewards = batch)" in out
    assert "dynamic sampling      on: groups with all-equal rewards are replaced, at most 30 refill rounds" in out


def test_plan_says_when_partial_rollouts_or_asynchronous_generation_train_off_policy_tokens(data_file, capsys):
    base = [f"data.train_files=[{data_file}]", "rollout.max_completion_length=8"]
    cli.main(["plan", *base, "rollout.over_provision=1.5", "algorithm.off_policy_objective=mask_stale"])
    out = capsys.readouterr().out
    assert ("partial rollouts      on: 1.5× the batch's groups requested, the first to finish trained, the rest resumed "
            "next step (at most 2 cuts per request); resumed tokens are off-policy (mask_stale)") in out
    cli.main(["plan", *base, "rollout.max_staleness=2", "rollout.stale_tokens=drop"])
    out = capsys.readouterr().out
    assert "streamed update       off (rollout.max_staleness): each batch's groups are taken as they finish" in out
    assert ("asynchronous          on: generation runs up to 2 policy version(s) ahead; tokens staler when trained: drop; "
            "off-policy tokens: decoupled") in out
