#!/usr/bin/env bash
# cohort's s/step against TRL's on one lent GPU, in one call of at most 8 minutes (issue 47, item 4).
#
# The workload of the prepared check's big part (bench/gpu_check.py): a random Qwen2 of Qwen2.5-0.5B's shape with the
# character tokenizer, 8 prompts x 8 completions of up to 256 tokens a step, learning rate 2e-4, bf16 autocast over
# float32 weights (cohort's `train.precision=mixed`, TRL's default bf16=True), generation with transformers on the GPU
# (no vLLM on the lent machines): cohort's continuous-batching engine where it runs (the check's JSON names the
# engine), TRL's `generate`. Both sides build the same model (seed 0) in the same process order; everything else is
# each trainer's default (TRL: gradient checkpointing on, one micro-batch of 64; cohort: micro-batch 8). Not the same
# reward: cohort's check scores a hash of the characters (a spread in every group), TRL's bench the addition answer (0
# for a random model: zero advantages, but TRL still runs the whole forward/backward), so the step's work is the same
# shape and the losses are not comparable. The first step of each side is left out of its s/step.
#
# Needs beside the checkout (carry them): .whl (make gpu-check-wheels) and .gpu-carry/trl-wheels (make gpu-trl-wheels,
# 1.7 MB: TRL and the packages the lent image lacks). No GGUF, no network. The call:
#   run(command="bench/gpu_trl_speed.sh", carry=[".whl", ".gpu-carry/trl-wheels"], timeout_s=540)
# Output under $OUT/speed (or runs/gpu-speed): cohort/big.json (the check's JSON), cohort.log, trl.json (bench/
# trl_grpo_step.py's JSON), trl_metrics.jsonl, trl.log, summary.json (both s/step and their phases side by side).
# cohort's side is the prepared check's big part itself (its profiled update step and peaks per phase included:
# docs/gpu.md, "Issue 47"), so this one call measures all of issue 47 on a lent GPU.
# Time: cohort 6 steps ~10 s each plus building the model (~20 s) and the profiled step, TRL the same; each side is
# cut at its timeout (COHORT_TIMEOUT_S 220, TRL_TIMEOUT_S 200), so the call ends within 8 minutes of the install.
# (Both s/step leave out the first step; cohort's is the mean of the rest, TRL's the median.)
# On a CPU (a smoke check of the script only): SPEED_DEVICE=cpu SPEED_SHAPE=small SPEED_TOKENS=16 SPEED_STEPS=2.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:+$OUT/speed}
out=${out:-runs/gpu-speed}
device=${SPEED_DEVICE:-auto}
shape=${SPEED_SHAPE:-0.5b}
tokens=${SPEED_TOKENS:-256}
steps=${SPEED_STEPS:-6}
mkdir -p "$out"
if ls .whl/*.whl .gpu-carry/trl-wheels/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl .gpu-carry/trl-wheels/*.whl || exit 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
start=$(date +%s)
timeout "${COHORT_TIMEOUT_S:-220}" python3 bench/gpu_check.py --device "$device" --skip demo --shape "$shape" \
    --big-steps "$steps" --big-tokens "$tokens" --big-budget-s 150 --out-dir "$out/cohort" > "$out/cohort.log" 2>&1
echo "cohort: rc $?, $(( $(date +%s) - start )) s" >&2
start=$(date +%s)
model=/tmp/gpu-speed-qwen2-$shape
python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'bench'); import gpu_check
gpu_check.build_random_qwen2(Path(sys.argv[1]), sys.argv[2], max_positions=int(sys.argv[3]) + 64)" "$model" "$shape" "$tokens" \
    >> "$out/trl.log" 2>&1 || exit 2
rm -f "$out/trl_metrics.jsonl"
timeout "${TRL_TIMEOUT_S:-200}" python3 bench/trl_grpo_step.py --device "$([ "$device" = cpu ] && echo cpu || echo auto)" --bf16 \
    --model-dir "$model" --prompts-per-step 8 --num-generations 8 --max-completion-length "$tokens" --learning-rate 2e-4 \
    --steps "$steps" --metrics-file "$out/trl_metrics.jsonl" > "$out/trl.json" 2>> "$out/trl.log"
echo "TRL: rc $?, $(( $(date +%s) - start )) s" >&2
python3 - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
summary = {}
try:
    big = json.loads((out / "cohort" / "big.json").read_text())
    summary["cohort"] = {k: big.get(k) for k in ("s_per_step", "generate_s_per_step", "update_s_per_step", "update_mfu",
                                                 "steps", "engine_choice", "error")}
except (OSError, ValueError) as e:
    summary["cohort"] = {"error": repr(e)}
try:
    steps = [json.loads(line) for line in (out / "trl_metrics.jsonl").read_text().splitlines()]
    steady = steps[1:] or steps
    summary["trl"] = {"steps": len(steps), **{k.removeprefix("timing/").replace("_s", "_s_per_step")
                                              if k != "timing/step_s" else "s_per_step": statistics.median(s[k] for s in steady)
                                              for k in ("timing/step_s", "timing/generate_s", "timing/update_s")}}
except (OSError, ValueError) as e:
    summary["trl"] = {"error": repr(e)}
if summary["cohort"].get("s_per_step") and summary["trl"].get("s_per_step"):
    summary["trl_over_cohort_s_per_step"] = summary["trl"]["s_per_step"] / summary["cohort"]["s_per_step"]
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
PY
