"""The validation builds nothing, and the config / plan / validation layering holds in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from tests.test_plan import QWEN05, without_tokenizer_check, write_qwen05_dir
from cohort.plan import validate as validation
from cohort.plan.validate import check_gpu_settings, validate_config


def test_validating_a_tiny_model_builds_nothing(monkeypatch, tmp_path):
    """`tiny:arith` is a name check only: no tiny model is built and no tokenizer is loaded, even with check_files."""

    def refuse(*args, **kwargs):
        raise AssertionError("validation must not build a model or load a tokenizer")

    monkeypatch.setattr("cohort.models.tiny.build_tiny_model", refuse)
    monkeypatch.setattr("cohort.models.pretrained.build_tiny_model", refuse, raising=False)
    monkeypatch.setattr("cohort.models.pretrained.load_tokenizer", refuse)
    monkeypatch.setenv("COHORT_CACHE", str(tmp_path / "cache"))  # an empty cache: a build would have to happen here
    cfg = load_config(None, ["model.path=tiny:arith", "data.max_prompt_length=null", f"run.output_dir={tmp_path / 'run'}"])
    plan = validate_config(cfg).batch
    # the demo preset: 64 prompts × G=8 = 512 completions per step; the prompts of a tiny model are not measured
    assert (plan.completions_per_step, plan.max_tokens_per_sequence) == (512, None)
    assert plan.prompt_tokens_from == "not measured (a tiny:* model's tokenizer is built with the model)"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def _cohort_modules_after(statement: str) -> dict:
    code = (f"import sys; {statement}; import json; "
            "print(json.dumps({'cohort': sorted(m for m in sys.modules if m.startswith('cohort')), 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


MAPPING = ["cohort.mapping", "cohort.mapping.hints", "cohort.mapping.open_r1_rules", "cohort.mapping.rules",
           "cohort.mapping.trl_batch", "cohort.mapping.trl_rules", "cohort.mapping.verl_algorithms", "cohort.mapping.verl_rules"]  # verl's and TRL's option tables (pure data), for the loader's foreign-key hints


CONFIG = ["cohort.config", "cohort.config.admission", "cohort.config.demo", "cohort.config.fields", "cohort.config.references",
          "cohort.config.renames", "cohort.config.resolve", "cohort.config.schema"]


def test_the_config_package_imports_only_the_mapping_tables_of_cohort_and_no_torch():
    # the bottom layer: what data/, models/, rewards/ and rollout/ import for their typed sections
    assert _cohort_modules_after("import cohort.config") == {"cohort": ["cohort", *CONFIG, *MAPPING], "torch": False}


@pytest.mark.slow
def test_the_plan_imports_only_the_config_and_the_checks_no_trainer():
    plan = ["cohort", "cohort.algorithm_facts", *CONFIG, *MAPPING, "cohort.plan", "cohort.plan.batch", "cohort.plan.run_mode"]
    assert _cohort_modules_after("import cohort.plan.batch") == {"cohort": sorted(plan), "torch": False}  # (facts, the run's mode: pure)
    # the printout adds the memory estimate (the Hub's safetensors headers: huggingface_hub) and the machine's memory
    # beside it (/proc/meminfo), still no torch
    assert _cohort_modules_after("import cohort.plan.printout") == {
        "cohort": sorted([*plan, "cohort.models", "cohort.models.host_memory", "cohort.models.hub", "cohort.plan.machine_fit",
                          "cohort.plan.memory", "cohort.plan.printout"]), "torch": False}
    loaded = _cohort_modules_after("import cohort.plan.validate")["cohort"]
    assert "cohort.plan.validate" in loaded and "cohort.plan.batch" in loaded
    assert [m for m in loaded if m.startswith(("cohort.trainer", "cohort.rollout", "cohort.distributed"))] == []


# --------------------------------------------------------------------------- GPUs


def _problems(overrides, device_type="cpu", visible=0):
    return check_gpu_settings(load_config(None, overrides), device_type, visible)


def test_sleep_mode_is_refused_where_it_cannot_work_with_the_fix():
    (cpu,) = _problems(["engine.sleep_mode=1"])
    assert "engine.sleep_mode = 1: vLLM's sleep mode needs CUDA" in cpu and "set engine.sleep_mode=0" in cpu
    assert _problems(["engine.sleep_mode=2"], "cuda", 1) == []  # colocated vLLM on a GPU: served
    (hf,) = _problems(["engine.sleep_mode=2", "engine.name=hf"], "cuda", 1)
    assert "engine.name = hf has no sleep mode" in hf
    (child,) = _problems(["engine.sleep_mode=2", "engine.mode=local_server"], "cuda", 2)
    assert "not in the trainer's process" in child
    (busy,) = _problems(["engine.sleep_mode=2", "pipeline.max_staleness=1"], "cuda", 1)
    assert "generates while the trainer updates" in busy


def test_tensor_parallel_needs_its_own_process_and_enough_gpus():
    (colocated,) = _problems(["engine.tensor_parallel_size=2"], "cuda", 4)
    assert "needs vLLM in its own process(es): set engine.mode=local_server" in colocated
    assert _problems(["engine.tensor_parallel_size=2", "engine.mode=local_server"], "cuda", 4) == []
    (few,) = _problems(["engine.tensor_parallel_size=4", "engine.mode=local_server"], "cuda", 2)
    assert "this process sees 2 GPU(s); use at most 2" in few
    assert "must be at least 1" in _problems(["engine.tensor_parallel_size=0"])[0]


def test_gpu_memory_utilization_is_unset_by_default_and_checked_when_set():
    assert load_config(None, []).engine.gpu_memory_utilization is None
    (bad,) = _problems(["engine.gpu_memory_utilization=1.5"])
    assert "must be in (0, 1]" in bad and "unset (null) for the planner's value" in bad


def _fake_gpu(monkeypatch, total_gib):
    """validate_config on a machine whose training device is a GPU of `total_gib`: the two CUDA reads replaced."""

    monkeypatch.setattr(validation, "resolve_device", lambda setting="auto": torch.device("cuda", 0))
    monkeypatch.setattr(validation.torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"total_memory": int(total_gib * 2**30)})())


def test_validation_derives_the_fraction_on_a_gpu_and_refuses_what_cannot_fit(monkeypatch, tmp_path):
    """The Qwen2.5-0.5B-shaped config of tests/test_plan.py: 0.04 of an 80 GiB GPU is written into the plan's config
    (the caller's stays unset); on a
    24 GiB GPU the trainer's 21.64 GiB peak + vLLM's 3.12 GiB (0.13) + the context need 25.26 GiB and do not fit, and the
    refusal says so before loading; asleep during the update they need 22.14 GiB and fit (the derivations are in
    tests/test_plan.py::test_gpu_plan_with_sleep_mode_offload_and_the_refusal)."""
    model_dir = write_qwen05_dir(tmp_path / "qwen05")
    without_tokenizer_check(monkeypatch)
    _fake_gpu(monkeypatch, 80)
    cfg = load_config(None, [f"model.path={model_dir}", *QWEN05])
    assert validate_config(cfg).config.engine.gpu_memory_utilization == 0.04
    assert cfg.engine.gpu_memory_utilization is None  # (validation never writes into the config it is given)
    _fake_gpu(monkeypatch, 24)
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(None, [f"model.path={model_dir}", *QWEN05]))
    assert "the trainer's peak 21.64 GiB" in str(err.value) and "more than the GPU's 24.00 GiB" in str(err.value)
    cfg = load_config(None, [f"model.path={model_dir}", *QWEN05, "engine.sleep_mode=2"])
    assert validate_config(cfg).config.engine.gpu_memory_utilization == 0.13  # asleep during the update: fits


def test_colocated_vllm_and_a_trainer_on_another_gpu_are_refused():
    # vLLM in the trainer's process sits on cuda:0; a trainer on cuda:1 of the same process would not share its GPU
    gpu1, gpu0 = torch.device("cuda", 1), torch.device("cuda", 0)
    problems = validation.check_colocated_gpu(load_config(None, ["train.device=cuda:1"]), gpu1)
    assert len(problems) == 1 and "CUDA_VISIBLE_DEVICES=1" in problems[0] and "engine.mode=local_server" in problems[0]
    assert validation.check_colocated_gpu(load_config(None, ["train.device=cuda:1", "engine.mode=local_server"]), gpu1) == []
    assert validation.check_colocated_gpu(load_config(None, ["train.device=cuda:1", "engine.name=hf"]), gpu1) == []
    assert validation.check_colocated_gpu(load_config(None, []), gpu0) == []
