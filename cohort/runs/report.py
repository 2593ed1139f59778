"""`cohort report RUN_DIR` and `cohort compare RUN_A RUN_B ...`: PNG plots and one self-contained HTML page.

Reads only what a run writes (metrics.jsonl, eval.jsonl, completions.jsonl,
warnings.jsonl, config.yaml, summary.json), so it works on a finished run, a
stopped one, or one still training. Each plot is skipped when its metrics were
never logged (no `kl` when algorithm.beta = 0). The HTML embeds the plots as
base64 PNGs, the config and sample completions per logged step, so the single
file can be mailed or attached to an issue.

Every smoothed curve (the reward's, each comparison's) uses one rule, `smoothing_window`: a moving mean over a twentieth of the points
(at least 1), so a 300-step run is smoothed over 15 steps and a 20-step run not at all. `plot_reward` is also the
reward_curve.png a run draws when it ends (cohort/trainer/run.py). The files are read by cohort.runs.jsonl (a torn
last line skipped with a warning, a bad line before it an error naming it).

Left out: interactive plots (no JavaScript; TensorBoard and wandb do that).
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from cohort.runs.answer_stats import eval_line
from cohort.runs.jsonl import read_jsonl

PHASE_KEY = re.compile(r"^timing/([a-z_]+)_s$")
REWARD_FN_KEY = re.compile(r"^rewards/(.+)/mean$")
CLIP_KEYS = ("clip_ratio/low", "clip_ratio/high", "clip_ratio/region", "clip_ratio/dual")
MAX_SAMPLE_STEPS = 40


@dataclass
class RunRecords:
    path: Path
    metrics: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    completions: list[dict] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)
    config_text: str = ""
    summary: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name or str(self.path)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) where `key` was logged as a finite number."""
        steps, values = [], []
        for record in self.metrics:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps.append(int(record["step"]))
                values.append(float(value))
        return steps, values

    def keys(self) -> set[str]:
        return {k for record in self.metrics for k in record}


def load_run(run_dir: str | Path) -> RunRecords:
    path = Path(run_dir)
    if not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl; give a run directory written by `cohort train`")
    summary_path = path / "summary.json"
    return RunRecords(
        path=path, metrics=read_jsonl(path / "metrics.jsonl"), evals=read_jsonl(path / "eval.jsonl"),
        completions=read_jsonl(path / "completions.jsonl"), warnings=read_jsonl(path / "warnings.jsonl"),
        config_text=(path / "config.yaml").read_text() if (path / "config.yaml").is_file() else "",
        summary=json.loads(summary_path.read_text()) if summary_path.is_file() else {},
    )


def smoothing_window(points: int) -> int:
    """How many points every curve's moving mean spans: a twentieth of them, at least 1 (module docstring)."""
    return max(1, points // 20)


def moving_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


# --------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
                         "font.size": 10, "legend.fontsize": 9, "legend.frameon": False})
    return plt


def _legend_below(ax, extra_axes=()) -> None:
    """One legend under the axes (never on top of the curves), gathering the lines of twin axes too."""
    handles, labels = ax.get_legend_handles_labels()
    for other in extra_axes:
        h, lab = other.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    if handles:
        ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(4, len(handles)))


