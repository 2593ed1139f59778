"""Shared pieces of the benchmarks: the workloads, the idle check, peak memory, JSON output.

Every benchmark prints one JSON object on stdout. Each records the 1-minute load
average before and after the timed part and, because a benchmark's own threads
raise that average too, the CPU that *other* processes used meanwhile
(`foreign_cores`: the machine's busy time from /proc/stat minus this process
tree's, per wall second). `"idle": false` when that reached `FOREIGN_MAX_CORES`
(timings on a busy 2-core machine are not comparable; the run is to be repeated,
not reported). Peak RSS is the process's high-water mark
(`ru_maxrss`), so a benchmark that compares memory runs each variant in a fresh
process.

This file must import with only torch, transformers and tokenizers installed:
the TRL side-by-side (bench/trl_grpo_step.py) runs it from TRL's own virtual
environment, where cohort's dependencies (vLLM, pydantic, ...) may be missing.
It therefore adds the repository to `sys.path` and imports from cohort only the
dependency-free character tokenizer.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
CACHE = BENCH_DIR / ".cache"
IDLE_LOAD = 0.5
FOREIGN_MAX_CORES = 0.2  # other processes' average CPU use during a measurement above which it is not idle

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Plumbing only, for both sides: nothing here changes how fast either tool runs. vLLM's logs go to stderr (stdout
# carries only the JSON); no model hub lookups (this machine has none to reach; every model is a local directory).
# Deliberately NOT set here: OMP_WAIT_POLICY, GOMP_SPINCOUNT, OMP_NUM_THREADS, TOKENIZERS_PARALLELISM: a TRL user sets
# none of them, and cohort's side gets exactly what its CLI sets (`cohort_cli_environment`). Setting PASSIVE here for
# both sides is what made the withdrawn 1.56-2.63x of docs/performance.md (it roughly halves TRL's speed).
for _key, _value in (("VLLM_LOGGING_STREAM", "ext://sys.stderr"), ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")):
    os.environ.setdefault(_key, _value)


def cohort_cli_environment() -> None:
    """The environment `cohort train` runs in: whatever cohort/cli.py sets at import (today VLLM_ENABLE_V1_MULTIPROCESSING=0,
    TOKENIZERS_PARALLELISM=false, OMP_WAIT_POLICY=PASSIVE, each only when unset; never a Hugging Face variable). Call before torch loads
    (the OpenMP runtime reads its variables once, when it loads). Scripts that drive cohort's Trainer in-process call this
    so they measure what the CLI would run; a variable given in the environment still wins, as it does for the CLI."""
    import cohort.cli  # noqa: F401  (its import sets the defaults; it imports no torch)


# --------------------------------------------------------------------------- environment


def set_threads(n: int) -> None:
    """Pin PyTorch to `n` threads (call before the first torch op)."""
    import torch

    torch.set_num_threads(n)
    os.environ.setdefault("OMP_NUM_THREADS", str(n))


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, all its threads, not its children) process `pid` has used; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ..., utime at index 11
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Live descendant processes of `pid` (children of every thread, recursively)."""
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            frontier += children
    return found


def affinity_cores(pid: int) -> int:
    """CPUs in the union of the affinity masks of `pid`'s threads (an engine child binds its OpenMP threads to its cores;
    an unbound process may use every core). 0 once it is gone."""
    cores: set[int] = set()
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return 0
    for tid in tids:
        try:
            cores |= os.sched_getaffinity(tid)
        except OSError:
            continue
    return len(cores)


def bound_cores(pid: int) -> int:
    """CPUs the process's compute threads may use: the list in its VLLM_CPU_OMP_THREADS_BIND ("1", "0-1", "0,2") when
    it has one (a local_server engine child binds its OpenMP threads there; its HTTP and Python threads keep the whole
    mask but do no compute), else `affinity_cores`."""
    try:
        environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    except OSError:
        return affinity_cores(pid)
    cores: set[int] = set()
    for part in environ.get("VLLM_CPU_OMP_THREADS_BIND", "").split(","):
        low, _, high = part.partition("-")
        if low.strip().isdigit() and (not high or high.strip().isdigit()):
            cores |= set(range(int(low), int(high or low) + 1))
    return len(cores) or affinity_cores(pid)


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def peak_rss_mib() -> float:
    """High-water resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_child_rss_mib() -> float:
    """High-water resident memory of the largest finished child (a local rollout server, once stopped)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def machine_busy_s() -> float:
    """CPU seconds all processes have used since boot (every core; /proc/stat's first line, idle and iowait left out)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def tree_busy_s(root: int | None = None) -> float:
    """CPU seconds used by process `root` (default: this one), its live descendants and the children they reaped."""
    parent, used = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ..., utime at index 11
        parent[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    tree, frontier = set(), [root or os.getpid()]
    while frontier:
        pid = frontier.pop()
        tree.add(pid)
        frontier += [child for child, ppid in parent.items() if ppid == pid and child not in tree]
    return sum(used.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


class LoadWatch:
    """How busy the machine was around a measurement: `with LoadWatch() as load: ...; load.record()`.

    The 1-minute load average counts this benchmark's own threads, so it cannot
    tell a clean run from a contended one; the CPU other processes used
    meanwhile (`foreign_cores`) can.
    """

    def __enter__(self):
        self.before = load_average()
        self.start = time.time()
        self.machine0, self.tree0 = machine_busy_s(), tree_busy_s()
        return self

    def __exit__(self, *exc):
        self.after = load_average()
        self.wall_s = time.time() - self.start
        self.machine1, self.tree1 = machine_busy_s(), tree_busy_s()
        return False

    def record(self) -> dict:
        foreign = max(0.0, (self.machine1 - self.machine0) - (self.tree1 - self.tree0)) / max(self.wall_s, 1e-9)
        return {"load_before": self.before, "load_after": self.after, "foreign_cores": round(foreign, 3),
                "idle": foreign < FOREIGN_MAX_CORES}


def emit(result: dict) -> None:
    """Print the benchmark's one JSON object (and nothing else on stdout)."""
    sys.stdout.write(json.dumps(result, sort_keys=False) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- workloads

TINY_MODEL = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=512, tie_word_embeddings=True)


