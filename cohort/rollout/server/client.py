"""`RemoteEngine`: the rollout protocol over HTTP to one or more `cohort serve` servers.

- submit / poll / abort / in_flight (the request level of cohort/rollout/base.py,
  over the server's /submit, /poll, /abort): each submit call is cut into
  contiguous, near-equal slices, one per server, only between runs of equal
  prompts (a group's G requests land on one server, where the prefix cache
  serves them), the least loaded server taking the first slice; poll asks every
  server with requests in flight, in parallel, and returns what any returned;
  abort asks the servers holding the ids. Every reply must report the policy
  version last pushed, every newly sampled token a version between the one
  pushed at submit and that one, and each server must hold exactly the requests
  sent to it and not yet returned; else the run stops (a server that restarted
  would otherwise sample from its initial weights, or lose requests).
  A new client takes its servers over: it aborts whatever an earlier client
  left in flight there (one trainer drives a server).
- generate: the drain of the request level (`generate_requests`): one
  trajectory per prompt, in order; the same results for the same seeds as the
  former one-call /generate, which the server still answers for other clients.
- update_weights: the named tensors are serialised to safetensors one part (at
  most `PART_BYTES`) at a time, each pushed to every server in parallel; a
  re-iterable source (`WeightStream`) is walked twice (sizes, then tensors), so
  the trainer holds one part as tensors and as bytes, never a whole copy of the
  model (LoRA's merged weights and bfloat16 casts are made per part); returns
  the bytes sent over the wire (all servers together). With `in_flight=True`
  (asynchronous training) the servers take the push while requests generate
  (`/weights?...&in_flight=1`) and load it between two of their engine steps;
  `in_flight_updates` is True when every server's engine can (its /health says).
- score: the canary. Server 0's log-probs are returned for the trainer to
  compare with its own; every other server must agree with server 0 to
  `agreement_tolerance`, so a single stale server also stops the run.

Stop tokens: each server stops at the set its engine computed from its own
checkpoint (`cohort.models.pretrained.stop_token_ids`); given the trainer's set,
the constructor checks every server reports the same one.

Every call has a timeout (`timeout_s`), a server with requests in flight that
finishes none of them for `timeout_s` counts as failed, and any failure raises
`RemoteEngineError`: the run fails, it never hangs. The progress check runs
on every `poll` that returns nothing, so a caller polling with short timeouts
(0.1 s, to free its lock) still gets the error after `timeout_s`. Not
thread-safe: one call at a time (base.py's contract; a caller that polls
from one thread and submits from another serialises them with its own lock).
The token comes from `COHORT_SERVER_TOKEN` unless given.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
import urllib.error
import urllib.request
import weakref
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from cohort.config import CohortConfig
from cohort.models.placement import engine_gpus, training_processes, visible_gpus
from cohort.rollout.base import ForwardingEngine, Request, RequestEngineMixin, Trajectory
from cohort.rollout.server.app import TOKEN_ENV, LocalServer, completion_from_json, request_to_json, split_cores
from cohort.rollout.server.request_stream import MAX_POLL_WAIT_S

PART_BYTES = 64 * 2**20  # largest safetensors part per request: what a push holds at once, as tensors and as bytes
LONG_POLL_S = MAX_POLL_WAIT_S - 5.0  # server-side wait of one /poll when one server is busy (it answers at the first result)
POLL_SLICE_S = 0.05  # server-side wait of one /poll round when several are: a finished server waits at most this for the rest


class RemoteEngineError(RuntimeError):
    pass


def split_evenly(n: int, k: int) -> list[tuple[int, int]]:
    """[start, end) of k contiguous slices covering range(n), sizes differing by at most one; empty slices dropped."""
    base, extra = divmod(n, k)
    bounds, start = [], 0
    for i in range(k):
        end = start + base + (1 if i < extra else 0)
        if end > start:
            bounds.append((start, end))
        start = end
    return bounds


def _unique(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor, int]]:
    """(name, tensor, bytes) in order, a tied tensor (one whose storage was already listed and is still alive) once.

    Liveness, not just the address, decides: a tensor made on the fly and already freed may leave its address to the
    next one, which is not a twin (a weak reference to the storage dies with it)."""
    seen: dict[int, weakref.ref] = {}
    for name, tensor in named_tensors:
        tensor = tensor.detach()
        if tensor.numel():
            ptr, earlier = tensor.data_ptr(), seen.get(tensor.data_ptr())
            if earlier is not None and earlier() is not None:  # a tied tensor listed twice: the receiver re-ties it
                continue
            seen[ptr] = weakref.ref(tensor.untyped_storage())
        yield name, tensor, tensor.numel() * tensor.element_size()


def _group(sized: Iterable[tuple[str, torch.Tensor, int]], part_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive parts of at most ~part_bytes; a larger tensor is a part alone. Each part is yielded once complete."""
    part: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor, nbytes in sized:
        if part and size + nbytes > part_bytes:
            yield part
            part, size = [], 0
        part.append((name, tensor))
        size += nbytes
    if part:
        yield part