def _finish(fig, ax_list, title: str, path: Path) -> Path:
    for ax in ax_list:
        ax.set_xlabel("optimizer step")
    fig.suptitle(title, fontsize=12, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_reward(run: RunRecords, out: Path, *, file_name: str = "reward.png", title: str = "Reward") -> Path | None:
    """The reward curve (each generation batch and its moving mean) and, when logged, one per reward function, as
    out/file_name; None when no reward was logged."""
    steps, values = run.series("reward")
    if not steps:
        return None
    plt = _pyplot()
    functions = sorted(k for k in run.keys() if REWARD_FN_KEY.match(k))
    fig, axes = plt.subplots(1, 2 if functions else 1, figsize=(11 if functions else 8, 4), squeeze=False)
    ax = axes[0][0]
    window = smoothing_window(len(values))
    ax.plot(steps, values, color="tab:blue", alpha=0.3, lw=1, label="each generation batch")
    ax.plot(steps, moving_mean(values, window), color="tab:blue", lw=2, label=f"moving mean of {window}")
    ax.set_title("total reward (weighted sum)", fontsize=10)
    ax.set_ylabel("mean reward")
    _legend_below(ax)
    if functions:
        right = axes[0][1]
        for key in functions:
            s, v = run.series(key)
            right.plot(s, moving_mean(v, window), lw=1.5, label=REWARD_FN_KEY.match(key).group(1))
        right.set_title(f"per reward function (unweighted, moving mean of {window})", fontsize=10)
        _legend_below(right)
    return _finish(fig, list(axes[0]), title, out / file_name)


def plot_accuracy(run: RunRecords, out: Path) -> Path | None:
    points = [(int(r["step"]), float(r["accuracy"])) for r in run.evals
              if isinstance(r.get("accuracy"), (int, float)) and math.isfinite(r["accuracy"])]
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    steps, acc = zip(*sorted(points))
    ax.plot(steps, acc, marker="o", color="tab:green")
    for s, a in (points[0], points[-1]):
        ax.annotate(f"{a:.1%}", (s, a), textcoords="offset points", xytext=(0, 8), ha="center")
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_ylim(-0.02, 1.05)
    return _finish(fig, [ax], "Held-out accuracy (eval.jsonl)", out / "accuracy.png")


def plot_length(run: RunRecords, out: Path) -> Path | None:
    steps, mean = run.series("completions/mean_length")
    if not steps:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    s_min, low = run.series("completions/min_length")
    s_max, high = run.series("completions/max_length")
    if s_min == steps and s_max == steps:
        ax.fill_between(steps, low, high, color="tab:purple", alpha=0.15, label="min–max")
    ax.plot(steps, mean, color="tab:purple", lw=1.8, label="mean length")
    ax.set_ylabel("completion tokens")
    s_clip, clipped = run.series("completions/clipped_ratio")
    twins = []
    if s_clip:
        twin = ax.twinx()
        twin.plot(s_clip, clipped, color="tab:red", lw=1, alpha=0.7, label="fraction that hit the length limit (right axis)")
        twin.set_ylabel("fraction truncated", color="tab:red")
        twin.set_ylim(-0.02, 1.02)
        twin.grid(False)
        twins.append(twin)
    _legend_below(ax, twins)
    return _finish(fig, [ax], "Completion length", out / "length.png")


def plot_kl_entropy(run: RunRecords, out: Path) -> Path | None:
    s_ent, entropy = run.series("entropy")
    s_kl, kl = run.series("kl")
    if not s_ent and not s_kl:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.plot(s_ent, entropy, color="tab:orange")
    left.set_title("entropy (nats per token)", fontsize=10)
    if s_kl:
        right.plot(s_kl, kl, color="tab:brown")
        right.set_title("KL to the reference (per token)", fontsize=10)
    else:
        right.text(0.5, 0.5, "KL not logged\n(algorithm.beta = 0: no reference model)", ha="center", va="center",
                   transform=right.transAxes, color="gray")
        right.set_title("KL to the reference", fontsize=10)
    return _finish(fig, [left, right], "Entropy and KL", out / "kl_entropy.png")


def plot_clipping(run: RunRecords, out: Path) -> Path | None:
    present = [k for k in CLIP_KEYS if run.series(k)[0]]
    if not present:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    peak = 0.0
    for key in present:
        steps, values = run.series(key)
        peak = max(peak, max(values))
        ax.plot(steps, values, lw=1.3, label=key.split("/")[-1])
    ax.set_ylabel("fraction of completion tokens")
    ax.set_ylim(-0.002, max(0.05, peak * 1.1))
    if peak == 0:
        ax.text(0.5, 0.6, "all zero: with one update per generation batch (on-policy) the ratio is exactly 1",
                ha="center", transform=ax.transAxes, color="gray")
    _legend_below(ax)
    return _finish(fig, [ax], "Clip fractions (ratio outside 1 ± ε)", out / "clipping.png")


def plot_timing(run: RunRecords, out: Path) -> Path | None:
    phases = sorted({m.group(1) for k in run.keys() if (m := PHASE_KEY.match(k))} - {"step"})
    if not phases:
        return None
    steps = [int(r["step"]) for r in run.metrics if isinstance(r.get("timing/step_s"), (int, float))]
    rows = [r for r in run.metrics if isinstance(r.get("timing/step_s"), (int, float))]
    stacks = [[float(r.get(f"timing/{p}_s") or 0.0) for r in rows] for p in phases]
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2.2, 1]})
    left.stackplot(steps, stacks, labels=phases, alpha=0.8)
    left.plot(steps, [float(r["timing/step_s"]) for r in rows], color="black", lw=0.8, label="whole step")
    left.set_ylabel("seconds")
    _legend_below(left)
    totals = [sum(s) for s in stacks]
    right.barh(phases, totals, color=[f"C{i}" for i in range(len(phases))])
    right.set_xlabel("total seconds over the run")
    right.grid(axis="y", visible=False)
    for i, t in enumerate(totals):
        right.text(t, i, f" {t:.1f}s", va="center", fontsize=9)
    fig.suptitle("Time per phase", fontsize=12, x=0.01, ha="left")
    left.set_xlabel("optimizer step")
    fig.tight_layout()
    fig.savefig(out / "timing.png", dpi=110)
    plt.close(fig)
    return out / "timing.png"


