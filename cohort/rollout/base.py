"""The rollout engine protocol: requests in, `Trajectory` records streamed back as they finish.

Every engine (vLLM in-process, transformers, a `cohort serve` server) speaks the
same two levels, so the trainer never asks which engine it has:

- **requests** (the foundation): `submit` a list of `Request`s (prompt token
  ids, sampling parameters, a seed, an id), `poll` for the trajectories that
  finished since the last poll (in-process engines make progress inside
  `poll`), `abort` requests and get back what each had generated so far
  (status "aborted"), and continue an aborted request by submitting it again
  with `resume=` its partial trajectory: the engine samples from prompt +
  the tokens already sampled, never re-tokenizing them, and returns the whole
  trajectory (the old tokens with their old log-probs and versions, then the
  new ones).
- **batch**: `generate(prompts, sampling, seeds)`, one trajectory per prompt entry in order,
  is the drain of the request level (`generate_requests`); every engine gets it from `RequestEngineMixin`.

Weights flow one way: the trainer calls `update_weights` after an optimizer step and `score` on fixed canary
completions to check the engine really holds the new policy (cohort/trainer/sync_check.py). An engine whose
`in_flight_updates` is True also takes new weights while requests are in flight (`update_weights(...,
in_flight=True)`, asynchronous training): they continue under the new weights, every token sampled afterwards carries
the new version; the others raise when asked.

Memory: an engine that shares the trainer's GPU may have `release_memory()`, which frees what it can while the
trainer updates (vLLM's sleep mode); the trainer calls `release_engine_memory(engine)` just before its update, a
no-op for engines without it. Such an engine wakes by itself: its weights before it loads a push, its KV cache
before it samples or scores.

Threads: an engine is not thread-safe. A caller may drive it from two threads (e.g. `poll(timeout)` on a background
thread, `submit` / `update_weights` / `abort` / `score` on the main one) only if it serialises every call with its own
lock, never two at once; a short `timeout` (0.1 s) bounds how long a `poll` holds that lock (remote engines included),
and `poll(timeout)` returning [] says nothing finished yet, not that the engine is idle (read `in_flight`). Liveness:
an engine that dies or stops making progress raises from `poll` (RemoteEngine: within engine.server_timeout_s, however
short the caller's timeouts) or returns its requests with status "error" (vLLM in-process); it never leaves `poll`
returning [] forever with requests in flight.

Seeds: one per completion, derived from (rollout.seed, generation index, slot), so a run is reproducible and a resumed
run draws the same samples. (vLLM on a GPU drops them unless engine.per_request_seeds is set:
cohort/rollout/engines/vllm.py.)
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, ClassVar, Iterable, Iterator, Protocol, Sequence

import torch

from cohort.models.devices import use_device

STATUSES = ("stop", "length", "aborted", "error")
FINISHED = ("stop", "length")  # a completion that ended by itself; "aborted" ones may be continued, "error" ones not


def engine_thread(target: Callable[..., Any]) -> Callable[..., Any]:
    """``target`` run with PyTorch's thread count set up first (use it for every thread that drives an engine).

    OpenMP keeps a thread count per thread; a new thread starts at the default (all cores) and PyTorch applies its own
    count (torch.set_num_threads, e.g. one thread for a small model) only at the thread's first parallel operation.
    vLLM's CPU attention reads the count when it builds its metadata and again in the kernel, so a thread whose first
    PyTorch operation falls between the two stops with "thread_num == thread_num (2 vs. 1)". Asking for the count
    first (torch.get_num_threads) applies it.

    CUDA's current device is per thread too: the new thread takes the current device of the thread that wraps
    ``target`` (the trainer's cuda:LOCAL_RANK), so what it creates lands beside the models it drives."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_initialized() else None

    def run(*args: Any, **kwargs: Any) -> Any:
        torch.get_num_threads()
        use_device(device)
        return target(*args, **kwargs)

    return run


class EngineLock:
    """The lock around every call into an engine that one thread drives in a loop (`with lock.driver():`, the rollout
    server's driver, the asynchronous trainer's pump) and other threads call now and then (`with lock:`: an HTTP
    handler's /weights or /abort, the trainer's submit or weight push). The callers go first: the driver takes the
    lock only when no caller waits for it, so a caller waits at most for the driver's current poll. (A plain lock is
    not fair: the driver, releasing and retaking it in its loop, kept the trainer's calls waiting 0.11 s a step on
    the arith demo with a local server.) Re-entrant for the thread that holds it."""

    def __init__(self):
        self._cond = threading.Condition()
        self._owner: int | None = None
        self._depth = 0
        self._waiting = 0

    def __enter__(self):
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return self
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: self._owner is None)
            finally:
                self._waiting -= 1
            self._owner, self._depth = me, 1
        return self

    def __exit__(self, *exc):
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._cond.notify_all()

    @contextlib.contextmanager
    def driver(self) -> Iterator[None]:
        """The driver's hold for one poll: taken once no caller waits (and nobody holds the lock)."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                self._cond.wait_for(lambda: self._owner is None and self._waiting == 0)
                self._owner, self._depth = me, 0
            self._depth += 1
        try:
            yield
        finally:
            self.__exit__()


@dataclass(frozen=True)
class SamplingConfig:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class EpisodeRecord:
    """A trajectory's multi-turn record (`Trajectory.episode`), as the layers that know no connector read it: the
    rollout's reward calls and partial rollouts (cohort/rollout/collect.py, partial.py), the trainer's batch, its
    completions.jsonl and its metrics. Each multi-turn producer subclasses it with its own record, named by a `kind`
    (`class MyRecord(EpisodeRecord, kind="mine")`), and overrides what applies to it; the defaults say "nothing".

    - `observation`: text shown before the first turn (what a reset returned), appended to the prompt
      (`with_observation`): reward functions get the prompt as the model saw it.
    - `failed`: the episode failed before the model could play it: it is scored by nothing (every reward None,
      advantage 0) and counted; `failure_message`: why, in the words of whatever failed it (with its fix where cohort
      wrote one), which the console, warnings.jsonl and completions.jsonl show (cohort/trainer/episode_failures.py).
    - `reward_arguments(prompt)`: the optional keyword arguments this record gives reward functions (`prompt` is the
      shown prompt); a batch passes each name as one list over its trajectories, None where a record has none.
    - `completion_fields()`: what completions.jsonl adds for this trajectory.
    - `completion_messages()`: a chat trajectory's completion as reward functions get it (`completions=`), TRL's shape
      for a multi-turn one: the assistant messages (a turn's calls in `tool_calls`, its `content` the text outside
      them) and the tool messages, in order; None: the whole decoded text as one assistant message.
    - `batch_metrics(records)`: the metrics of a batch's records of this kind.
    - `to_state()` / `from_state(state)`: plain data a checkpoint holds (torch.load(weights_only=True) reads it back)
      across a partial rollout's abort; live objects (an instance the episode played against) stay out.
    - `resumable`: a cut-off episode continues from its tokens (partial rollouts, cohort/rollout/partial.py); False:
      it starts over from its prompt instead (a program whose state died with the cut cannot be continued).
    - `seats` (a trajectory per seat, each record naming its `seat`), `samples` (a rewritten history's earlier calls),
      `unplayed_seat(name)`: what the trainer widens a batch by (cohort/trainer/agent_samples.py); default: none.

    `unmarked=True` on one kind: a saved record without a kind is of that kind (checkpoints written before records
    named their kind held one kind only)."""

    kinds: ClassVar[dict[str, type[EpisodeRecord]]] = {}
    kind: ClassVar[str] = ""
    unmarked: ClassVar[str | None] = None  # the kind of a saved record that names none
    observation: str | None = None
    resumable: ClassVar[bool] = True
    seat: str | None = None
    seats: Sequence[Any] = ()  # (Trajectory records, one per seat)
    samples: Sequence[Any] = ()  # (Trajectory records, the earlier calls)

    def __init_subclass__(cls, kind: str | None = None, unmarked: bool = False, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if kind is None:
            return
        if kind in EpisodeRecord.kinds:
            raise ValueError(f"episode record kind {kind!r} is registered twice ({EpisodeRecord.kinds[kind].__qualname__}"
                             f" and {cls.__qualname__})")
        cls.kind = kind
        EpisodeRecord.kinds[kind] = cls
        if unmarked:
            EpisodeRecord.unmarked = kind

    @property
    def failed(self) -> bool:
        return False

    @property
    def failure_message(self) -> str | None:
        return None

    def reward_arguments(self, prompt: Any) -> dict[str, Any]:
        return {}

    def completion_fields(self) -> dict[str, Any]:
        return {}

    def completion_messages(self) -> list[dict[str, Any]] | None:
        return None

    def unplayed_seat(self, name: str) -> EpisodeRecord | None:
        return None

    @classmethod
    def batch_metrics(cls, records: Sequence[EpisodeRecord]) -> dict[str, float]:
        return {}

    def to_state(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__qualname__} cannot be saved in a checkpoint")

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EpisodeRecord:
        raise NotImplementedError(f"{cls.__qualname__} cannot be restored from a checkpoint")


def record_to_state(record: EpisodeRecord) -> dict[str, Any]:
    """A record as plain data, its kind included (`record_from_state` reads it back)."""
    if not record.kind:
        raise ValueError(f"{type(record).__qualname__} has no kind: declare it as `class ...(EpisodeRecord, kind=...)`")
    return {"kind": record.kind, **record.to_state()}


def record_from_state(state: dict[str, Any]) -> EpisodeRecord:
    """The record `record_to_state` saved (a state without a kind: the `unmarked` kind's)."""
    state = dict(state)
    kind = state.pop("kind", EpisodeRecord.unmarked)
    found = EpisodeRecord.kinds.get(kind) if kind is not None else None
    if found is None:
        raise ValueError(f"a saved trajectory holds an episode record of kind {kind!r}, which no imported module "
                         f"defines (known: {sorted(EpisodeRecord.kinds)}); import the module that produced it")
    return found.from_state(state)


def with_observation(prompt: Any, observation: str) -> Any:
    """A dataset prompt with the text shown before the first turn appended as TRL does with what `reset` returns: to
    the last user message's content with no separator (a user message of its own when there is none), or to a text
    prompt."""
    if not isinstance(prompt, list):
        return str(prompt) + observation
    messages = [dict(m) for m in prompt]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return messages + [{"role": "user", "content": observation}]
    messages[users[-1]]["content"] = str(messages[users[-1]].get("content") or "") + observation
    return messages


@dataclass
class Trajectory:
    """One completion as the engine sampled it; what every later phase (rewards, advantages, the update) reads.

    `token_ids` are exactly the sampled tokens (never decoded and re-encoded), the stop token kept last when
    status is "stop"; `logprobs[i]` is the engine's log-prob of token i (temperature applied), `versions[i]` the
    policy version the engine held when it sampled token i, `loss_mask[i]` 1 when token i is trained on (0 on
    tokens a multi-turn producer appends itself, tool output say, with log-prob 0). `policy_version`: the version the engine held
    when the request started (the oldest any of its tokens can be). `status`: "stop" (ended by a stop token), "length" (hit max_tokens),
    "aborted" (stopped by `abort`; may be continued), "error" (the engine failed on it; `error` says why).
    """

    token_ids: list[int]
    logprobs: list[float]
    status: str
    policy_version: int = 0
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    request_id: str = ""
    error: str | None = None
    episode: EpisodeRecord | None = None  # multi-turn: the record its producer kept (`EpisodeRecord`)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"Trajectory status {self.status!r} is not one of {STATUSES}")
        n = len(self.token_ids)
        if not self.versions:
            self.versions = [self.policy_version] * n
        if not self.loss_mask:
            self.loss_mask = [1] * n
        if not (len(self.versions) == len(self.loss_mask) == n) or len(self.logprobs) not in (0, n):
            raise ValueError(f"Trajectory {self.request_id!r}: {n} tokens but {len(self.logprobs)} log-probs, "
                             f"{len(self.versions)} versions and {len(self.loss_mask)} mask entries")

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @classmethod
    def sampled(cls, token_ids: Sequence[int], logprobs: Sequence[float], stop_token_ids, policy_version: int, *,
                prompt_ids: Sequence[int] = (), request_id: str = "") -> Trajectory:
        """A finished sample: its status from `finish_reason`'s rule, every token stamped with `policy_version`."""
        return cls(list(token_ids), [float(x) for x in logprobs], finish_reason(list(token_ids), stop_token_ids),
                   policy_version, prompt_ids=list(prompt_ids), request_id=request_id)

    def then(self, piece: Trajectory) -> Trajectory:
        """This (aborted) trajectory continued by `piece`, which was sampled from prompt + self.token_ids: the
        tokens, log-probs, versions and masks concatenated; status, error and id from the piece."""
        return Trajectory(self.token_ids + piece.token_ids, self.logprobs + piece.logprobs, piece.status,
                          self.policy_version, self.versions + piece.versions, self.loss_mask + piece.loss_mask,
                          self.prompt_ids, piece.request_id or self.request_id, piece.error)

    def to_state(self) -> dict[str, Any]:
        """This trajectory as plain data for a checkpoint (torch.load(weights_only=True) reads it back), its episode
        record as that record saves itself (`record_to_state`)."""
        state = asdict(replace(self, episode=None))
        if self.episode is not None:
            state["episode"] = record_to_state(self.episode)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Trajectory:
        """The trajectory `to_state` saved."""
        state = dict(state)
        episode = state.pop("episode", None)
        return cls(**state, episode=record_from_state(episode) if episode is not None else None)


@dataclass(frozen=True)
class Request:
    """One completion to sample. `resume`: a partial trajectory of this request (aborted earlier) to continue.
    `row`: the dataset row it samples, an index into the run's rows (train rows, then eval rows), set where the
    request is made from the sampler's prompts and kept across aborts, resumes and refills; a multi-turn producer that
    reads its row gets that one (never found again from the prompt's tokens). None: not from the data."""

    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingConfig
    seed: int | None = None
    resume: Trajectory | None = None
    row: int | None = None

    @property
    def engine_prompt(self) -> list[int]:
        """What the engine conditions on: the prompt, then the tokens already sampled (as they were sampled)."""
        return list(self.prompt_ids) + (list(self.resume.token_ids) if self.resume is not None else [])

    @property
    def remaining(self) -> SamplingConfig:
        """The sampling parameters for the rest: max_tokens less the tokens already sampled."""
        done = len(self.resume.token_ids) if self.resume is not None else 0
        return replace(self.sampling, max_tokens=max(0, self.sampling.max_tokens - done))

    def complete(self, piece: Trajectory) -> Trajectory:
        """The request's whole trajectory from what the engine sampled for `engine_prompt` (the resumed tokens first)."""
        piece = replace(piece, prompt_ids=list(self.prompt_ids), request_id=self.request_id)
        return self.resume.then(piece) if self.resume is not None else piece


class RolloutEngine(Protocol):
    policy_version: int
    in_flight_updates: bool  # whether update_weights(..., in_flight=True) is supported (vLLM, RemoteEngine)
    stop_token_ids: list[int]  # the ids that end a completion: the checkpoint's set (`cohort.models.pretrained.stop_token_ids`)

    def submit(self, requests: Sequence[Request]) -> None:
        """Start sampling these requests (ids unique among those in flight); returns at once."""

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        """The trajectories finished since the last poll, in any order; waits (in-process engines: generate) until at
        least one is, or nothing is in flight ([]), or `timeout` seconds passed ([])."""

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        """Stop these requests (None: every one in flight) and return each one's trajectory so far, status "aborted"
        (a request that had already finished but was not polled yet comes back finished). Unknown ids are ignored."""

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet returned by poll or abort."""

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None,
                 rows: Sequence[int] | None = None) -> list[Trajectory]:
        """One trajectory per prompt entry, in order (repeat a prompt G times for a group): `generate_requests`.
        `rows`: each entry's dataset row (`Request.row`), for multi-turn producers that read it."""

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                       in_flight: bool = False) -> int | None:
        """Load a full set of new weights in place; later generations report `version`.

        With requests being sampled: `in_flight=False` raises (sync between rollouts); `in_flight=True` loads them
        between two engine steps, the requests continue under them and every token sampled after carries `version`
        (an engine with `in_flight_updates` False raises instead). Each engine says what happens to the prefix cache
        and to the in-flight requests' KV cache (vLLM: both recomputed with the new weights).

        `named_tensors` is walked once, except a `WeightStream`, which an engine that must know the sizes before it
        sends anything (RemoteEngine) walks twice instead of holding every tensor. Returns the bytes sent over the network for it (remote engines), or None when nothing left the process.
        """

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """The engine's log-probs of fixed completions, one list per (prompt, completion) pair (the sync check's canaries).

        An engine with `in_flight_updates` scores with requests in flight too, without taking any of their results."""

    def close(self) -> None: ...


def release_engine_memory(engine) -> bool:
    """Let the engine free its GPU memory for the trainer's update (`release_memory()`, e.g. vLLM's sleep mode);
    False and nothing done for an engine without it. Looked up by name, so wrappers that pass unknown attributes to
    their inner engine (a multi-turn wrapper) pass this on too."""
    release = getattr(engine, "release_memory", None)
    return bool(release()) if release is not None else False


class ForwardingEngine:
    """An engine built around another (`self.inner`) that passes the whole `RolloutEngine` protocol through to it,
    member by member; a subclass overrides what it does differently (rank 0's `DetachedHFEngine` loads the weights
    itself, `LocalServerEngine` also stops its server on close, multi-turn wrappers handle the requests)."""

    inner: Any

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def stop_token_ids(self) -> list[int]:
        return self.inner.stop_token_ids

    @property
    def in_flight_updates(self) -> bool:
        return self.inner.in_flight_updates

    def submit(self, requests: Sequence[Request]) -> None:
        self.inner.submit(requests)

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        return self.inner.poll(timeout)

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        return self.inner.abort(request_ids)

    @property
    def in_flight(self) -> int:
        return self.inner.in_flight

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None,
                 rows: Sequence[int] | None = None) -> list[Trajectory]:
        return self.inner.generate(prompts, sampling, seeds, rows)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                       in_flight: bool = False) -> int | None:
        return self.inner.update_weights(named_tensors, version, in_flight=in_flight)

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        return self.inner.score(prompts, completions, temperature)

    def close(self) -> None:
        self.inner.close()


