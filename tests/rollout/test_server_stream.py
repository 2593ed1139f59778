"""The request level over HTTP (/submit, /poll, /abort) and RemoteEngine's side of it, with fake engines (no vLLM, fast).

Two fakes: `StreamingFake` generates one token per request per engine step, so requests finish
one by one and an abort catches them half way (as vLLM streaming does); `BatchFake` samples whole
batches through `BatchRequests` (as every engine does until it streams). Tokens are a function of
(seed, position), so a resumed request must end exactly as an uninterrupted one.
"""

from __future__ import annotations

import json
from dataclasses import replace
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from cohort.rollout.base import BatchRequests, Request, SamplingConfig, Trajectory
from cohort.rollout.server.client import RemoteEngine, RemoteEngineError
from cohort.rollout.server.app import RolloutService, request_from_json, request_to_json, serve_in_thread

TOKEN = "stream-token"
STEP_S = 0.002  # one fake engine step


def fake_token(seed: int, position: int) -> tuple[int, float]:
    """The token at absolute position `position` (prompt included) and its log-prob: ids 10..99, never a stop id."""
    return 10 + (seed * 31 + position) % 90, -0.01 * (1 + position % 7)


class StreamingFake:
    """submit / poll / abort as a streaming engine: every poll step adds one token to each running request."""

    def __init__(self):
        self.policy_version = 0
        self.stop_token_ids = [7, 9]
        self.running: dict[str, tuple[Request, list[int], list[float]]] = {}
        self.weights_loaded = 0

    def submit(self, requests):
        for r in requests:
            self.running[r.request_id] = (r, [], [])

    def _piece(self, r: Request, ids, logps, status) -> Trajectory:
        return r.complete(Trajectory(list(ids), list(logps), status, self.policy_version))

    def poll(self, timeout=None):
        deadline = time.monotonic() + (timeout if timeout is not None else 60)
        while self.running:
            time.sleep(STEP_S)
            done = []
            for rid, (r, ids, logps) in list(self.running.items()):
                if len(ids) < r.remaining.max_tokens:
                    token, logp = fake_token(r.seed, len(r.engine_prompt) + len(ids))
                    ids.append(token)
                    logps.append(logp)
                if len(ids) >= r.remaining.max_tokens:
                    done.append(self._piece(r, ids, logps, "length"))
                    del self.running[rid]
            if done or time.monotonic() >= deadline:
                return done
        return []

    def abort(self, request_ids=None):
        ids = list(self.running) if request_ids is None else [i for i in request_ids if i in self.running]
        return [self._piece(*self.running.pop(i), "aborted") for i in ids]

    @property
    def in_flight(self):
        return len(self.running)

    def update_weights(self, named_tensors, version):
        self.weights_loaded += 1
        self.policy_version = version

    def score(self, prompts, completions, temperature=1.0):
        return [[0.0] * len(c) for c in completions]


class BatchFake(BatchRequests):
    """Whole batches at once; records which request ids reached it."""

    def __init__(self):
        self.policy_version = 0
        self.stop_token_ids = [7, 9]
        self.submitted: list[str] = []
        self.stamp: int | None = None  # stamp tokens with this version instead of the engine's (a confused engine)

    def submit(self, requests):
        self.submitted += [r.request_id for r in requests]
        super().submit(requests)

    def _sample(self, requests):
        if any(r.sampling.max_tokens == 13 for r in requests):
            raise RuntimeError("engine exploded")
        version = self.policy_version if self.stamp is None else self.stamp
        return [Trajectory([(r.seed or 0) % 100, len(r.engine_prompt)], [-0.25, -0.5], "length", version) for r in requests]

    def update_weights(self, named_tensors, version):
        self.policy_version = version


@pytest.fixture
def serve():
    """serve(engine) -> url of a loopback server for it; every server is shut down after the test."""
    servers = []

    def start(engine):
        service = RolloutService(engine, TOKEN, model="fake", max_model_len=4096, vocab_size=100)
        server, url = serve_in_thread(service)
        servers.append((server, service))
        return url

    yield start
    for server, service in servers:
        server.shutdown()
        server.server_close()
        service.close()


