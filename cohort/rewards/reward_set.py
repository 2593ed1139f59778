"""RewardSet: every reward function scores every completion; what the trainer calls.

    rs = RewardSet.from_specs([{"name": "numeric_match"}, {"name": "think_format", "weight": 0.2}])
    out = rs.score(prompts=..., completions=..., completion_ids=..., columns={...}, group_size=8)
    out.per_function  # (N, F) float64, NaN where a function returned None (or failed, on_error="none")
    out.total         # (N,)   float64, weighted NaN-aware sum; NaN when every function gave None
    out.metrics       # rewards/<name>/{mean,std,errors}, timing/reward/<name>_s, and
                      # rewards/<name>/<key> for the per-row metrics a function returns (calling.Scores)
    pending = rs.submit(...same arguments...)  # the functions start on the event loop; the caller goes on
    out = rs.merge([pending.result(), ...])    # several calls' outputs as one: the metrics of the concatenation

The trainer scores the groups that one poll of the engine returned in one call (with today's engines: the whole
batch; with streaming engines: the groups that finished together), so a function whose score of a row depends on
other rows sees only those. `merge` gives the same per_function, total and mean/std/extra metrics as one call
over the concatenation (errors and timings are summed).

Choices:
- An empty set is allowed and scores nothing: every total is NaN ("no function applies"), per_function is (N, 0).
  On-policy distillation alone (algorithm.name = distill, teacher.reward_weight = 0) trains on the teacher's signal
  with `rewards: []`; validation refuses an empty list everywhere else.
- Contracts: TRL's batch call for every built-in and for your own functions, except a
  function with verl's ``compute_score(data_source, solution_str, ground_truth, ...)``
  (recognised by its parameters, or ``contract: verl`` in the spec), which is called
  once per completion (``cohort.rewards.verl``).
- Concurrency: the functions of one batch run at the same time, at most
  ``max_concurrency`` at once (an asyncio semaphore). ``async def`` functions are
  awaited on one event loop that lives in a background thread for the set's lifetime
  (so clients bound to a loop keep working across steps); plain functions run on
  daemon threads (one per call, so a hung function never blocks interpreter exit).
  Each function gets its own shallow copies of the argument lists. An object with an
  ``async def acall`` (the asynchronous built-ins) is awaited through it
  (``cohort.rewards.calling``), so calling the same object from plain Python is synchronous. CPU-heavy
  built-ins move their work into processes themselves.
- Timeouts: each call gets ``timeout_s`` (per spec or set-wide). An async call is
  cancelled; a sync call cannot be interrupted, so its thread is abandoned and keeps
  running until it returns.
- Failure policy: a function that raises or times out raises ``RewardError`` (name,
  exception, the offending completion truncated) with ``on_error="raise"``; with
  ``on_error="none"`` its whole column is None for this batch and
  ``rewards/<name>/errors`` counts the completions lost. A function that breaks the
  contract (wrong length, a non-number, NaN/inf) always raises ``RewardError``: that is
  a bug to fix, not a flake to tolerate. Return None for "not applicable".
- Aggregation (``aggregation=``):
  * ``"sum_then_normalize"`` (default): ``total = Σ_k w_k r_k`` over the functions that
    scored the row; normalisation is left to the advantage estimator.
  * ``"normalize_then_sum"`` (TRL's ``multi_objective_aggregation``): each function's
    column is first standardised within each group of ``group_size`` consecutive rows,
    ``z_k = (r_k − mean_g(r_k)) / (std_g(r_k) + 1e-4)``, mean and std over the group's
    non-NaN entries, std Bessel-corrected (ddof=1) and taken as 0 when fewer than two
    entries; then ``total = Σ_k w_k z_k`` over non-NaN entries.
  In both, a row where every function gave None has ``total = NaN``.
- Metrics: mean over non-NaN entries; std Bessel-corrected over non-NaN entries
  (0.0 with one entry); both NaN when the function scored nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cohort.rewards.calling import DaemonThreads, RewardRowError, async_implementation, names_parameter  # noqa: F401 - RewardRowError re-exported
from cohort.rewards import verl
from cohort.rewards.reward_registry import SPEC_KEYS, Resolved, RewardFunction, resolve
from cohort.rewards.text import completion_text, truncate

AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
ON_ERROR = ("raise", "none")
NORMALIZE_EPS = 1e-4
RESERVED = ("prompts", "completions", "completion_ids")


class RewardError(RuntimeError):
    """A reward function failed, timed out, or broke the contract."""


@dataclass
class RewardEntry:
    """One function of the set. ``on_error``/``timeout_s`` None: the set's defaults."""

    name: str
    function: RewardFunction
    weight: float = 1.0
    on_error: str | None = None
    timeout_s: float | None = None