class WrappedEngine(ForwardingEngine):
    """A `ForwardingEngine` in the request path (a multi-turn wrapper) that also passes on every attribute beyond
    the protocol that it does not define (release_memory, the transformers engine's model, ...), so wrapping an
    engine hides none of its extras."""

    def __getattr__(self, name: str):
        if name in ("inner", "__setstate__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class WeightStream:
    """Named tensors that can be walked more than once without being held: each walk calls `make()` afresh.

    A sync's tensors are often made on the fly (LoRA's merged weights, a bfloat16 cast of float32 masters), so a
    list of them is a whole extra copy of the model; walking a stream holds one tensor at a time."""

    def __init__(self, make: Callable[[], Iterable[tuple[str, torch.Tensor]]]):
        self.make = make

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.make())


_batch_ids = itertools.count()


def batch_requests(prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None,
                   prefix: str | None = None, rows: Sequence[int] | None = None) -> list[Request]:
    """One request per prompt entry, ids `<prefix>/<index>` (a fresh prefix per call unless given), each with its
    seed and its dataset row when given."""
    prefix = prefix if prefix is not None else f"b{next(_batch_ids)}"
    seeds = seeds if seeds is not None else [None] * len(prompts)
    rows = list(rows) if rows is not None else [None] * len(prompts)
    return [Request(f"{prefix}/{i}", tuple(int(t) for t in p), sampling, s, row=r)
            for i, (p, s, r) in enumerate(zip(prompts, seeds, rows, strict=True))]