def _post(url, body, token=TOKEN):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _drain(engine, timeout_s=10.0):
    out, deadline = [], time.monotonic() + timeout_s
    while engine.in_flight and time.monotonic() < deadline:
        out += engine.poll(1.0)
    return out


def test_request_json_round_trip():
    part = Trajectory([11, 12], [-0.5, -0.25], "aborted", 2, [2, 3], [1, 0], request_id="q")
    r = Request("q", (1, 2, 3), SamplingConfig(8, 0.7, 0.9, 5), 42, part)
    back = request_from_json(json.loads(json.dumps(request_to_json(r))))
    assert back == Request("q", (1, 2, 3), SamplingConfig(8, 0.7, 0.9, 5), 42, replace(part, prompt_ids=[1, 2, 3]))
    assert request_from_json(request_to_json(Request("p", (4,), SamplingConfig(3)))) == Request("p", (4,), SamplingConfig(3))


def test_requests_stream_back_one_by_one_and_an_aborted_one_resumes_to_the_uninterrupted_trajectory(serve):
    fake = StreamingFake()
    engine = RemoteEngine([serve(fake)], token=TOKEN, timeout_s=10)
    prompt, seed, sampling = (1, 2, 3), 5, SamplingConfig(100_000)
    engine.submit([Request("short", prompt, SamplingConfig(3), 4), Request("long", prompt, sampling, seed)])
    first = engine.poll()
    assert [t.request_id for t in first] == ["short"] and first[0].status == "length"  # streamed: the long one still runs
    # positions 3, 4, 5 follow the 3-token prompt
    assert first[0].token_ids == [fake_token(4, p)[0] for p in (3, 4, 5)] and engine.in_flight == 1
    time.sleep(0.05)
    (partial,) = engine.abort(["long"])
    k = len(partial.token_ids)
    assert partial.status == "aborted" and partial.request_id == "long" and 3 <= k < 100_000 and engine.in_flight == 0
    assert partial.token_ids == [fake_token(seed, 3 + i)[0] for i in range(k)]
    assert partial.prompt_ids == list(prompt) and partial.versions == [0] * k
    assert engine.abort(["long"]) == [] and engine.poll(0.1) == []  # gone from the server: nothing left to return

    total = k + 6
    engine.submit([Request("long", prompt, SamplingConfig(total), seed, resume=partial)])
    (resumed,) = _drain(engine)
    assert resumed.status == "length" and len(resumed.token_ids) == total
    assert resumed.token_ids[:k] == partial.token_ids and resumed.logprobs[:k] == partial.logprobs  # the old tokens kept as sent
    assert resumed.prompt_ids == list(prompt) and resumed.request_id == "long"
    (whole,) = engine.generate([list(prompt)], SamplingConfig(total), [seed])  # the same request, never interrupted
    assert (resumed.token_ids, resumed.logprobs) == (whole.token_ids, whole.logprobs)


def test_weights_score_and_generate_wait_while_requests_generate(serve):
    fake = StreamingFake()
    url = serve(fake)
    engine = RemoteEngine([url], token=TOKEN, timeout_s=10)
    engine.submit([Request("long", (1,), SamplingConfig(100_000), 1)])
    with pytest.raises(RemoteEngineError, match=r"HTTP 409 weights: 1 request\(s\) submitted through /submit are still "
                                                r"generating; poll them to the end or /abort them first"):
        engine.update_weights([("w", torch.ones(2))], 1)
    with pytest.raises(RemoteEngineError, match="HTTP 409 score: 1 request"):
        engine.score([[1]], [[2]])
    with pytest.raises(urllib.error.HTTPError) as info:
        _post(url + "/generate", {"prompts": [[1]], "sampling": {"max_tokens": 2}})
    assert info.value.code == 409
    with pytest.raises(urllib.error.HTTPError) as info:  # the same id twice in flight
        _post(url + "/submit", {"requests": [{"request_id": "long", "prompt_ids": [1], "sampling": {"max_tokens": 2}}]})
    assert info.value.code == 400 and "request id(s) ['long'] are already in flight on this server" in json.loads(info.value.read())["error"]
    assert fake.weights_loaded == 0 and engine.policy_version == 0
    assert [t.status for t in engine.abort()] == ["aborted"]
    assert engine.update_weights([("w", torch.ones(2))], 1) > 0 and fake.policy_version == 1  # idle again: syncs