@dataclass
class RewardOutput:
    per_function: np.ndarray  # (N, F) float64
    total: np.ndarray  # (N,) float64
    metrics: dict[str, float] = field(default_factory=dict)
    reported: dict[str, list[float]] = field(default_factory=dict)  # each rewards/<name>/<key> extra: its finite values


class PendingScores:
    """A `RewardSet.submit` in progress: the functions run on the set's event loop; `result()` waits and checks."""

    def __init__(self, future, finish):
        self._future, self._finish = future, finish

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> RewardOutput:
        return self._finish(self._future.result())

    @classmethod
    def finished(cls, output: RewardOutput) -> PendingScores:
        """A call whose output is already known (rank 0's, broadcast to the other ranks)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(output)
        return cls(future, lambda out: out)


@dataclass
class _CallResult:
    values: Any = None
    error: BaseException | None = None
    seconds: float = 0.0


def aggregate(per_function: np.ndarray, weights: Sequence[float], aggregation: str, group_size: int) -> np.ndarray:
    """``(N, F)`` scores → ``(N,)`` totals; see the module docstring for the exact maths."""
    n, f = per_function.shape
    w = np.asarray(weights, dtype=np.float64).reshape(1, f)
    scored = ~np.isnan(per_function)  # (N, F)
    if aggregation == "sum_then_normalize":
        contributions = np.where(scored, per_function * w, 0.0)
    elif aggregation == "normalize_then_sum":
        if group_size < 1 or n % group_size:
            raise ValueError(f"{n} completions do not split into groups of group_size={group_size}")
        grouped = per_function.reshape(-1, group_size, f)  # (groups, G, F)
        mask = scored.reshape(grouped.shape)
        count = mask.sum(axis=1, keepdims=True)  # (groups, 1, F)
        filled = np.where(mask, grouped, 0.0)
        mean = filled.sum(axis=1, keepdims=True) / np.maximum(count, 1)
        squares = np.where(mask, (grouped - mean) ** 2, 0.0).sum(axis=1, keepdims=True)
        std = np.where(count > 1, np.sqrt(squares / np.maximum(count - 1, 1)), 0.0)
        z = (grouped - mean) / (std + NORMALIZE_EPS)
        contributions = np.where(mask, z, 0.0).reshape(n, f) * w
    else:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    total = contributions.sum(axis=1)
    total[~scored.any(axis=1)] = np.nan
    return total


def _column_metrics(name: str, column: np.ndarray) -> dict[str, float]:
    values = column[~np.isnan(column)]
    if values.size == 0:
        mean = std = math.nan
    else:
        mean = float(values.mean())
        std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return {f"rewards/{name}/mean": mean, f"rewards/{name}/std": std}


def _extra_values(name: str, values: Any) -> dict[str, list[float]]:
    """``rewards/<name>/<key>`` -> the finite values of each per-row metric a function returned with its scores (``Scores``)."""
    out = {}
    for key, column in (getattr(values, "metrics", None) or {}).items():
        label = key if key not in ("mean", "std", "errors") else f"extra_{key}"
        out[f"rewards/{name}/{label}"] = [float(v) for v in column if v is not None and math.isfinite(float(v))]
    return out


def _extra_metrics(reported: Mapping[str, list[float]]) -> dict[str, float]:
    """The mean of each extra metric's values (NaN when none was reported)."""
    return {key: sum(values) / len(values) if values else math.nan for key, values in reported.items()}