def generate_requests(engine, requests: Sequence[Request]) -> list[Trajectory]:
    """Submit `requests` and poll until every one is back; their trajectories in the requests' order.

    A trajectory with status "error" raises (the batch caller has no use for a hole)."""
    engine.submit(requests)
    index = {r.request_id: i for i, r in enumerate(requests)}
    out: list[Trajectory | None] = [None] * len(requests)
    missing = len(requests)
    while missing:
        got = engine.poll()
        if not got and not engine.in_flight:
            raise RuntimeError(f"the rollout engine stopped with {missing} of {len(requests)} requests unanswered")
        for t in got:
            i = index.get(t.request_id)
            if i is None or out[i] is not None:
                continue  # not one of ours (another caller's stream)
            if t.status == "error":
                raise RuntimeError(f"the rollout engine failed on request {t.request_id}: {t.error}")
            out[i] = t
            missing -= 1
    return out  # type: ignore[return-value]


class RequestEngineMixin:
    """`generate` for every engine: the drain of its request level."""

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None,
                 rows: Sequence[int] | None = None) -> list[Trajectory]:
        return generate_requests(self, batch_requests(prompts, sampling, seeds, rows=rows))


class BatchRequests(RequestEngineMixin):
    """The request level for an engine that can only sample whole batches (`_sample(requests) -> trajectories`).

    `submit` queues; `poll` samples everything queued in one call and returns it all (so nothing streams: the
    batch's slowest completion decides when any comes back); `abort` drops queued requests, returning them with no
    new tokens (status "aborted", their resumed tokens kept). Engines that stream implement the three themselves.
    """

    def _sample(self, requests: list[Request]) -> list[Trajectory]:
        raise NotImplementedError

    @property
    def _queue(self) -> list[Request]:
        queue = self.__dict__.get("_request_queue")
        if queue is None:
            queue = self.__dict__["_request_queue"] = []
        return queue

    def submit(self, requests: Sequence[Request]) -> None:
        self._queue.extend(requests)

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        requests, self._queue[:] = list(self._queue), []
        if not requests:
            return []
        pieces = self._sample(requests)
        return [r.complete(p) for r, p in zip(requests, pieces)]

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        ids = None if request_ids is None else set(request_ids)
        dropped = [r for r in self._queue if ids is None or r.request_id in ids]
        self._queue[:] = [r for r in self._queue if not (ids is None or r.request_id in ids)]
        return [r.complete(Trajectory([], [], "aborted", getattr(self, "policy_version", 0))) for r in dropped]

    @property
    def in_flight(self) -> int:
        return len(self._queue)


