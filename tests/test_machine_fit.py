"""The plan against the machine's memory (cohort/plan/machine_fit.py, `validate.machine_memory_problems`): a run whose
estimate is more than the machine has is refused before anything loads, with the fixes that make it fit; the same
config with a fix applied is accepted, and an estimate within the machine's total never refused.

The model is a header-only checkpoint of Qwen2.5-Coder-1.5B's shapes (issue 60's GGUF, converted); the machine is
faked in one place (`cohort.models.host_memory.machine_memory`). Derivations, float32 (on this CPU, `auto`), default
batch (8 prompts × G=8 = 64 completions, micro-batch 16), data.max_prompt_length 32 + 32 completion tokens, vLLM
colocated on the CPU:
- P = 233,373,696 (embeddings, tied) + 28 × 46,797,824 (q 1,536² + 1,536, k and v 256 × 1,536 + 256 each, o 1,536²,
  gate/up/down 8,960 × 1,536 each, two norms) + 1,536 = 1,543,714,304;
- weights, gradients, AdamW moments 16 P = 24,699,428,864; activations 16 × 64 = 1,024 tokens × 28 layers × 204,856 B
  (8·1,536 + 8 + 8·4·1,536 + 4·12 + 16·8,960) + the mask 1,024 × 64 × 4 = 5,873,893,376; log-prob chunk 110 × 151,936
  × 8 = 133,703,680; LM head gradient 151,936 × 1,536 × 4 = 933,494,784; vLLM 4 P = 6,174,857,216 + KV 1 GiB + working
  1 GiB + runtime 450 MiB (471,859,200): 40,434,720,768 B = 37.66 GiB.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.models import host_memory
from cohort.models.host_memory import MachineMemory
from cohort.plan.batch import batch_plan
from cohort.plan.machine_fit import host_rows, total
from cohort.plan.memory import model_facts
from cohort.plan.printout import format_plan
from cohort.plan.validate import validate_config
from tests.test_plan import without_tokenizer_check

GIB = 2**30
FLOAT32_SHORT = ["model.dtype=float32", "data.task=arith", "data.max_prompt_length=32", "rollout.max_completion_length=32"]


def write_coder15_dir(d: Path) -> Path:
    """config.json and a safetensors *header* of Qwen2.5-Coder-1.5B's tensors (no data: the planner reads headers)."""
    h, i, kv = 1536, 8960, 256
    shapes = {"model.embed_tokens.weight": [151936, h], "model.norm.weight": [h]}
    for layer in range(28):
        shapes.update({f"model.layers.{layer}.{name}": shape for name, shape in {
            "self_attn.q_proj.weight": [h, h], "self_attn.q_proj.bias": [h], "self_attn.k_proj.weight": [kv, h],
            "self_attn.k_proj.bias": [kv], "self_attn.v_proj.weight": [kv, h], "self_attn.v_proj.bias": [kv],
            "self_attn.o_proj.weight": [h, h], "mlp.gate_proj.weight": [i, h], "mlp.up_proj.weight": [i, h],
            "mlp.down_proj.weight": [h, i], "input_layernorm.weight": [h], "post_attention_layernorm.weight": [h]}.items()})
    header, offset = {}, 0
    for name, shape in shapes.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * math.prod(shape)]}
        offset += 2 * math.prod(shape)
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": h, "intermediate_size": i, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True}))
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return d


@pytest.fixture
def coder15(tmp_path, monkeypatch):
    without_tokenizer_check(monkeypatch)
    return write_coder15_dir(tmp_path / "coder15")


def fake_machine(monkeypatch, total_bytes: int, available: int | None = None) -> None:
    monkeypatch.setattr(host_memory, "machine_memory", lambda: MachineMemory(total_bytes, "MemTotal", available))


def refusal(model_dir, *overrides) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, [f"model.path={model_dir}", *overrides]))
    (problem,) = err.value.problems
    return problem


def test_the_estimate_of_the_converted_coder_model(coder15):
    cfg = load_config(None, [f"model.path={coder15}", *FLOAT32_SHORT])
    assert model_facts(str(coder15)).num_params == 1_543_714_304
    assert total(host_rows(cfg, batch_plan(cfg), model_facts(str(coder15)))) == 40_434_720_768  # (module docstring)