def _unique_names(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    if len(set(unique)) != len(unique):
        raise ValueError(f"reward names must be unique; got {unique} (set an alias)")
    return unique


def validate_spec(spec: Mapping[str, Any] | str | Callable[..., Any]) -> Resolved:
    """Check one spec (name, options, weight, on_error, timeout_s, alias, contract); build nothing.

    For config validation before any model loads; raises ``ValueError`` saying what to fix.
    """
    if isinstance(spec, str) or callable(spec):
        spec = {"name": spec}
    if "name" not in spec:
        raise ValueError(f"a reward spec needs a 'name'; got {dict(spec)}")
    name = spec["name"] if isinstance(spec["name"], str) else getattr(spec["name"], "__name__", type(spec["name"]).__name__)
    try:
        weight = float(spec.get("weight", 1.0))
    except (TypeError, ValueError):
        weight = math.nan
    if not math.isfinite(weight):
        raise ValueError(f"reward {name!r}: weight must be a finite number, got {spec.get('weight')!r}")
    if spec.get("on_error") not in (None, *ON_ERROR):
        raise ValueError(f"reward {name!r}: on_error must be one of {ON_ERROR}, got {spec['on_error']!r}")
    timeout_s = spec.get("timeout_s")
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"reward {name!r}: timeout_s must be a positive number of seconds, got {timeout_s!r}")
    alias = spec.get("alias")
    if alias is not None and (not isinstance(alias, str) or not alias):
        raise ValueError(f"reward {name!r}: alias must be a non-empty string, got {alias!r}")
    resolved = resolve(spec["name"], {k: v for k, v in spec.items() if k not in SPEC_KEYS})
    verl.contract_of(resolved, spec.get("contract"))  # a bad contract, or a signature verl's cannot call
    return resolved


def _entry_from_spec(spec: Mapping[str, Any] | str | Callable[..., Any]) -> RewardEntry:
    """A spec dict → an entry (display name before de-duplication)."""
    if isinstance(spec, str) or callable(spec):
        spec = {"name": spec}
    resolved = validate_spec(spec)
    options = {k: v for k, v in spec.items() if k not in SPEC_KEYS}
    timeout_s = spec.get("timeout_s")
    return RewardEntry(
        spec.get("alias") or resolved.display_name,
        verl.build(resolved, options, spec.get("contract")),
        float(spec.get("weight", 1.0)),
        spec.get("on_error"),
        None if timeout_s is None else float(timeout_s),
    )


