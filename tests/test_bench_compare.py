"""bench/compare.py's bookkeeping: what each side is run with, and the figures it derives (no benchmark runs here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402
import compare_table  # noqa: E402


def test_peer_gets_no_speed_setting_from_the_driver(monkeypatch):
    # `make` exports OMP_WAIT_POLICY=PASSIVE; TRL's default run must not inherit it (that made the withdrawn numbers)
    for name in compare.SPEED_VARS:  # the test process may hold others (VLLMEngine sets VLLM_CPU_KVCACHE_SPACE)
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    env, removed = compare.child_env(compare.VARIANTS["trl_default"])
    assert "OMP_WAIT_POLICY" not in env and "TOKENIZERS_PARALLELISM" not in env
    assert removed == ["OMP_WAIT_POLICY", "TOKENIZERS_PARALLELISM"]
    assert compare.child_env(compare.VARIANTS["trl_active"])[0]["OMP_WAIT_POLICY"] == "ACTIVE"
    # cohort's default gets no policy from the driver either: the CLI decides
    assert "OMP_WAIT_POLICY" not in compare.child_env(compare.VARIANTS["cohort_default"])[0]
    assert compare.child_env(compare.VARIANTS["cohort_omp_default"])[0]["OMP_WAIT_POLICY"] == "default"


def test_default_commands_carry_only_the_workload(tmp_path):
    tiny = compare.WORKLOADS["tiny"]
    trl = compare.command(compare.VARIANTS["trl_default"], tiny, tmp_path, 6, tmp_path)
    assert not {"--threads", "--no-gradient-checkpointing", "--vllm"} & set(trl)
    cohort = compare.command(compare.VARIANTS["cohort_default"], tiny, tmp_path, 6, tmp_path)
    assert cohort[1:4] == ["-m", "cohort.cli", "train"]
    fields = {arg.split("=", 1)[0] for arg in cohort[4:]}
    assert fields == {"model.path", "data.train_files", "rollout.num_generations", "rollout.max_completion_length",
                      "rollout.temperature", "algorithm.beta", "algorithm.loss_type", "train.prompts_per_step",
                      "train.learning_rate", "train.max_steps", "rewards", "run.output_dir"}
    whole = compare.command(compare.VARIANTS["cohort_whole_batch"], tiny, tmp_path, 6, tmp_path)
    assert "train.micro_batch_size=32" in whole  # {per_step} = 4 prompts × G=8


def test_summary_excludes_the_first_step_and_shares_phases():
    records = [{"timing/step_s": s, "timing/generate_s": g, "timing/sync_s": y, "timing/reward/fn_s": 9.0}
               for s, g, y in [(10.0, 9.0, 0.0), (1.0, 0.5, 0.2), (3.0, 1.5, 0.2), (2.0, 1.0, 0.0)]]
    out = compare.summarise(records, [])
    # steps 2..4: median(1, 3, 2) = 2; generate median(0.5, 1.5, 1.0) = 1.0 → share 0.5; sync median(0.2, 0.2, 0) = 0.2
    assert out["median_step_s"] == 2.0
    assert out["phases"]["generate"] == {"median_s": 1.0, "share": 0.5}
    assert out["phases"]["sync"]["median_s"] == pytest.approx(0.2)
    assert "reward/fn" not in out["phases"]  # per-function reward timings are not phases
    assert out["engine_idle_fraction_phase"] == pytest.approx(1 - (1.0 + 0.2) / 2.0)  # 0.4
    assert out["other_share"] == pytest.approx(1 - 1.2 / 2.0)


def test_cpu_figures_define_the_idle_fractions():
    first = {"t": 0.0, "lines": 1, "trainer": 1.0, "engine": 0.0, "machine": 10.0, "spinner": 0.0, "driver": 0.0,
             "trainer_cores": 2, "engine_cores": 1}
    # over 2 s: trainer +1.0 s CPU (0.5 cores), engine +1.5 (0.75), spinner +2.0 (1.0), driver +0.04 (0.02),
    # and 0.5 s (0.25 cores) by some other process → machine +5.04
    last = {"t": 2.0, "lines": 5, "trainer": 2.0, "engine": 1.5, "machine": 15.04, "spinner": 2.0, "driver": 0.04,
            "trainer_cores": 2, "engine_cores": 1}
    out = compare.cpu_figures([first, last])
    assert out["wall_per_step_s"] == pytest.approx(2.0 / 4)  # 4 steps between the first and the last line
    assert out["trainer_idle_fraction"] == pytest.approx(1 - 0.5 / 2)  # 0.75
    assert out["engine_idle_fraction"] == pytest.approx(1 - 0.75 / 1)  # 0.25
    assert out["spinner_cpu_cores"] == pytest.approx(1.0)
    assert out["foreign_cores"] == pytest.approx(0.25)  # the spinner and the driver are not foreign
    assert out["clean"] is False  # 0.25 ≥ 0.2
    colocate = compare.cpu_figures([first | {"engine_cores": 0}, last | {"engine_cores": 0, "engine": 0.0, "machine": 13.54}])
    assert colocate["engine_idle_fraction"] is None and colocate["foreign_cores"] == pytest.approx(0.25)


def test_ranking_uses_trl_default_under_the_same_load():
    def run(workload, load, variant, s, side="cohort"):
        return {"workload": workload, "load": load, "variant": variant, "median_step_s": s, "side": side, "candidate": True}

    doc = {"runs": [run("tiny", "idle", "trl_default", 0.2, "trl"), run("tiny", "idle", "cohort_default", 0.1),
                    run("long128", "idle", "trl_default", 1.0, "trl"), run("long128", "idle", "cohort_default", 2.0),
                    run("tiny", "busy", "trl_default", 0.8, "trl"), run("tiny", "busy", "cohort_default", 0.2)]}
    runs = compare_table.index(doc)
    assert compare_table.speedups(runs, "cohort_default", "idle") == {"tiny": 2.0, "long128": 0.5}
    assert compare_table.speedups(runs, "cohort_default", "busy") == {"tiny": 4.0}
    assert compare_table.geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    table = compare_table.markdown_tables(doc)
    # busy/idle slowdown on tiny: 0.2 / 0.1 = 2; tiny's target (≥ 1.0×) met idle, long128's (≥ 1.5×) not
    assert "| cohort_default | 2 / 4 | 0.5 / – | – / – | – / – | 1 | 4 | 2 | tiny |" in table