def plot_optimization(run: RunRecords, out: Path) -> Path | None:
    keys = [k for k in ("loss", "grad_norm", "learning_rate") if run.series(k)[0]]
    if not keys:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.3), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.plot(*run.series(key), lw=1.2)
        ax.set_title(key + (" (a surrogate; see docs)" if key == "loss" else ""), fontsize=10)
    return _finish(fig, list(axes[0]), "Optimization", out / "optimization.png")


PLOTS = (plot_reward, plot_accuracy, plot_length, plot_kl_entropy, plot_clipping, plot_timing, plot_optimization)


# --------------------------------------------------------------------------- HTML

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1150px;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.facts td{padding:.15em 1.2em .15em 0} .warn{background:#fff6e0;border-left:4px solid #e0a000;padding:.4em .8em;margin:.4em 0}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee}
table.samples{border-collapse:collapse;width:100%;font-size:.9em;margin:.4em 0 1em}
table.samples td,table.samples th{border:1px solid #ddd;padding:.3em .5em;vertical-align:top;text-align:left}
table.samples td.text{font-family:ui-monospace,Menlo,monospace;white-space:pre-wrap;word-break:break-word;max-width:480px}
pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:.85em} details{margin:.3em 0} summary{cursor:pointer}
"""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}"></figure>'


def _text(value) -> str:
    if isinstance(value, list):  # chat messages
        value = "\n".join(f"[{m.get('role')}] {m.get('content')}" for m in value if isinstance(m, dict))
    return html.escape(str(value))


def _facts(run: RunRecords) -> str:
    s = run.summary
    rows = [("steps", s.get("steps", run.metrics[-1]["step"] if run.metrics else 0))]
    if "wall_s" in s:
        rows.append(("wall time", f"{s['wall_s']:.1f} s"))
    if "median_step_s" in s:
        rows.append(("median step", f"{s['median_step_s']:.3f} s"))
    before, after = s.get("eval/accuracy_before"), s.get("eval/accuracy_after")
    if before is not None and after is not None:
        gain = f" ({html.escape(s['eval/gain'])})" if "eval/gain" in s else ""
        rows.append(("held-out accuracy", f"{before:.1%} → {after:.1%}{gain}"))
    rows += [(html.escape(label), html.escape(eval_line(record))) for label, record in _first_and_last_evals(run)]
    steps, rewards = run.series("reward")
    if rewards:
        window = max(1, len(rewards) // 10)
        rows.append(("reward", f"{sum(rewards[:window]) / window:.3f} (first {window}) → {sum(rewards[-window:]) / window:.3f} (last {window})"))
    if s.get("stopped"):
        rows.append(("status", html.escape(s.get("message", f"stopped by {s['stopped']}"))))
    return '<table class="facts">' + "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _first_and_last_evals(run: RunRecords) -> list[tuple[str, dict]]:
    """The "before" and "after" evals of eval.jsonl (the last of each label), as the facts table shows them."""
    found = {r.get("label"): r for r in run.evals if r.get("label") in ("before", "after")}
    return [(f"eval {label}", found[label]) for label in ("before", "after") if label in found]


def _samples(run: RunRecords) -> str:
    by_step: dict[int, list[dict]] = {}
    for record in run.completions:
        by_step.setdefault(int(record.get("step", 0)), []).append(record)
    if not by_step:
        return "<p>No completions logged (run.log_completions_every = 0).</p>"
    steps = sorted(by_step)
    if len(steps) > MAX_SAMPLE_STEPS:
        stride = (len(steps) - 1) / (MAX_SAMPLE_STEPS - 1)
        steps = sorted({steps[round(i * stride)] for i in range(MAX_SAMPLE_STEPS)})
    parts = []
    for i, step in enumerate(steps):
        rows = by_step[step]
        rewards = [r["reward"] for r in rows if isinstance(r.get("reward"), (int, float))]
        mean = f", mean reward {sum(rewards) / len(rewards):.3f}" if rewards else ""
        body = "".join(  # a multi-turn completion shows its whole conversation, tool turns marked [tool]
            f"<tr><td class=text>{_text(r.get('prompt', ''))}</td><td class=text>{_text(r.get('conversation') or r.get('completion', ''))}</td>"
            f"<td>{_number(r.get('reward'))}</td><td>{_number(r.get('advantage'))}</td><td>{html.escape(_finish_text(r))}</td></tr>"
            for r in rows)
        table = ("<table class=samples><tr><th>prompt</th><th>completion</th><th>reward</th><th>advantage</th><th>finish</th></tr>"
                 f"{body}</table>")
        opened = " open" if i in (0, len(steps) - 1) else ""
        parts.append(f"<details{opened}><summary>step {step}: {len(rows)} completions{mean}</summary>{table}</details>")
    return "".join(parts)


def _warning(record: dict) -> str:
    """One warnings.jsonl record; a failed-episodes one (cohort/trainer/episode_failures.py) with each of its distinct
    messages and how many episodes it failed."""
    failures = record.get("failures") or {}
    listed = "".join(f"<li>{count} × {html.escape(message)}</li>" for message, count in failures.items())
    return (f'<div class=warn>{html.escape(record.get("message", ""))} <i>(step {record.get("step")})</i>'
            f'{f"<ul>{listed}</ul>" if listed else ""}</div>')


def _finish_text(record: dict) -> str:
    finish = str(record.get("finish_reason", ""))
    finish = f"{finish}, tools {record['tool_status']}" if "tool_status" in record else finish
    return f"{finish}; episode failed, scored by nothing: {record['failure']}" if record.get("failure") else finish


def _number(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else html.escape(str(value))


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the PNGs and `report.html` into `out` (default RUN_DIR/report); returns the HTML path."""
    run = load_run(run_dir)
    out_dir = Path(out) if out else run.path / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    images = [p for plot in PLOTS if (p := plot(run, out_dir)) is not None]
    warnings = "".join(_warning(w) for w in run.warnings) or "<p>None.</p>"
    body = (f"<h1>cohort run: {html.escape(run.name)}</h1><p>{html.escape(str(run.path.resolve()))}</p>{_facts(run)}"
            f"<h2>Warnings</h2>{warnings}<h2>Curves</h2>{''.join(_img(p) for p in images)}"
            f"<h2>Sample completions</h2>{_samples(run)}"
            f"<h2>Config</h2><pre>{html.escape(run.config_text)}</pre>")
    page = out_dir / "report.html"
    page.write_text(_page(f"cohort report: {run.name}", body), encoding="utf-8")
    return page


# --------------------------------------------------------------------------- comparison

COMPARE_KEYS = (("reward", "mean reward (moving mean)"), ("completions/mean_length", "mean completion length"),
                ("entropy", "entropy"), ("kl", "KL to the reference"), ("frac_reward_zero_std", "fraction of zero-std groups"),
                ("timing/step_s", "seconds per step"))


def write_comparison(run_dirs: list[str | Path], out: str | Path) -> Path:
    """One PNG per metric with a line per run, plus `compare.html`; returns the HTML path."""
    runs = [load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    if len(set(names)) < len(names):
        names = [str(r.path) for r in runs]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    images = []
    for key, label in COMPARE_KEYS:
        if not any(r.series(key)[0] for r in runs):
            continue
        fig, ax = plt.subplots(figsize=(8, 3.6))
        for run, name in zip(runs, names):
            steps, values = run.series(key)
            if steps:
                ax.plot(steps, moving_mean(values, smoothing_window(len(values))), lw=1.6, label=name)
        ax.set_ylabel(label)
        _legend_below(ax)
        images.append(_finish(fig, [ax], label, out_dir / f"compare_{key.replace('/', '_')}.png"))
    evals = [(name, r) for name, r in zip(names, runs) if r.evals]
    if evals:
        fig, ax = plt.subplots(figsize=(8, 3.6))
        for name, run in evals:
            points = sorted((int(e["step"]), float(e["accuracy"])) for e in run.evals if isinstance(e.get("accuracy"), (int, float)))
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        ax.set_ylabel("held-out accuracy")
        _legend_below(ax)
        images.append(_finish(fig, [ax], "held-out accuracy", out_dir / "compare_accuracy.png"))
    facts = "".join(f"<h3>{html.escape(name)}</h3>{_facts(run)}" for name, run in zip(names, runs))
    body = f"<h1>cohort comparison</h1>{facts}<h2>Curves</h2>{''.join(_img(p) for p in images)}"
    page = out_dir / "compare.html"
    page.write_text(_page("cohort comparison", body), encoding="utf-8")
    return page