def plan_weight_parts(named_tensors: Iterable[tuple[str, torch.Tensor]], part_bytes: int = PART_BYTES) -> list[list[tuple[str, torch.Tensor]]]:
    """Group the tensors (in order, tied ones once) into parts of at most ~part_bytes; a larger tensor is a part alone."""
    return list(_group(_unique(named_tensors), part_bytes))


def stream_weight_parts(named_tensors: Iterable[tuple[str, torch.Tensor]], part_bytes: int = PART_BYTES
                        ) -> tuple[int, Iterator[list[tuple[str, torch.Tensor]]]]:
    """(number of parts, the parts one at a time), the same parts as `plan_weight_parts`.

    A re-iterable source (a `WeightStream`, a list) is walked twice: once for the names and sizes (each tensor
    dropped once measured), once for the tensors, so only the part being sent is held; a source with a `layout()`
    ((name, bytes) without making the tensors: multi-process training's gathered weights) is walked once, for the
    tensors. A one-shot iterator is grouped whole first. The tensor walk must list the same names in the same order."""
    if isinstance(named_tensors, Iterator):
        parts = plan_weight_parts(named_tensors, part_bytes)
        return len(parts), iter(parts)
    layout = getattr(named_tensors, "layout", None)
    sizes = layout() if layout is not None else ((name, nbytes) for name, _, nbytes in _unique(named_tensors))
    plan = [[name for name, _ in part] for part in _group(((name, torch.empty(0), nbytes) for name, nbytes in sizes), part_bytes)]

    def walk() -> Iterator[list[tuple[str, torch.Tensor]]]:
        sized = _unique(named_tensors)
        for names in plan:
            part = [(name, tensor) for name, tensor, _ in itertools.islice(sized, len(names))]
            if [name for name, _ in part] != names:
                raise RuntimeError(f"the weights changed between the two walks of one push (part of {names[:2]}...)")
            yield part
            del part  # freed before the next part is made
        if next(sized, None) is not None:
            raise RuntimeError("the weights changed between the two walks of one push (more tensors the second time)")

    return len(plan), walk()


def serialize_part(part: list[tuple[str, torch.Tensor]]) -> bytes:
    from safetensors.torch import save as save_safetensors

    return save_safetensors({name: tensor.to("cpu").contiguous() for name, tensor in part})


def weight_parts(named_tensors: Iterable[tuple[str, torch.Tensor]], part_bytes: int = PART_BYTES) -> Iterable[bytes]:
    """The safetensors blobs a push sends, one per part."""
    return (serialize_part(part) for part in plan_weight_parts(named_tensors, part_bytes))


@dataclass(frozen=True)
class _Sent:
    """A request in flight on a server: where it went and the policy version pushed when it did."""

    server: int
    request: Request
    version: int


