"""The validation builds nothing, and the config / plan / validation layering holds in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

from cohort.config import load_config
from cohort.validation import validate_config


def test_validating_a_tiny_model_builds_nothing(monkeypatch, tmp_path):
    """`tiny:arith` is a name check only: no tiny model is built and no tokenizer is loaded, even with check_files."""

    def refuse(*args, **kwargs):
        raise AssertionError("validation must not build a model or load a tokenizer")

    monkeypatch.setattr("cohort.models.tiny.build_tiny_model", refuse)
    monkeypatch.setattr("cohort.models.loading.build_tiny_model", refuse, raising=False)
    monkeypatch.setattr("cohort.models.loading.load_tokenizer", refuse)
    monkeypatch.setenv("COHORT_CACHE", str(tmp_path / "cache"))  # an empty cache: a build would have to happen here
    cfg = load_config(None, ["model.path=tiny:arith", "data.max_prompt_length=null", f"run.output_dir={tmp_path / 'run'}"])
    plan = validate_config(cfg)
    # the demo preset: 32 prompts × G=8 = 256 completions per step; the prompts of a tiny model are not measured
    assert (plan.completions_per_step, plan.max_tokens_per_sequence) == (256, None)
    assert plan.prompt_tokens_from == "not measured (a tiny:* model's tokenizer is built with the model)"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def _cohort_modules_after(statement: str) -> dict:
    code = (f"import sys; {statement}; import json; "
            "print(json.dumps({'cohort': sorted(m for m in sys.modules if m.startswith('cohort')), 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_config_imports_nothing_of_cohort_and_no_torch():
    loaded = _cohort_modules_after("import cohort.config")
    assert loaded == {"cohort": ["cohort", "cohort.config"], "torch": False}


def test_plan_imports_only_the_config_and_validation_no_trainer():
    assert _cohort_modules_after("import cohort.plan") == {"cohort": ["cohort", "cohort.config", "cohort.plan"], "torch": False}
    loaded = _cohort_modules_after("import cohort.validation")["cohort"]
    assert "cohort.validation" in loaded and "cohort.plan" in loaded
    assert [m for m in loaded if m.startswith(("cohort.trainer", "cohort.rollout", "cohort.distributed"))] == []
