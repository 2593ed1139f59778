"""On-policy distillation's teacher is checked before anything loads (cohort/plan/teacher_checks.py, cohort/plan/memory.py):
a missing teacher, a teacher of another tokenizer, a teacher too large for the GPU plan, too few positions, and the
ranges; a teacher of the same tokenizer is accepted, and distilling alone needs no reward function."""

from __future__ import annotations

import json
import math
import struct

import pytest

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.distributed.fsdp import LocalContext
from cohort.models.pretrained import load_tokenizer
from cohort.plan.batch import batch_plan
from cohort.plan.memory import memory_estimate, model_facts
from cohort.plan.printout import format_plan
from cohort.trainer import build_parts as trainer_setup
from cohort.plan.validate import validate_config
from tests.conftest import build_random_tiny
from tests.test_plan import QWEN05, without_tokenizer_check, write_qwen05_dir
from tests.test_validation import _fake_gpu


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """Another random tiny Qwen2 with the student's (tiny_model_dir's) character tokenizer."""
    return build_random_tiny(tmp_path_factory.mktemp("teacher"), seed=1)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(8)))
    return path


def _cfg(tmp_path, data_file, student, *overrides):
    return load_config(None, [f"model.path={student}", f"data.train_files=[{data_file}]", "data.max_prompt_length=16",
                              "rollout.max_completion_length=8", "rollout.num_generations=2", "train.prompts_per_step=2",
                              "train.micro_batch_size=4", "engine.name=hf", f"run.output_dir={tmp_path / 'run'}",
                              "algorithm.name=distill", *overrides])


def _problems(cfg) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    return err.value.problems


def test_a_teacher_of_the_same_tokenizer_distils_alone_without_rewards(tmp_path, data_file, tiny_model_dir, teacher_dir):
    plan = validate_config(_cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={teacher_dir}", "rewards=[]",
                                "rollout.num_generations=1")).batch  # (a group of one: the teacher needs no group)
    assert plan.num_generations == 1