class RemoteEngine(RequestEngineMixin):
    def __init__(self, urls: list[str], *, token: str | None = None, timeout_s: float = 300.0,
                 agreement_tolerance: float = 1e-3, min_model_len: int | None = None, stop_token_ids: list[int] | None = None):
        if not urls:
            raise ValueError("RemoteEngine needs at least one server url (engine.server_urls)")
        self.urls = [u.rstrip("/") for u in urls]
        self.token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        self.timeout_s = timeout_s
        self.agreement_tolerance = agreement_tolerance
        self.policy_version = 0
        self.pool = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="cohort-remote")
        self._sent: dict[str, _Sent] = {}
        self._quiet_since = [time.monotonic()] * len(self.urls)  # per server: the last time it returned a trajectory
        self.servers = [self._health(u) for u in self.urls]
        self.stop_token_ids = list(self.servers[0]["stop_token_ids"])
        for url, info in zip(self.urls, self.servers):
            if stop_token_ids is not None and sorted(info.get("stop_token_ids", [])) != sorted(stop_token_ids):
                raise RemoteEngineError(
                    f"rollout server {url} ({info.get('model')}) stops at token ids {info.get('stop_token_ids')} but the trainer's "
                    f"checkpoint stops at {sorted(stop_token_ids)}: the two would end completions at different tokens; "
                    "serve the checkpoint the trainer loads (model.path)"
                )
            limit = info.get("max_model_len")
            if min_model_len and limit and limit < min_model_len:
                raise RemoteEngineError(
                    f"rollout server {url} serves at most {limit} tokens per sequence but this run needs {min_model_len} "
                    f"(longest prompt + rollout.max_completion_length + 1); restart it with `cohort serve ... --max-model-len {min_model_len}`"
                )
        self._each(lambda url: self._post_json(url, "/abort", {"request_ids": None}), self.urls)  # take the servers over: drop
        # whatever an earlier client (a crashed run) left in flight, so its ids and its busy engine do not block this one

    # ------------------------------------------------------------------ http

    def _request(self, url: str, path: str, *, body: bytes | None = None, content_type: str = "application/json",
                 auth: bool = True) -> dict[str, Any]:
        headers = {"Content-Type": content_type}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url + path, data=body, headers=headers, method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("error", "")
            except Exception:
                reason = ""
            raise RemoteEngineError(f"rollout server {url}{path}: HTTP {exc.code} {reason}".rstrip()) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RemoteEngineError(
                f"rollout server {url}{path}: {reason} (no answer within engine.server_timeout_s = {self.timeout_s} s, or unreachable); "
                "is `cohort serve` running there?"
            ) from None

    def _post_json(self, url: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        return self._request(url, path, body=json.dumps(payload).encode())

    def _health(self, url: str) -> dict[str, Any]:
        return self._request(url, "/health", auth=False)

    def _each(self, fn, items):
        return list(self.pool.map(fn, items))

    # ------------------------------------------------------------------ requests

    def _load(self) -> list[int]:
        """Requests in flight per server."""
        load = [0] * len(self.urls)
        for sent in self._sent.values():
            load[sent.server] += 1
        return load

    def _route(self, requests: list[Request]) -> list[tuple[int, list[Request]]]:
        """Contiguous slices of `requests`, one per server, cut only between runs of equal prompts (a group's G
        requests land on one server, where the prefix cache serves them); the least loaded servers take the first."""
        runs, start = [], 0
        for i in range(1, len(requests) + 1):
            if i == len(requests) or requests[i].prompt_ids != requests[start].prompt_ids:
                runs.append((start, i))
                start = i
        load = self._load()
        order = sorted(range(len(self.urls)), key=lambda i: (load[i], i))
        return [(server, requests[runs[a][0]:runs[b - 1][1]]) for server, (a, b) in zip(order, split_evenly(len(runs), len(self.urls)))]

    def submit(self, requests: Sequence[Request]) -> None:
        requests = list(requests)
        ids = [r.request_id for r in requests]
        taken = [i for i in ids if i in self._sent] or [i for i, n in Counter(ids).items() if n > 1]
        if taken:
            raise ValueError(f"RemoteEngine.submit: request id(s) {taken[:5]} are already in flight or repeated; ids must be unique")
        plan = self._route(requests) if requests else []
        load, now = self._load(), time.monotonic()
        for server, _ in plan:
            if not load[server]:
                self._quiet_since[server] = now
        replies = self._each(lambda job: self._post_json(self.urls[job[0]], "/submit", {"requests": [request_to_json(r) for r in job[1]]}), plan)
        for (server, batch), reply in zip(plan, replies):
            self._check_version(server, reply)
            for r in batch:
                self._sent[r.request_id] = _Sent(server, r, self.policy_version)

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        """Polls every server with requests in flight, in parallel, until one returned something or `timeout` passed.

        One busy server is long-polled (it answers as soon as a trajectory is done); several are polled in rounds of
        `POLL_SLICE_S`, so one that finished first is not held up by the others for long."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            busy = [i for i, n in enumerate(self._load()) if n]
            if not busy:
                return []
            wait = min(LONG_POLL_S if len(busy) == 1 else POLL_SLICE_S, self.timeout_s / 2)
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            replies = self._each(lambda i: self._post_json(self.urls[i], "/poll", {"timeout_s": wait}), busy)
            out = [t for i, reply in zip(busy, replies) for t in self._received(i, reply)]
            if out:
                return out
            self._check_progress(busy)  # before giving up on the deadline: short polls must not dodge it
            if deadline is not None and time.monotonic() >= deadline:
                return out

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        targets: dict[int, list[str] | None] = {}
        if request_ids is None:
            targets = {i: None for i, n in enumerate(self._load()) if n}
        else:
            for rid in request_ids:
                if rid in self._sent:
                    targets.setdefault(self._sent[rid].server, []).append(rid)
        jobs = list(targets.items())
        replies = self._each(lambda job: self._post_json(self.urls[job[0]], "/abort", {"request_ids": job[1]}), jobs)
        return [t for (i, _), reply in zip(jobs, replies) for t in self._received(i, reply)]

    @property
    def in_flight(self) -> int:
        return len(self._sent)

    @property
    def in_flight_updates(self) -> bool:
        """Whether every server's engine loads weights under running requests (its /health at connect time)."""
        return all(info.get("in_flight_updates", False) for info in self.servers)

    def _check_version(self, server: int, reply: dict[str, Any]) -> None:
        if reply["policy_version"] != self.policy_version:
            raise RemoteEngineError(
                f"rollout server {self.urls[server]} generated with policy version {reply['policy_version']}, but version "
                f"{self.policy_version} was pushed; did it restart? restart the run (or the server) so they agree"
            )

    def _received(self, server: int, reply: dict[str, Any]) -> list[Trajectory]:
        """The trajectories of a /poll or /abort reply, each checked against what was sent and the pushed version."""
        url = self.urls[server]
        self._check_version(server, reply)
        out = []
        for data in reply["completions"]:
            t = completion_from_json(data)
            sent = self._sent.pop(t.request_id, None)
            if sent is None or sent.server != server:
                raise RemoteEngineError(f"rollout server {url} returned request {t.request_id!r}, which this trainer did not send "
                                        "there; is another client using the server? (one trainer drives a server)")
            resumed = len(sent.request.resume.token_ids) if sent.request.resume is not None else 0
            stale = [v for v in t.versions[resumed:] if not sent.version <= v <= self.policy_version]
            if stale:
                raise RemoteEngineError(
                    f"rollout server {url} sampled request {t.request_id!r} with policy version {stale[0]}, but version "
                    f"{self.policy_version} was pushed; did it restart? restart the run (or the server) so they agree")
            out.append(t)
        if out:
            self._quiet_since[server] = time.monotonic()
        expected = self._load()[server]
        if reply["in_flight"] != expected:
            raise RemoteEngineError(f"rollout server {url} holds {reply['in_flight']} requests in flight, but this trainer sent it "
                                    f"{expected} not yet returned; did it restart, or is another client using it?")
        return out

    def _check_progress(self, busy: list[int]) -> None:
        """A server with requests in flight that finished none for timeout_s stops the run (it never hangs it)."""
        now, load = time.monotonic(), self._load()
        for i in busy:
            if now - self._quiet_since[i] > self.timeout_s:
                raise RemoteEngineError(
                    f"rollout server {self.urls[i]}: {load[i]} request(s) in flight and none finished within "
                    f"engine.server_timeout_s = {self.timeout_s} s; is its engine stuck?")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                       in_flight: bool = False) -> int:
        """Serialise one part at a time and send it to every server in parallel: at most one part is held, as tensors
        and as bytes, when `named_tensors` is re-iterable (`stream_weight_parts`). `in_flight`: the servers load the
        set under their running requests (HTTP 409 without it while any generates)."""
        if in_flight and not self.in_flight_updates:
            raise RemoteEngineError(
                f"update_weights(in_flight=True): rollout server(s) "
                f"{[u for u, i in zip(self.urls, self.servers) if not i.get('in_flight_updates')]} cannot load weights "
                "under running requests (their /health reports in_flight_updates false); update `cohort serve` there")
        count, parts = stream_weight_parts(named_tensors, PART_BYTES)
        sent, replies = 0, []
        for i, part in enumerate(parts):
            blob = serialize_part(part)
            del part  # the tensors: only the bytes are needed from here
            path = f"/weights?version={version}&part={i}&parts={count}" + ("&in_flight=1" if in_flight else "")
            replies = self._each(lambda url, body=blob: self._request(url, path, body=body, content_type="application/octet-stream"),
                                 self.urls)
            sent += len(blob) * len(self.urls)
            del blob  # before the next part is made
        for url, reply in zip(self.urls, replies):
            if reply["policy_version"] != version:
                raise RemoteEngineError(f"rollout server {url} did not load weights version {version} (reports {reply['policy_version']})")
        self.policy_version = version
        return sent

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        payload = {"prompts": [list(map(int, p)) for p in prompts], "completions": [list(map(int, c)) for c in completions],
                   "temperature": temperature}
        replies = self._each(lambda url: self._post_json(url, "/score", payload), self.urls)
        flat = lambda reply: torch.tensor([x for row in reply["logprobs"] for x in row])  # noqa: E731
        first = flat(replies[0])
        for url, reply in zip(self.urls[1:], replies[1:]):
            gap = float((flat(reply) - first).abs().max()) if first.numel() else 0.0
            if not gap <= self.agreement_tolerance:
                raise RemoteEngineError(
                    f"rollout server {url} disagrees with {self.urls[0]} on the canary by {gap:.3g} > {self.agreement_tolerance}: "
                    "they hold different weights"
                )
        return replies[0]["logprobs"]

    def close(self) -> None:
        if self._sent:  # leave the servers idle for the next client; a dead one is no reason to fail a close
            with contextlib.suppress(RemoteEngineError):
                self.abort(None)
        self.pool.shutdown(wait=False)