def test_a_group_lands_whole_on_one_server_and_the_next_submit_on_the_least_loaded(serve):
    fakes = [BatchFake(), BatchFake()]
    engine = RemoteEngine([serve(f) for f in fakes], token=TOKEN, timeout_s=10)
    a, b, c, d = (1,), (2, 2), (3, 3, 3), (4,)
    requests = [Request(f"g/{i}", p, SamplingConfig(2), 10 + i) for i, p in enumerate([a, a, b, b, c, c])]
    engine.submit(requests)
    # 3 groups over 2 servers: split_evenly(3, 2) = groups {0, 1} and {2}; never a cut inside a group of 2
    assert fakes[0].submitted == ["g/0", "g/1", "g/2", "g/3"] and fakes[1].submitted == ["g/4", "g/5"]
    engine.submit([Request("h/0", d, SamplingConfig(2), 20), Request("h/1", d, SamplingConfig(2), 21)])
    assert fakes[1].submitted[-2:] == ["h/0", "h/1"]  # server 1 held 2 in flight, server 0 held 4
    got = {t.request_id: t.token_ids for t in _drain(engine)}
    # the fake answers [seed % 100, prompt length]
    assert got == {"g/0": [10, 1], "g/1": [11, 1], "g/2": [12, 2], "g/3": [13, 2], "g/4": [14, 3], "g/5": [15, 3],
                   "h/0": [20, 1], "h/1": [21, 1]}
    outs = engine.generate([[7] * n for n in range(1, 6)], SamplingConfig(2), seeds=[100, 101, 102, 103, 104])
    assert [o.token_ids for o in outs] == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]  # in order, as the batch call gave them
    assert len(fakes[0].submitted) == 4 + 3 and len(fakes[1].submitted) == 4 + 2  # 5 distinct prompts: 3 and 2


def test_a_server_that_lost_requests_or_samples_with_a_stale_version_stops_the_run(serve):
    fake = StreamingFake()
    url = serve(fake)
    engine = RemoteEngine([url], token=TOKEN, timeout_s=10)
    engine.submit([Request("x", (1,), SamplingConfig(100_000), 1)])
    _post(url + "/abort", {"request_ids": None})  # as if the server restarted: it no longer holds the request
    with pytest.raises(RemoteEngineError, match="holds 0 requests in flight, but this trainer sent it 1 not yet returned; did it restart"):
        engine.poll(1.0)

    batch = BatchFake()
    engine = RemoteEngine([serve(batch)], token=TOKEN, timeout_s=10)
    engine.update_weights([("w", torch.ones(1))], 3)
    batch.stamp = 2  # the server reports version 3 but its engine samples with version 2's weights
    with pytest.raises(RemoteEngineError, match="sampled request 'b[0-9]+/0' with policy version 2, but version 3 was pushed"):
        engine.generate([[1]], SamplingConfig(2), [0])


def test_an_engine_failure_while_streaming_comes_back_as_error_trajectories_and_the_server_keeps_serving(serve):
    engine = RemoteEngine([serve(BatchFake())], token=TOKEN, timeout_s=10)
    with pytest.raises(RuntimeError, match=r"the rollout engine failed on request b[0-9]+/0: RuntimeError: engine exploded"):
        engine.generate([[1]], SamplingConfig(13), [0])
    assert engine.in_flight == 0
    assert engine.generate([[1, 2]], SamplingConfig(2), [7])[0].token_ids == [7, 2]


