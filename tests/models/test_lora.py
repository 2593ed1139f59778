"""LoRA pieces on the random tiny Qwen2: merged weights, the base left untouched, the reference, adapter save/load,
validation of the lora section (cohort/models/lora.py)."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("peft")

from cohort.config import ConfigError  # noqa: E402
from cohort.config.resolve import load_config
from cohort.plan.validate import validate_config  # noqa: E402
from cohort.models.pretrained import load_policy  # noqa: E402
from cohort.models.logprobs import completion_logprobs  # noqa: E402
from cohort.models.lora import TrainOnlyDropout, attach_lora, base_dtype, base_name, linear_module_names, lora_alpha  # noqa: E402
from cohort.models.precision import float32_weights, resolve_precision  # noqa: E402
from cohort.models.batching import pack_right_padded  # noqa: E402


def _lora(model_dir, rank=4, dropout=0.0, targets="all-linear", dtype="float32", precision=None):
    cfg = load_config({"model": {"path": str(model_dir)}, "lora": {"rank": rank, "dropout": dropout, "target_modules": targets}})
    model = load_policy(model_dir, dtype)
    return model, attach_lora(model, cfg.lora, precision=precision)


MIXED_BF16 = resolve_precision("bfloat16", "mixed")


@pytest.fixture(scope="module")
def bf16_model_dir(tiny_model_dir, tmp_path_factory):
    """The random tiny model saved in bfloat16, as real checkpoints are released."""
    out = tmp_path_factory.mktemp("tiny-bf16")
    load_policy(tiny_model_dir, "bfloat16").save_pretrained(str(out))
    return out


def _randomize_adapter(lora, seed=1, std=0.05):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in lora.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def test_only_the_adapter_trains_and_default_alpha_is_twice_the_rank(tiny_model_dir):
    model, lora = _lora(tiny_model_dir, rank=4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    # 2 layers x 7 linear layers (q, k, v, o, gate, up, down) x (A, B); the tied head/embedding is not targeted
    assert len(trainable) == 2 * 7 * 2 and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    layer = lora.layers["model.layers.0.self_attn.q_proj"]
    assert layer.scaling["default"] == 8 / 4  # alpha unset -> 2 x rank = 8; scaling = alpha / rank


def test_merged_weights_equal_peft_merge_and_unload_and_carry_base_names(tiny_model_dir):
    model, lora = _lora(tiny_model_dir, rank=4)
    _randomize_adapter(lora)
    merged = dict(lora.merged_weights())
    reference = copy.deepcopy(lora.peft_model).merge_and_unload()  # peft's own merge, on a copy
    expected = dict(reference.named_parameters())
    assert set(merged) == set(expected)  # e.g. model.layers.0.self_attn.q_proj.weight, no base_layer / lora_ names
    worst = max(float((merged[n] - expected[n]).abs().max()) for n in expected)
    assert worst <= 1e-6
    changed = (merged["model.layers.0.mlp.down_proj.weight"] - model.model.layers[0].mlp.down_proj.base_layer.weight).abs().max()
    assert changed > 1e-3  # the adapter is really in the merged weights (B != 0 here)


@pytest.mark.parametrize("precision", [None, MIXED_BF16], ids=["pure", "mixed"])
@pytest.mark.slow
def test_base_weights_bit_identical_after_1000_merges(tiny_model_dir, precision):
    # bf16 base (under mixed: bf16 matrices, float32 vectors): where merge/unmerge in place drifts (TRL #6688)
    model, lora = _lora(tiny_model_dir, rank=4, dtype="bfloat16", precision=precision)
    _randomize_adapter(lora)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    for _ in range(1000):
        for _name, tensor in lora.merged_weights():
            tensor.to(torch.bfloat16)  # what a sync sends
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters() if n in before)


def test_reference_with_adapter_disabled_equals_the_base_model(tiny_model_dir):
    base = load_policy(tiny_model_dir, "float32")
    model, lora = _lora(tiny_model_dir, rank=4)
    _randomize_adapter(lora)
    packed = pack_right_padded([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], 256)
    args = (packed.input_ids, packed.attention_mask, packed.prompt_lengths, packed.completion_ids, packed.completion_mask)
    with torch.no_grad():
        expected, _ = completion_logprobs(base, *args)
        with lora.adapter_disabled():
            reference, _ = completion_logprobs(model, *args)
        adapted, _ = completion_logprobs(model, *args)
    mask = packed.completion_mask.bool()
    assert float((reference - expected)[mask].abs().max()) <= 1e-6
    assert float((adapted - expected)[mask].abs().max()) > 1e-3  # and the adapter does change them when enabled


def test_dropout_only_while_autograd_records(tiny_model_dir):
    model, lora = _lora(tiny_model_dir, rank=4, dropout=0.5)
    _randomize_adapter(lora)
    model.train()
    assert isinstance(lora.layers["model.layers.0.self_attn.q_proj"].lora_dropout["default"], TrainOnlyDropout)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.equal(a, b)  # scoring is deterministic
    torch.manual_seed(0)
    c = model(input_ids=ids).logits
    assert not torch.allclose(c, a)  # the update's forward drops adapter inputs (p = 0.5)


def test_adapter_save_and_load_round_trip_exactly(tiny_model_dir, tmp_path):
    _, lora = _lora(tiny_model_dir, rank=4)
    _randomize_adapter(lora, seed=3)
    lora.save_adapter(tmp_path / "adapter")
    _, other = _lora(tiny_model_dir, rank=4)
    other.load_adapter(tmp_path / "adapter")
    saved, loaded = lora.adapter_state(), other.adapter_state()
    assert set(saved) == set(loaded) and all(torch.equal(saved[k], loaded[k]) for k in saved)
    _, wrong = _lora(tiny_model_dir, rank=4, targets=["q_proj"])
    with pytest.raises(ValueError, match="does not match the lora section"):
        wrong.load_adapter(tmp_path / "adapter")


def test_save_final_merged_loads_with_from_pretrained(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from cohort.models.pretrained import load_tokenizer

    model, lora = _lora(tiny_model_dir, rank=4)
    _randomize_adapter(lora)
    lora.save_final(tmp_path / "final", load_tokenizer(tiny_model_dir), torch.float32, merged=True)
    assert (tmp_path / "final" / "adapter" / "adapter_config.json").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"), local_files_only=True)
    merged, saved = dict(lora.merged_weights()), dict(loaded.named_parameters())
    assert set(merged) == set(saved) and all(torch.equal(merged[n], saved[n]) for n in merged)  # bit-equal, float32
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():  # (W + sBA)x vs Wx + s·B(Ax): float32 reassociation over 4 layers, logits of size ~4 -> ~1e-5
        assert float((loaded(input_ids=ids).logits - model(input_ids=ids).logits).abs().max()) <= 1e-4


def test_base_name_mapping():
    assert base_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert base_name("model.layers.1.mlp.up_proj.base_layer.bias") == "model.layers.1.mlp.up_proj.bias"
    assert base_name("model.norm.weight") == "model.norm.weight"


def test_linear_module_names_from_config_only(tiny_model_dir):
    linear, other = linear_module_names(tiny_model_dir)
    assert linear == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # lm_head excluded
    assert "embed_tokens" in other


def _problems(model_dir, **lora):
    with pytest.raises(ConfigError) as err:
        validate_config(load_config({"model": {"path": str(model_dir)}, "lora": lora, "rollout": {"max_completion_length": 16}}))
    return err.value.problems


def test_validation_errors_name_the_field_and_the_fix(tiny_model_dir):
    problems = _problems(tiny_model_dir, rank=-1, alpha=0, dropout=1.0)
    assert any("lora.rank = -1: must be >= 1" in p for p in problems)
    assert any("lora.alpha = 0.0: must be > 0" in p for p in problems)
    assert any("lora.dropout = 1.0: must be in [0, 1)" in p for p in problems)
    problems = _problems(tiny_model_dir, rank=8, target_modules=["q_proj", "c_attn", "embed_tokens"])
    assert len(problems) == 2
    assert "'c_attn' is not a module of this model" in problems[0] and "down_proj, gate_proj" in problems[0]
    assert "'embed_tokens' is not a linear layer" in problems[1]
    off = _problems(tiny_model_dir, alpha=16, dropout=0.1, target_modules=["q_proj"], save_merged=False)
    assert [p.split(" is set")[0] for p in off] == ["lora.alpha", "lora.dropout", "lora.target_modules",
                                                    "lora.save_merged"]
    assert "but lora.rank = 0 (LoRA off): set lora.rank (e.g. 16) or drop lora.alpha" in off[0]
    assert lora_alpha(load_config({"lora": {"rank": 8}}).lora) == 16.0


def test_validation_refuses_combinations_not_served(tiny_model_dir):
    cfg = {"model": {"path": str(tiny_model_dir)}, "lora": {"rank": 8}, "algorithm": {"name": "ppo"},
           "engine": {"mode": "local_server"}, "rollout": {"max_completion_length": 16}, "train": {"num_processes": 2, "prompts_per_step": 32}, "run": {"save_every": 0}}
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(cfg))
    text = str(err.value)
    assert "algorithm.name = ppo: the critic is not trained with LoRA yet" in text
    assert "with 2 training processes: sharded LoRA training is not supported yet" in text
    assert "engine.mode" not in text  # every mode gets merged weights (tests/trainer/test_lora_train.py: local_server)
    validate_config(load_config({"model": {"path": str(tiny_model_dir)}, "lora": {"rank": 8, "target_modules": ["q_proj", "v_proj"]},
                                 "rollout": {"max_completion_length": 16}}))  # a valid one passes


def test_plan_memory_counts_the_adapter_and_no_reference_copy(tiny_model_dir):
    from cohort.plan.batch import batch_plan
    from cohort.plan.memory import memory_estimate, model_facts

    def rows(rank, dtype="float32"):
        cfg = load_config({"model": {"path": str(tiny_model_dir), "dtype": dtype}, "lora": {"rank": rank}, "algorithm": {"beta": 0.04},
                           "rollout": {"max_completion_length": 16}})
        return {name: size for name, size, _ in memory_estimate(cfg, batch_plan(cfg), model_facts(cfg.model.path))}

    full, lora = rows(0), rows(8)
    assert "reference model" in full and "reference model" not in lora
    # hidden 128, intermediate 256, 2 layers, rank 8: 2 x 8 x (4 x 2 x 128 + 3 x (128 + 256)) = 34,816 params x 4 B
    assert lora["gradients"] == 34_816 * 4 and lora["AdamW moments"] == 2 * 34_816 * 4
    assert lora["weights"] == full["weights"] + 34_816 * 4  # float32: the base as full fine-tuning holds it + the adapter
    # bfloat16, train.precision=mixed: the frozen base in bf16 (2 B, not a 4 B master), the adapter in float32, no
    # autocast copy of the base (full fine-tuning: 4 B masters + a 2 B copy per weight)
    full_bf16, lora_bf16 = rows(0, "bfloat16"), rows(8, "bfloat16")
    p = full["weights"] // 4
    assert full_bf16["weights"] == 4 * p and full_bf16["autocast weight copies"] == 2 * p
    assert lora_bf16["weights"] == 2 * p + 34_816 * 4 and "autocast weight copies" not in lora_bf16
    assert lora_bf16["gradients"] == 34_816 * 4


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "bf16-mixed"])
def test_gradient_checkpointing_gives_the_adapter_the_same_grads(tiny_model_dir, mixed):
    precision = MIXED_BF16 if mixed else resolve_precision("float32", "mixed")
    grads = []
    for checkpointing in (False, True):
        cfg = load_config({"model": {"path": str(tiny_model_dir)}, "lora": {"rank": 4}})
        model = load_policy(tiny_model_dir, base_dtype(precision))
        if checkpointing:
            model.gradient_checkpointing_enable()
        lora = attach_lora(model, cfg.lora, precision=precision, gradient_checkpointing=checkpointing)
        _randomize_adapter(lora)
        model.train()
        with precision.autocast():
            logits = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits
        logits.float().logsumexp(-1).sum().backward()
        grads.append({n: p.grad for n, p in lora.trainable_parameters()})
    plain, checkpointed = grads
    assert all(checkpointed[n] is not None for n in plain)  # frozen embeddings: grads still reach every adapter
    assert max(float((plain[n] - checkpointed[n]).abs().max()) for n in plain) <= 1e-5


def test_gpt2_conv1d_layers_merge_like_peft(tmp_path):
    """GPT-2's Conv1D stores weights as (in, out): peft marks them fan_in_fan_out and the merged delta is transposed."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    linear, _ = linear_module_names(tmp_path)
    assert linear == {"c_attn", "c_proj", "c_fc"}  # (lm_head excluded)
    model = load_policy(tmp_path, "float32")
    lora = attach_lora(model, load_config({"lora": {"rank": 4, "target_modules": ["c_attn", "c_fc"]}}).lora)
    _randomize_adapter(lora)
    merged = dict(lora.merged_weights())
    expected = dict(copy.deepcopy(lora.peft_model).merge_and_unload().named_parameters())
    assert set(merged) == set(expected)
    assert max(float((merged[n] - expected[n]).abs().max()) for n in expected) <= 1e-6