def engine_cores(cfg: CohortConfig) -> tuple[list[int] | None, int | None]:
    """(cores bound to a local server's engine, the trainer's default thread count) for this config (`split_cores`):
    split when generation runs beside the update (pipeline.max_staleness >= 1)."""
    concurrent = bool(cfg.pipeline.max_staleness)
    return split_cores(sorted(os.sched_getaffinity(0)), cfg.engine.num_threads, concurrent)


class LocalServerEngine(ForwardingEngine):
    """vLLM as a private loopback rollout server (`LocalServer`), driven like server mode; weights go over loopback as safetensors.

    Used by engine.mode=local_server, where generation gets its own process
    and cores (with pipeline.max_staleness >= 1 it runs while the trainer updates, free of
    the trainer's GIL and OpenMP pool), and by rank 0 of a multi-process run,
    since vLLM cannot live inside a rank of a multi-process group (it builds
    its own torch.distributed groups, which would wait for every rank).
    Everything but `close` passes through to the `RemoteEngine` client of that server (`inner`); the stop tokens are
    the ones the server computed from model_dir, as the trainer does.
    """

    def __init__(self, model_dir, cfg: CohortConfig, *, max_model_len: int, dtype: str):
        gpus = engine_gpus(training_processes(cfg), cfg.engine.tensor_parallel_size, visible_gpus())
        self.server = LocalServer(model_dir, dtype=dtype, max_model_len=max_model_len, seed=cfg.rollout.seed,
                                  kv_cache_gib=cfg.engine.kv_cache_gib, gpu_memory_utilization=cfg.engine.gpu_memory_utilization,
                                  cpu_cores=engine_cores(cfg)[0], cuda_devices=gpus.devices if gpus else None,
                                  tensor_parallel_size=cfg.engine.tensor_parallel_size,
                                  chat_template=cfg.model.chat_template, chat_template_kwargs=cfg.model.chat_template_kwargs)
        try:
            self.inner = RemoteEngine([self.server.url], token=self.server.token, timeout_s=cfg.engine.server_timeout_s,
                                      agreement_tolerance=cfg.server_agreement_tolerance, min_model_len=max_model_len)
        except Exception:
            self.server.close()
            raise

    def close(self) -> None:
        self.inner.close()
        self.server.close()