def test_a_missing_teacher_is_refused_with_the_fix(tmp_path, data_file, tiny_model_dir):
    (problem,) = _problems(_cfg(tmp_path, data_file, tiny_model_dir))
    assert problem.startswith("algorithm.name = distill needs a teacher: set teacher.path")
    (problem,) = _problems(_cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={tmp_path / 'nowhere'}"))
    assert problem.startswith(f"teacher.path = '{tmp_path / 'nowhere'}': not a directory"), problem


def test_a_teacher_beside_another_algorithm_is_refused(tmp_path, data_file, tiny_model_dir, teacher_dir):
    (problem,) = _problems(_cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={teacher_dir}", "algorithm.name=grpo"))
    assert "is read only by algorithm.name = distill (this run is grpo): set algorithm.name=distill" in problem


def test_a_teacher_of_another_tokenizer_is_refused_before_anything_loads(tmp_path, data_file, tiny_model_dir,
                                                                          tiny_chat_model_dir, monkeypatch):
    # the student's character tokenizer against the chat checkpoint's byte-level BPE: refused with the fix, by the
    # Trainer too, before any weights load (load_policy is never reached)
    cfg = _cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={tiny_chat_model_dir}")
    (problem,) = _problems(cfg)
    assert f"teacher.path = '{tiny_chat_model_dir}' and model.path = '{tiny_model_dir}' do not share a tokenizer" in problem
    assert "tokens have another id or none in the teacher's" in problem and "choose a teacher of the student's family" in problem
    monkeypatch.setattr(trainer_setup, "load_policy", lambda *a, **k: pytest.fail("weights loaded"))
    from cohort.trainer.trainer import Trainer

    with pytest.raises(ConfigError, match="do not share a tokenizer"):
        Trainer(cfg)


def test_the_trainer_compares_the_loaded_tokenizers_before_the_teachers_weights(tmp_path, data_file, tiny_model_dir,
                                                                                 tiny_chat_model_dir, monkeypatch):
    # a teacher path validation cannot read as a local directory is still compared at setup, from its tokenizer alone
    cfg = _cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={tiny_chat_model_dir}")
    monkeypatch.setattr(trainer_setup, "load_policy", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(ConfigError, match="do not share a tokenizer"):
        trainer_setup._teacher(cfg, LocalContext(), load_tokenizer(tiny_model_dir))


def test_two_embedded_tiny_models_are_compared_by_their_recipes_without_a_build():
    # tiny:arith writes the character tokenizer, tiny:arith_chat a byte-level BPE: refused whether or not either is
    # built (validating a tiny model builds nothing: tests/test_validation.py); tiny:long_tail shares tiny:arith's
    cfg = load_config(None, ["model.path=tiny:arith", "algorithm.name=distill", "teacher.path=tiny:arith_chat"])
    (problem,) = _problems(cfg)
    assert "do not share a tokenizer" in problem
    validate_config(load_config(None, ["model.path=tiny:arith", "algorithm.name=distill", "teacher.path=tiny:long_tail"]))


def test_ranges_and_rewards_are_checked(tmp_path, data_file, tiny_model_dir, teacher_dir):
    problems = _problems(_cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={teacher_dir}", "teacher.kl_coef=0",
                              "teacher.reward_weight=1", "rollout.num_generations=1", "teacher.log_ratio_clip=0",
                              "train.prompts_per_step=4"))
    assert [p.split(":")[0] for p in problems] == [
        "teacher.kl_coef = 0.0", "teacher.reward_weight = 1.0 with rollout.num_generations = 1", "teacher.log_ratio_clip = 0.0"]
    (problem,) = _problems(_cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={teacher_dir}", "teacher.reward_weight=0.5",
                                "rewards=[]"))
    assert problem.endswith("or teacher.reward_weight=0 to distil alone")
    (problem,) = _problems(_cfg(tmp_path, data_file, tiny_model_dir, "algorithm.name=grpo", "rewards=[]"))
    assert problem.startswith("rewards = []: at least one reward function is needed") and "distil" not in problem


def test_a_teacher_with_too_few_positions_is_refused(tmp_path, data_file, tiny_model_dir):
    # the student holds 128 positions; a teacher of 16 cannot hold prompt 16 + completion 8 = 24 (the plan's bound:
    # data.max_prompt_length, or the longest prompt kept once measured: "8+8=" is 4 characters, 4 + 8 = 12 fits)
    short = build_random_tiny(tmp_path / "short", seed=2, max_positions=10)
    (problem,) = _problems(_cfg(tmp_path, data_file, tiny_model_dir, f"teacher.path={short}"))
    assert problem.startswith(f"teacher.path = '{short}' holds max_position_embeddings = 10, less than the run's longest "
                              "sequence 12")


def _write_big_teacher(d):
    """config.json and a safetensors header of a 7B-shaped Qwen2 (hidden 3584, MLP 18944, 28 layers, 152064 tokens,
    4 KV heads of 128): 7,615,616,512 parameters, weights never written (the planner reads headers only)."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768}))
    shapes = {"model.embed_tokens.weight": [152064, 3584], "lm_head.weight": [152064, 3584], "model.norm.weight": [3584]}
    for layer in range(28):
        shapes.update({f"model.layers.{layer}.{name}": shape for name, shape in {
            "q.weight": [3584, 3584], "q.bias": [3584], "k.weight": [512, 3584], "k.bias": [512], "v.weight": [512, 3584],
            "v.bias": [512], "o.weight": [3584, 3584], "gate.weight": [18944, 3584], "up.weight": [18944, 3584],
            "down.weight": [3584, 18944], "norm1.weight": [3584], "norm2.weight": [3584]}.items()})
    header, offset = {}, 0
    for name, shape in shapes.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * math.prod(shape)]}
        offset += 2 * math.prod(shape)
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return d


def test_a_teacher_too_large_for_the_gpu_plan_is_refused_before_loading(tmp_path, monkeypatch):
    """The Qwen2.5-0.5B-shaped student of tests/test_plan.py on a 32 GiB GPU (34,359,738,368 B): vLLM's share with its
    10% is 3,324,965,811.2 B (tests/test_plan.py, the start-up sampler pass counted), 0.0968 of the GPU → 0.10
    (3,435,973,837 B); the trainer's peak 23,240,068,864 (tests/test_plan.py) + that + the CUDA context 536,870,912 =
    27,212,913,613 (25.34 GiB): fits. A 7B teacher adds 7,615,616,512 × 2 B = 15,231,233,024 B (14.19 GiB, bfloat16:
    teacher.dtype auto = model.dtype) to the peak: 38,471,301,888 (35.83 GiB), needed 42,444,146,637 (39.53 GiB) > 32 GiB:
    refused, a smaller teacher among the fixes; a row of its own in the printout."""
    without_tokenizer_check(monkeypatch)
    monkeypatch.setattr("cohort.plan.teacher_checks.tokenizer_file_problems", lambda path, key="model.path": [])
    student, teacher = write_qwen05_dir(tmp_path / "qwen05"), _write_big_teacher(tmp_path / "big")
    assert model_facts(str(teacher)).num_params == 7_615_616_512
    _fake_gpu(monkeypatch, 32)
    validate_config(load_config(None, [f"model.path={student}", *QWEN05]))  # the student alone fits
    cfg = load_config(None, [f"model.path={student}", *QWEN05, "algorithm.name=distill", f"teacher.path={teacher}"])
    rows = {name: size for name, size, _ in memory_estimate(cfg, batch_plan(cfg), model_facts(str(student)))}
    assert rows["teacher model"] == 15_231_233_024
    (problem,) = _problems(cfg)
    assert problem.startswith("the trainer's peak 35.83 GiB + vLLM's engine.gpu_memory_utilization = 0.1 (derived): 3.20 GiB")
    assert "need 39.53 GiB in the update, more than the GPU's 32.00 GiB" in problem, problem
    assert problem.endswith("; a smaller teacher")  # (already bfloat16: no dtype to halve)
    printed = format_plan(cfg, batch_plan(cfg))
    assert f"teacher model         {teacher} (bfloat16); advantage per token = 1 × (log π_teacher − log π_student)" in printed
    assert "teacher model          14.19 GiB   7,615,616,512 parameters × 2 B (bfloat16, teacher.dtype), frozen" in printed


def test_a_hub_teacher_is_compared_from_its_snapshot_without_weights(tmp_path, data_file, tiny_model_dir, teacher_dir,
                                                                    tiny_chat_model_dir, place_in_hub):
    # the Hub teachers as a download leaves them in the cache (offline): the same tokenizer passes, another is refused
    # by validation from the tokenizer files, before any weights are fetched
    place_in_hub("org/teacher", teacher_dir)
    place_in_hub("org/chat-teacher", tiny_chat_model_dir)
    validate_config(_cfg(tmp_path, data_file, tiny_model_dir, "teacher.path=org/teacher"))
    (problem,) = _problems(_cfg(tmp_path, data_file, tiny_model_dir, "teacher.path=org/chat-teacher"))
    assert "teacher.path = 'org/chat-teacher' and model.path" in problem and "do not share a tokenizer" in problem