def _scored(model, precision, packed):
    """Completion log-probs under `precision`'s autocast, and the adapter's gradients of their sum."""
    args = (packed.input_ids, packed.attention_mask, packed.prompt_lengths, packed.completion_ids, packed.completion_mask)
    model.train()
    with precision.autocast():
        logp, _ = completion_logprobs(model, *args)
    logp[packed.completion_mask.bool()].sum().backward()
    return logp.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_mixed_bf16_holds_the_base_in_bf16_and_computes_as_float32_masters_did(bf16_model_dir):
    """train.precision=mixed over a bf16 checkpoint: the frozen base used to be loaded as float32 masters (4 B/param,
    plus autocast's bf16 copy of each weight); now its matrices stay bf16 and only the adapter is float32. Autocast
    rounds a float32 master to the same bf16 values, so the forward is the same bit for bit."""
    assert base_dtype(MIXED_BF16) == torch.bfloat16
    old, old_lora = _lora(bf16_model_dir, rank=4, dtype="float32")  # the former layout: float32 masters of the base
    new, new_lora = _lora(bf16_model_dir, rank=4, dtype=base_dtype(MIXED_BF16), precision=MIXED_BF16)
    f32, f32_lora = _lora(bf16_model_dir, rank=4, dtype="float32")  # plain float32 maths: the full-precision path
    for lora in (old_lora, new_lora, f32_lora):
        _randomize_adapter(lora)
    frozen = {n: p for n, p in new.named_parameters() if not p.requires_grad}
    assert {p.dtype for p in frozen.values() if p.dim() == 2} == {torch.bfloat16}  # embeddings and every linear weight
    assert {p.dtype for p in frozen.values() if p.dim() < 2} == {torch.float32}  # norms: 2 x 128 per layer + 128
    assert {p.dtype for _, p in new_lora.trainable_parameters()} == {torch.float32}
    packed = pack_right_padded([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], 256)
    mask = packed.completion_mask.bool()
    old_logp, old_grads = _scored(old, MIXED_BF16, packed)
    new_logp, new_grads = _scored(new, MIXED_BF16, packed)
    f32_logp, f32_grads = _scored(f32, resolve_precision("float32", "mixed"), packed)
    assert torch.equal(new_logp[mask], old_logp[mask])
    assert float((new_logp - f32_logp)[mask].abs().mean()) > 1e-3  # (and it is bf16 maths: ~2e-2 from float32)

    def rel(grads, ref):  # relative L2 error over every adapter gradient
        return (sum(float((grads[n] - ref[n]).pow(2).sum()) for n in ref) / sum(float(ref[n].pow(2).sum()) for n in ref)) ** 0.5

    # The LM head runs in float32 under autocast in both layouts (the kernel upcasts a bf16 head one chunk at a time,
    # exactly), so the two layouts' logits, and gradients, are the same maths on the same values.
    assert rel(new_grads, f32_grads) <= 1.1 * rel(old_grads, f32_grads) and rel(new_grads, old_grads) < 0.02
    assert all(p.grad is None for p in frozen.values())  # no gradient buffer for the base