def test_a_run_larger_than_the_machine_is_refused_with_the_fixes_and_accepted_with_one(coder15, monkeypatch):
    """23 GiB = 24,696,061,952 B < 40,434,720,768 (37.66 GiB): refused, the fixes by what they save, each re-estimated:
    - lora.rank=16: the frozen base 4 P = 6,174,857,216 + the adapter's ≤ 28 × 16 × (4 × 2·1,536 + 3 × (1,536 + 8,960))
      = 19,611,648 parameters × 4 B (78,446,592) in weights, once more in gradients, twice in moments (156,893,184); the
      same activations, chunk, no LM head gradient; vLLM 8,794,200,064: 21,290,440,704 (19.83 GiB, saves 17.83): fits;
    - model.dtype=bfloat16 train.precision=pure: 8 P = 12,349,714,432, activations 1,024 × 28 × 108,600 + 1,024 × 64 × 2
      = 3,113,910,272, chunk 133,703,680, head 466,747,392, vLLM 2 P + 2 GiB + 450 MiB = 5,706,771,456:
      21,770,847,232 (20.28 GiB, saves 17.38): fits;
    - train.micro_batch_size=1 (no divisor of 64 fits): activations 64 × 28 × 204,856 + 64 × 64 × 4 = 367,118,336:
      34,927,945,728 (32.53 GiB, saves 5.13): not enough alone."""
    fake_machine(monkeypatch, 23 * GIB)
    problem = refusal(coder15, *FLOAT32_SHORT)
    assert problem.startswith("memory: the run's estimate 37.66 GiB (`cohort plan ... train.check_memory=false` lists it) "
                              "is more than this machine's 23.00 GiB (MemTotal), so it cannot fit; fixes, by what they "
                              "save: lora.rank=16 (-17.83 GiB: 19.83 GiB, fits); model.dtype=bfloat16 train.precision=pure "
                              "(-17.38 GiB: 20.28 GiB, fits); "), problem
    assert "train.micro_batch_size=1 (-5.13 GiB: 32.53 GiB, not enough alone)" in problem
    assert problem.endswith("; or train.check_memory=false to run anyway (with swap)")
    # each fix that says "fits" is accepted on the same machine
    for fix in (["lora.rank=16"], ["model.dtype=bfloat16", "train.precision=pure"]):
        validate_config(load_config(None, [f"model.path={coder15}", *FLOAT32_SHORT, *fix]))


def test_the_largest_micro_batch_that_fits_is_named_and_accepted(coder15, monkeypatch):
    """bfloat16 pure, 256 + 256 tokens: 8 P = 12,349,714,432 + activations 8,192 tokens × 28 × 108,600 + 8,192 × 512 × 2
    = 24,918,622,208 + 133,703,680 + 466,747,392 + vLLM 5,706,771,456 = 43,575,559,168 (40.58 GiB) on 23 GiB. Micro-batch
    8: activations 12,459,311,104, 31,116,248,064: no; 4: 6,229,655,552, 24,886,592,512 (23.18 GiB): no, by 0.18 GiB; 2:
    3,114,827,776, 21,771,764,736 (20.28 GiB): fits, and is the one named (saves 20.31 GiB)."""
    fake_machine(monkeypatch, 23 * GIB)
    bf16 = ["model.dtype=bfloat16", "train.precision=pure", "data.task=arith", "data.max_prompt_length=256",
            "rollout.max_completion_length=256"]
    problem = refusal(coder15, *bf16)
    assert "the run's estimate 40.58 GiB" in problem
    assert "train.micro_batch_size=2 (-20.31 GiB: 20.28 GiB, fits)" in problem, problem
    refusal(coder15, *bf16, "train.micro_batch_size=4")  # 23.18 GiB: still refused
    validate_config(load_config(None, [f"model.path={coder15}", *bf16, "train.micro_batch_size=2"]))