def test_a_new_client_takes_the_server_over_and_a_silent_engine_fails_the_run(serve):
    fake = StreamingFake()
    url = serve(fake)
    crashed = RemoteEngine([url], token=TOKEN, timeout_s=10)
    crashed.submit([Request("b0/0", (1,), SamplingConfig(100_000), 1)])  # a run that died with this in flight
    fresh = RemoteEngine([url], token=TOKEN, timeout_s=10)  # its restart reuses the id
    assert fake.in_flight == 0
    fresh.submit([Request("b0/0", (1,), SamplingConfig(2), 1)])
    assert [t.request_id for t in _drain(fresh)] == ["b0/0"]

    stuck = threading.Event()
    fake.poll = lambda timeout=None: (stuck.wait(timeout), [])[1]  # an engine that never finishes anything
    slow = RemoteEngine([url], token=TOKEN, timeout_s=0.5)
    slow.submit([Request("s", (1,), SamplingConfig(2), 1)])
    start = time.monotonic()
    with pytest.raises(RemoteEngineError, match=r"1 request\(s\) in flight and none finished within engine.server_timeout_s = 0.5 s"):
        slow.poll()
    assert time.monotonic() - start < 3


def test_abort_returns_a_request_that_already_finished_as_finished(serve):
    batch = BatchFake()
    engine = RemoteEngine([serve(batch)], token=TOKEN, timeout_s=10)
    engine.submit([Request("done", (1, 2), SamplingConfig(2), 3)])
    deadline = time.monotonic() + 5
    while batch.in_flight and time.monotonic() < deadline:  # the driver sampled it (the adapter's queue is empty)
        time.sleep(0.01)
    time.sleep(0.05)  # and put it in the outbox: never polled, it waits there
    (t,) = engine.abort(None)
    assert (t.request_id, t.status, t.token_ids) == ("done", "length", [3, 2]) and engine.in_flight == 0


def test_engine_lock_lets_a_caller_in_before_the_drivers_next_poll():
    """EngineLock: a `with lock:` caller that waits while the driver holds the lock gets it as soon as that hold ends,
    before the driver's next one. Each driver hold ("one engine poll") lasts until the test releases it, so the order
    is checked, not timed. With a plain lock (or a driver that ignores waiting callers) the driver takes the lock
    straight back and the caller starves behind its next hold (measured with the old lock: the trainer waited 0.11 s
    a step)."""
    from cohort.rollout.base import EngineLock

    lock, holds, stop = EngineLock(), [], threading.Event()
    gate, in_hold = threading.Semaphore(0), threading.Event()

    def drive():
        while not stop.is_set():
            with lock.driver():
                holds.append(len(holds))
                in_hold.set()
                gate.acquire(timeout=10)  # the poll in progress, until the test ends it

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        for _ in range(5):
            assert in_hold.wait(timeout=10)
            in_hold.clear()
            during, seen = len(holds), []
            caller = threading.Thread(target=lambda: (lock.__enter__(), seen.append(len(holds)), lock.__exit__()), daemon=True)
            caller.start()
            deadline = time.monotonic() + 10
            while lock._waiting == 0 and time.monotonic() < deadline:  # the caller now waits for the hold in progress
                time.sleep(0.001)
            gate.release()  # that poll ends
            caller.join(timeout=5)
            assert seen == [during], f"the driver started {len(holds) - during} more hold(s) before the waiting caller"
    finally:
        stop.set()
        for _ in range(3):
            gate.release()
        driver.join(timeout=10)


def test_engine_lock_is_reentrant_for_its_holder():
    from cohort.rollout.base import EngineLock

    lock, got = EngineLock(), []
    with lock:
        with lock:  # the trainer's weight push inside its own engine call, say
            got.append("inner")
        other = threading.Thread(target=lambda: (lock.__enter__(), got.append("other"), lock.__exit__()))
        other.start()
        other.join(timeout=0.2)
        assert other.is_alive()  # still held by this thread after the inner exit
    other.join(timeout=5)
    assert got == ["inner", "other"]
    with lock.driver():
        with lock:  # a driver's poll that calls back into the lock (the eval's generate) does not deadlock
            got.append("driver+caller")
    assert got[-1] == "driver+caller"