def test_autocast_saves_no_bf16_copy_of_the_base_for_backward(bf16_model_dir):
    """Under autocast each linear saves its bf16 weight for the backward: over float32 masters a fresh copy of every
    frozen matrix (a second, bf16 base alive through the update), over a bf16 base the parameter itself."""
    packed = pack_right_padded([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], 256)  # 6 scored tokens: no 128/256-row tensor

    def copies_saved(dtype, precision):
        model, lora = _lora(bf16_model_dir, rank=4, dtype=dtype, precision=precision)
        shapes = {s for n, p in model.named_parameters() if p.dim() == 2 and not p.requires_grad  # (linear saves W.T)
                  for s in (tuple(p.shape), tuple(p.shape)[::-1])}
        storage = {p.untyped_storage().data_ptr() for p in model.parameters()}
        copies = []

        def pack(t):
            if tuple(t.shape) in shapes and t.untyped_storage().data_ptr() not in storage:
                copies.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), MIXED_BF16.autocast():
            completion_logprobs(model, packed.input_ids, packed.attention_mask, packed.prompt_lengths, packed.completion_ids,
                                packed.completion_mask)
        return sum(copies)

    # hidden 128, intermediate 256, 2 KV heads of 32: per layer q, o 128x128, k, v 64x128, gate, up, down 128x256 =
    # 147,456 weights; all but layer 0's q, k, v (their input, the frozen embeddings, needs no gradient) save a bf16
    # copy: 2 x 147,456 - 32,768 = 262,144 weights x 2 B
    assert copies_saved("float32", None) == 262_144 * 2
    assert copies_saved(base_dtype(MIXED_BF16), MIXED_BF16) == 0


def test_float32_weights_runs_a_bf16_base_in_float32_without_keeping_a_copy(bf16_model_dir):
    f32, f32_lora = _lora(bf16_model_dir, rank=4, dtype="float32")
    new, new_lora = _lora(bf16_model_dir, rank=4, dtype=base_dtype(MIXED_BF16), precision=MIXED_BF16)
    for lora in (f32_lora, new_lora):
        _randomize_adapter(lora)
    before = {n: p for n, p in new.named_parameters()}
    packed = pack_right_padded([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], 256)
    args = (packed.input_ids, packed.attention_mask, packed.prompt_lengths, packed.completion_ids, packed.completion_mask)
    with torch.no_grad():
        expected, _ = completion_logprobs(f32, *args)
        with float32_weights(new):
            upcast, _ = completion_logprobs(new, *args)
    assert torch.equal(upcast, expected)  # bf16 -> float32 is exact: the float32 model's log-probs, bit for bit
    after = dict(new.named_parameters())
    assert all(after[n] is before[n] for n in before)  # the bf16 parameters themselves are back, no float32 copy kept
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in new.modules() if not isinstance(m, torch.nn.Embedding))