class RewardSet:
    """Scores completions with several reward functions; see the module docstring."""

    def __init__(
        self,
        entries: Sequence[RewardEntry],
        *,
        on_error: str = "raise",
        max_concurrency: int = 16,
        timeout_s: float = 60.0,
        aggregation: str = "sum_then_normalize",
    ):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        if max_concurrency < 1 or timeout_s <= 0:
            raise ValueError(f"need max_concurrency >= 1 and timeout_s > 0; got {max_concurrency}, {timeout_s}")
        names = _unique_names([e.name for e in entries])
        self._entries = [
            RewardEntry(n, e.function, float(e.weight), e.on_error or on_error, e.timeout_s or timeout_s)
            for n, e in zip(names, entries)
        ]
        self.aggregation = aggregation
        self._max_concurrency = max_concurrency
        self._threads = DaemonThreads()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._closed = False

    @classmethod
    def from_specs(cls, specs: Sequence[Mapping[str, Any] | str | Callable[..., Any]], **kwargs: Any) -> RewardSet:
        """Build from ``[{name, weight=1.0, on_error?, timeout_s?, alias?, contract?, **options}]``; a name (or a whole
        spec) may be the reward callable itself, which resolves like an import path (``cohort.rewards.reward_registry``)."""
        built = []
        try:
            for spec in specs:
                built.append(_entry_from_spec(spec))
        except BaseException:
            for entry in built:
                _close_function(entry.function)
            raise
        return cls(built, **kwargs)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self._entries]

    @property
    def weights(self) -> list[float]:
        return [e.weight for e in self._entries]

    @property
    def functions(self) -> list[RewardFunction]:
        return [e.function for e in self._entries]

    # -- scoring ---------------------------------------------------------------------

    def score(self, **inputs: Any) -> RewardOutput:
        """Score ``N`` completions with every function and wait for them: ``submit(**inputs).result()``, so the
        keyword arguments are `submit`'s; shapes in the module docstring."""
        return self.submit(**inputs).result()

    def submit(
        self,
        *,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]],
        columns: Mapping[str, Sequence[Any]] | None = None,
        group_size: int = 1,
        optional: Mapping[str, Sequence[Any]] | None = None,
        unscored: Sequence[bool] | None = None,
    ) -> PendingScores:
        """Start scoring ``N`` completions with every function on the event loop and return at once: `.result()` waits
        for it (and raises its errors); `score` is the two in one.
        `optional`: per-completion arguments (multi-turn's `conversations`, `environments`) passed only to the
        functions that name them as a parameter (`calling.names_parameter`). `unscored[i]` True: completion i is
        scored by nothing (a failed episode): no function sees it, every column is NaN there (its total NaN, its
        advantage 0); the functions get the other rows."""
        if self._closed:
            raise RuntimeError("this RewardSet is closed")
        n = len(completions)
        kwargs = self._call_kwargs(prompts, completions, completion_ids, columns or {})
        if group_size < 1 or n % group_size:
            raise ValueError(f"{n} completions do not split into groups of group_size={group_size}")
        kept = [i for i in range(n) if not (unscored is not None and unscored[i])]
        optional = {k: list(v) for k, v in (optional or {}).items()}
        if len(kept) < n:  # (the functions see the scored rows only)
            kwargs = {k: [v[i] for i in kept] for k, v in kwargs.items()}
            optional = {k: [v[i] for i in kept] for k, v in optional.items()}
        future = asyncio.run_coroutine_threadsafe(self._score_all(kwargs, optional, bool(kept)), self._event_loop())
        return PendingScores(future, lambda results: self._output(results, list(completions), group_size, kept))

    def _output(self, results: list[_CallResult], completions: list[Any], group_size: int,
                kept: list[int]) -> RewardOutput:
        per_function = np.full((len(completions), len(self._entries)), np.nan)  # (N, F)
        metrics: dict[str, float] = {}
        reported: dict[str, list[float]] = {}
        for k, (entry, result) in enumerate(zip(self._entries, results)):
            column = np.full(len(kept), np.nan)  # the scored rows' (every row but the unscored ones)
            errors = self._fill_column(entry, result, column, [completions[i] for i in kept])
            per_function[kept, k] = column
            metrics.update(_column_metrics(entry.name, per_function[:, k]))
            reported.update(_extra_values(entry.name, result.values))
            metrics[f"rewards/{entry.name}/errors"] = float(errors)
            metrics[f"timing/reward/{entry.name}_s"] = result.seconds
        metrics.update(_extra_metrics(reported))
        total = aggregate(per_function, self.weights, self.aggregation, group_size)
        return RewardOutput(per_function, total, metrics, reported)

    def merge(self, outputs: Sequence[RewardOutput], rows: Sequence[tuple[int, int]] | None = None) -> RewardOutput:
        """Several calls' outputs as one: `rows` picks the result's rows in order, each `(output, row)` (default: every
        row of every output, concatenated). per_function and total are those rows; mean/std are recomputed over them,
        so the metrics equal one call over exactly those completions; errors, timings and the extra per-row metrics
        (means of every value reported) are over all of `outputs`."""
        if rows is None:
            rows = [(k, i) for k, o in enumerate(outputs) for i in range(len(o.total))]
        per_function = np.stack([outputs[k].per_function[i] for k, i in rows]) if rows else np.empty((0, len(self._entries)))
        total = np.array([outputs[k].total[i] for k, i in rows], dtype=np.float64)
        reported: dict[str, list[float]] = {}
        for o in outputs:
            for key, values in o.reported.items():
                reported.setdefault(key, []).extend(values)
        metrics: dict[str, float] = {}
        for k, entry in enumerate(self._entries):
            metrics.update(_column_metrics(entry.name, per_function[:, k]))
            for key in (f"rewards/{entry.name}/errors", f"timing/reward/{entry.name}_s"):
                metrics[key] = float(sum(o.metrics[key] for o in outputs))
        metrics.update(_extra_metrics(reported))
        return RewardOutput(per_function, total, metrics, reported)

    @staticmethod
    def _call_kwargs(prompts, completions, completion_ids, columns) -> dict[str, Any]:
        n = len(completions)
        clash = sorted(set(columns) & set(RESERVED))
        if clash:
            raise ValueError(f"dataset columns {clash} clash with the reward arguments {list(RESERVED)}; rename them")
        lengths = {"prompts": len(prompts), "completion_ids": len(completion_ids)}
        lengths.update({k: len(v) for k, v in columns.items()})
        wrong = {k: v for k, v in lengths.items() if v != n}
        if wrong:
            raise ValueError(f"every column needs one entry per completion ({n}); got lengths {wrong}")
        return {
            "prompts": list(prompts),
            "completions": list(completions),
            "completion_ids": list(completion_ids),
            **{k: list(v) for k, v in columns.items()},
        }

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._loop.run_forever, name="cohort-reward-loop", daemon=True
            )
            self._loop_thread.start()
        return self._loop

    async def _score_all(self, kwargs: dict[str, Any], optional: dict[str, Sequence[Any]], any_rows: bool = True
                         ) -> list[_CallResult]:
        if not any_rows:  # every row unscored: no function is called
            return [_CallResult(values=[]) for _ in self._entries]
        semaphore = asyncio.Semaphore(self._max_concurrency)
        calls = [
            self._call_one(entry, {**{k: list(v) for k, v in kwargs.items()},
                                   **{k: list(v) for k, v in optional.items() if names_parameter(entry.function, k)}},
                           semaphore)
            for entry in self._entries
        ]
        return list(await asyncio.gather(*calls))

    async def _call_one(self, entry: RewardEntry, kwargs: dict[str, Any], semaphore: asyncio.Semaphore) -> _CallResult:
        async with semaphore:
            start = time.perf_counter()
            result = _CallResult()
            try:
                result.values = await asyncio.wait_for(self._invoke(entry.function, kwargs), entry.timeout_s)
            except asyncio.TimeoutError:
                result.error = TimeoutError(f"no result after timeout_s={entry.timeout_s:g}")
            except Exception as exc:  # noqa: BLE001 - the failure policy decides
                result.error = exc
            result.seconds = time.perf_counter() - start
            return result

    async def _invoke(self, function: RewardFunction, kwargs: dict[str, Any]) -> Any:
        awaitable = async_implementation(function)  # a built-in's acall, or an async def
        if awaitable is not None:
            return await awaitable(**kwargs)
        loop = asyncio.get_running_loop()
        values = await loop.run_in_executor(self._threads, lambda: function(**kwargs))
        if inspect.isawaitable(values):
            values = await values
        return values

    def _fill_column(self, entry: RewardEntry, result: _CallResult, column: np.ndarray, completions) -> int:
        """Write one function's scores into ``column`` (N,); return how many were lost to errors."""
        if result.error is not None:
            if entry.on_error == "none":
                return len(column)
            raise RewardError(_failure_message(entry.name, result.error, completions)) from result.error
        values = result.values
        if isinstance(values, np.ndarray):
            values = values.tolist()
        if not isinstance(values, (list, tuple)) or len(values) != len(column):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
            raise RewardError(
                f"reward function {entry.name!r} returned {got} for {len(column)} completions; "
                f"it must return a list with one float or None per completion"
            )
        for i, value in enumerate(values):
            if value is None:
                continue
            if isinstance(value, (numbers.Real, np.bool_)):
                value = float(value)
                if math.isfinite(value):
                    column[i] = value
                    continue
                problem = f"the non-finite value {value}"
            else:
                problem = f"a {type(value).__name__} ({truncate(repr(value), 80)})"
            raise RewardError(
                f"reward function {entry.name!r} returned {problem} at index {i} of {len(column)}; "
                f"return a finite float, or None for 'not applicable'"
            )
        return 0

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        """Stop the event loop; close the functions that have ``close()``."""
        if self._closed:
            return
        self._closed = True
        for entry in self._entries:
            _close_function(entry.function)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=5)
            if not self._loop.is_running():
                self._loop.close()

    def __enter__(self) -> RewardSet:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _close_function(function: Any) -> None:
    close = getattr(function, "close", None)
    if callable(close):
        close()


def _failure_message(name: str, error: BaseException, completions: Sequence[Any]) -> str:
    index = getattr(error, "index", None)
    if isinstance(index, int) and 0 <= index < len(completions):
        where = f"completion[{index}]"
    else:
        index = 0
        where = f"completion[0] of {len(completions)} (the call failed as a whole; the row is unknown)"
    shown = truncate(completion_text(completions[index]), 300) if completions else "<no completions>"
    return f"reward function {name!r} failed: {type(error).__name__}: {error}\n  {where}: {shown!r}"
