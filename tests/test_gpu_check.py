"""bench/gpu_check.py cannot waste a lent GPU's run: each part's JSON is on disk as soon as the part ends, and a part
that raises is recorded while the next one still runs (before, the JSON was written once at the end, so a part dying
after a minute, as the 0.5B part did on transformers 5.17, left nothing)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_part_is_written_as_it_ends_and_a_failing_part_does_not_stop_the_next(tmp_path):
    gpu_check = _gpu_check()
    seen_on_disk = []

    def fails():
        raise TypeError("ContinuousBatchingConfig.__init__() got an unexpected keyword argument 'page_size'")

    def second():
        seen_on_disk.append(sorted(p.name for p in tmp_path.iterdir()))  # what a killed run would have left
        return {"steps": 2}

    doc = gpu_check.run_parts({"big": fails, "demo": second}, tmp_path, {"device": "cpu"})
    assert seen_on_disk == [["big.json", "summary.json"]]
    big = json.loads((tmp_path / "big.json").read_text())
    assert big["error"].startswith("TypeError: ContinuousBatchingConfig") and "Traceback" in big["traceback"]
    assert json.loads((tmp_path / "demo.json").read_text())["steps"] == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"device", "big", "demo"} and doc["demo"]["steps"] == 2


def test_the_allocator_peak_is_kept_per_phase():
    # A fake allocator: `read` returns the peak since the last reset; each phase's entry and exit ends a window. The
    # trace, by hand: before "generate" opens, 100 -> outside; generate's window 700 -> generate; between the phases 20
    # -> outside; "update" encloses a nested "logprob": update's first window 300 -> update, logprob's 900 -> logprob,
    # the rest of update's 500 -> update (max 500); after it, the final mark's 50 -> outside (max(100, 20, 50) = 100).
    gpu_check = _gpu_check()
    windows = iter([100, 700, 20, 300, 900, 500, 50])
    resets = []
    phases = gpu_check.PhasePeaks(lambda: next(windows), lambda: resets.append(1))
    with phases("generate"):
        pass
    with phases("update"):
        with phases("logprob"):
            pass
    phases.mark()
    assert phases.peaks == {"outside": 100, "generate": 700, "update": 500, "logprob": 900}
    assert len(resets) == 7 and set(phases.pop()) == {"timing/generate_s", "timing/update_s", "timing/logprob_s"}


def test_the_update_profile_is_summed_by_category_with_its_host_reads():
    # Four ops by hand (microseconds): a gemm kernel 3,000 and aten::mm 1,000 -> matmul 4 ms; AdamW's foreach kernel
    # 2,500 -> optimizer 2.5 ms; a sync 500 -> other 0.5 ms. Total 7 ms; the sync is counted as a host read.
    from types import SimpleNamespace as Event

    events = [Event(key="sm90_xmma_gemm_bf16", count=48, self_device_time_total=3000.0, self_cpu_time_total=0.0),
              Event(key="aten::mm", count=48, self_device_time_total=1000.0, self_cpu_time_total=900.0),
              Event(key="multi_tensor_apply_kernel<AdamW>", count=1, self_device_time_total=2500.0, self_cpu_time_total=0.0),
              Event(key="cudaStreamSynchronize", count=3, self_device_time_total=500.0, self_cpu_time_total=20.0)]
    out = _gpu_check().profile_summary(events, on_device=True, top=2)
    assert out["total_ms"] == 7.0 and out["by_category_ms"] == {"matmul": 4.0, "optimizer": 2.5, "other": 0.5}
    assert [op["name"] for op in out["top_ops"]] == ["sm90_xmma_gemm_bf16", "multi_tensor_apply_kernel<AdamW>"]
    assert out["host_syncs"] == {"cudaStreamSynchronize": 3}
    assert _gpu_check().profile_summary(events, on_device=False)["total_ms"] == pytest.approx(0.92)  # 900 + 20 us


def test_what_was_live_at_the_allocator_peak_is_grouped_by_where_it_was_allocated():
    # By hand: a (100, from cohort's trainer), b (50, backward: no Python frame), a freed, c (200, AdamW under the
    # trainer) -> live 250, the peak; d (10) after it is not in the peak's set. Peak 250 = c 200 + b 50.
    def frame(path, line):
        return {"filename": f"/x/site-packages/{path}", "line": line, "name": "f"}

    trace = [{"action": "alloc", "addr": 1, "size": 100, "frames": [frame("cohort/trainer/trainer.py", 9)]},
             {"action": "alloc", "addr": 2, "size": 50, "frames": []},
             {"action": "free_requested", "addr": 1, "size": 100, "frames": []},
             {"action": "alloc", "addr": 3, "size": 200, "frames": [frame("torch/optim/adamw.py", 5),
                                                                    frame("cohort/trainer/trainer.py", 7)]},
             {"action": "free_requested", "addr": 3, "size": 200, "frames": []},
             {"action": "alloc", "addr": 4, "size": 10, "frames": []}]
    out = _gpu_check().live_at_peak(trace)
    assert out["peak_bytes"] == 250 and out["live_allocations"] == 2
    assert out["by_site_bytes"] == {"torch/optim/adamw.py:5 <- cohort/trainer/trainer.py:7": 200,
                                    "no Python frame (backward)": 50}


def test_the_planner_per_phase():
    # Rows (bytes): weights 4, gradients 4, AdamW 8, activations 10 -> update 26 + engine copy 2 = 28; resident 4 + 4
    # + 8 + 2 = 18; generation 18 + KV 5 + logits 3 = 26.
    rows = [("weights", 4, ""), ("gradients", 4, ""), ("AdamW moments", 8, ""), ("activations", 10, "")]
    assert _gpu_check().phase_estimates(rows, 2, 5, 3) == {"update": 28, "generate": 26, "resident": 18}