def build_model(out_dir: Path, *, hidden_size: int = 128, num_hidden_layers: int = 4, num_attention_heads: int = 4,
                num_key_value_heads: int = 2, intermediate_size: int = 512, vocab_size: int | None = None,
                tie_word_embeddings: bool = True, max_positions: int = 512, seed: int = 0) -> Path:
    """A randomly initialised Qwen2 with the character tokenizer, saved as a transformers checkpoint.

    Built once per configuration and cached under bench/.cache. transformers'
    default initialisation (std 0.02) gives near-uniform next-token
    probabilities, so the end-of-text token (1 of 259) arrives at a random,
    roughly geometric position: long-tailed completion lengths, many of them
    cut at the length limit. A larger vocabulary than the tokenizer's (the
    large-vocab benchmark) only adds never-sampled rows.
    """
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "model.safetensors").is_file():
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from cohort.models.char_tokenizer import EOS_TOKEN_ID, VOCAB_SIZE, save_char_tokenizer

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size or VOCAB_SIZE, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, max_position_embeddings=max_positions,
                         tie_word_embeddings=tie_word_embeddings, eos_token_id=EOS_TOKEN_ID, pad_token_id=EOS_TOKEN_ID,
                         bos_token_id=None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(str(tmp), safe_serialization=True)
    save_char_tokenizer(tmp, model_max_length=max_positions)
    tmp.rename(out_dir)
    return out_dir


MODEL_31M = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                 intermediate_size=2048, tie_word_embeddings=True)  # 31.5M parameters besides the 0.13M embedding


def model_31m_dir() -> Path:
    """The 31.5M-parameter Qwen2 of issue 13 (hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 2048, tied)."""
    return build_model(CACHE / "qwen2-h512-l8", **MODEL_31M)


MODEL_6M = dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=1024, tie_word_embeddings=True)  # 5.9M parameters: between tiny and 31.5M


def model_6m_dir() -> Path:
    """A 5.9M-parameter Qwen2 (hidden 256, 6 layers, 4 heads, 2 KV heads, intermediate 1024, tied): where the thread
    count's crossover lies between the tiny model and the 31.5M one."""
    return build_model(CACHE / "qwen2-h256-l6", **MODEL_6M)


def tiny_model_dir() -> Path:
    """The tiny benchmark model of issue 2 (hidden 128, 4 layers, 4 heads, 2 KV heads, intermediate 512, tied)."""
    return build_model(CACHE / "tiny-qwen2-h128-l4", **TINY_MODEL)


def addition_rows(n: int = 64, seed: int = 0) -> list[dict]:
    """`n` distinct two-digit addition prompts like "23+45=" with their answers."""
    rng = random.Random(seed)
    seen, rows = set(), []
    while len(rows) < n:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return rows


def addition_file(n: int = 64) -> Path:
    path = CACHE / f"addition-{n}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in addition_rows(n)))
    return path


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def addition_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 for the exact answer as the leading number, else half the share of digit characters.

    Both trainers call this same function, so their reward work is equal. The
    partial credit gives a random model non-zero reward spread (an all-zero
    reward would make every advantage 0 and the update a no-op in effect).
    """
    out = []
    for text, gold in zip(completions, answer):
        stripped = text.strip()
        digits = ""
        for ch in stripped:
            if not ch.isdigit():
                break
            digits += ch
        if digits == gold:
            out.append(1.0)
        else:
            out.append(0.5 * sum(ch.isdigit() for ch in stripped) / max(1, len(stripped)))
    return out


def last_integer(text: str) -> str | None:
    """The last run of digits in `text` ("So 3 + 4 = 7." -> "7"), None without one."""
    digits, found = "", None
    for ch in text + " ":
        if ch.isdigit():
            digits += ch
        elif digits:
            found, digits = digits, ""
    return found


def _completion_text(completion) -> str:
    """A plain completion, or the last message's content of a chat one ([{"role": "assistant", "content": ...}])."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1].get("content") or "") if completion else ""


def last_integer_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the completion's last integer is the answer, else 0.0 (plain or chat completions; both trainers call it)."""
    return [float(last_integer(_completion_text(c)) == str(gold)) for c, gold in zip(completions, answer)]


def sum_question_rows(low: int = 1, high: int = 30, held_out: int = 200, seed: int = 1234) -> tuple[list[dict], list[dict]]:
    """Chat prompts "What is a + b?" for every a, b in low..high (900 for 1..30), shuffled with `seed`: (train, held-out),
    the first `held_out` rows held out. Each row: {"prompt": [{"role": "user", "content": ...}], "answer": "a+b"}."""
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)} for a, b in pairs]
    return rows[held_out:], rows[:held_out]