SEED_STRIDE = 7_919_993  # continuation k of a request samples with seed + k × this, mod 2^31 - 1


def continuation_seed(seed: int | None, k: int) -> int | None:
    """The seed for the k-th continuation of a request (a resumed partial rollout, a later tool turn): reusing the
    request's own seed would replay the random numbers that sampled its earlier tokens against the new ones."""
    return None if seed is None else (int(seed) + k * SEED_STRIDE) % (2**31 - 1)


def completion_seeds(base_seed: int, generation_index: int, n: int) -> list[int]:
    """Distinct, reproducible per-completion seeds for one generation batch."""
    start = (base_seed * 1_000_003 + generation_index * 65_537) % (2**31 - n - 1)
    return [start + i for i in range(n)]


def finish_reason(token_ids: list[int], stop_token_ids) -> str:
    """ "stop" when the completion ends with a stop token (also when it is the last token allowed, as vLLM decides),
    else "length": the one rule every engine reports, so the trainer's `truncated` and `completions/clipped_ratio`
    do not depend on the engine."""
    return "stop" if token_ids and token_ids[-1] in stop_token_ids else "length"


def decode_completion(tokenizer, completion: Trajectory) -> str:
    """A sampled trajectory's tokens as the text reward functions see: without the final stop token, special tokens
    skipped. (Not `cohort.rewards.text.completion_text`, which reads the text out of a completion as the reward
    contract passes it: a string or chat messages.)

    The stop token is cut by position, not by being special: a checkpoint's second
    stop id need not be a special token (e.g. `eos_token_id: [2, 75]` where 75 is a
    plain word piece), and its text is not part of the answer. Special tokens inside
    the completion are skipped as TRL does for rewards (`skip_special_tokens=True`).
    """
    ids = completion.token_ids[:-1] if completion.status == "stop" else completion.token_ids
    return tokenizer.decode(ids, skip_special_tokens=True)