def test_when_no_fix_is_enough_alone_all_of_them_together_are_estimated(coder15, monkeypatch):
    """On 10 GiB (10,737,418,240 B) no fix fits alone (LoRA's 19.83 GiB is the least). Together (micro-batch 1,
    checkpointing, rank 16, bfloat16 pure): the base 2 P = 3,087,428,608 + the adapter 78,446,592 + its gradients
    78,446,592 and moments 156,893,184; activations 64 tokens × (28 layer inputs × 1,536 × 2 B + one layer 108,600 B) +
    64 × 64 × 2 = 12,463,616; chunk 133,703,680; vLLM 5,706,771,456: 9,254,153,728 (8.62 GiB): fits."""
    fake_machine(monkeypatch, 10 * GIB)
    problem = refusal(coder15, *FLOAT32_SHORT)
    assert "lora.rank=16 (-17.83 GiB: 19.83 GiB, not enough alone)" in problem
    assert "; all of them together: 8.62 GiB, fits; or train.check_memory=false" in problem, problem


def test_an_estimate_within_the_machine_is_never_refused(coder15, monkeypatch):
    """The margin: the estimate equal to the machine's total passes, one byte less refuses; what is available now
    (others' processes) is not compared, only said by `cohort plan`; train.check_memory=false runs anyway."""
    needed = 40_434_720_768
    fake_machine(monkeypatch, needed, available=2 * GIB)
    validate_config(load_config(None, [f"model.path={coder15}", *FLOAT32_SHORT]))
    fake_machine(monkeypatch, needed - 1)
    refusal(coder15, *FLOAT32_SHORT)
    validate_config(load_config(None, [f"model.path={coder15}", *FLOAT32_SHORT, "train.check_memory=false"]))


def test_an_evaluation_is_not_compared_with_the_training_estimate(coder15, monkeypatch):
    # `cohort eval` validates with trains=False: the same 37.66 GiB config on 23 GiB holds no gradients or AdamW state
    fake_machine(monkeypatch, 23 * GIB)
    validate_config(load_config(None, [f"model.path={coder15}", *FLOAT32_SHORT]), trains=False)
    refusal(coder15, *FLOAT32_SHORT)  # (the same config, trained: refused)


def test_plan_prints_the_machine_memory_beside_the_estimate(coder15):
    # 48 GiB, 2 GiB available now: 37.66 GiB fits the machine, more than is available (the other 46 GiB in use); on
    # 23 GiB with train.check_memory=false (validation let it through) the printout still says it does not fit
    cfg = load_config(None, [f"model.path={coder15}", *FLOAT32_SHORT])
    out = format_plan(cfg, batch_plan(cfg), machine=MachineMemory(48 * GIB, "MemTotal", 2 * GIB))
    assert "process total          37.66 GiB" in out
    assert ("machine memory         48.00 GiB   MemTotal; 2.00 GiB available now: the estimate fits, more than is "
            "available now (other processes hold 46.00 GiB)") in out
    cfg = load_config(None, [f"model.path={coder15}", *FLOAT32_SHORT, "train.check_memory=false"])
    out = format_plan(cfg, batch_plan(cfg), machine=MachineMemory(23 * GIB, "MemTotal"))
    assert "machine memory         23.00 GiB   MemTotal: the estimate does NOT fit (train.check_memory = false: run anyway)" in out


def test_a_trainer_alone_on_its_gpu_is_compared_with_the_gpu(coder15, monkeypatch):
    """engine.name=hf on a 16 GiB GPU: no vLLM split, the trainer's peak 31,640,520,704 (the rows above without vLLM's)
    + the CUDA context 536,870,912 = 32,177,391,616 (29.97 GiB) > 16 GiB: refused; the host is not compared."""
    import cohort.plan.validate as validation

    monkeypatch.setattr(validation, "resolve_device", lambda setting="auto": torch.device("cuda", 0))
    monkeypatch.setattr(validation.torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"total_memory": 16 * GIB})())
    monkeypatch.setattr(host_memory, "machine_memory", lambda: pytest.fail("the host compared for a GPU run"))
    problem = refusal(coder15, *FLOAT32_SHORT, "engine.name=hf")
    assert problem.startswith("memory: the run's estimate 29.97 GiB (`cohort plan ... train.check_memory=false` lists it) "
                              "is more than the GPU's 16.00 GiB (cuda:0's total_memory)"), problem
