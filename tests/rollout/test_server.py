"""The rollout server's HTTP contract and RemoteEngine, on loopback, with a fake engine (no vLLM, fast).

The fake engine makes every observable depend on what crossed the wire: its
completions encode the seed and the prompt length, and its canary log-prob is
the sum of the weights it holds, so a lost part or a stale version shows up.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from cohort.rollout.server import client as remote_engine
from cohort.rollout.base import BatchRequests, SamplingConfig, Trajectory
from cohort.rollout.server.client import RemoteEngine, RemoteEngineError, split_evenly, weight_parts
from cohort.rollout.server.app import RolloutService, WeightStager, serve_in_thread

TOKEN = "test-token-123"


class FakeEngine(BatchRequests):
    """Samples whole batches (as every engine does through `BatchRequests` until it streams): two tokens per request."""

    def __init__(self):
        self.policy_version = 0
        self.stop_token_ids = [7, 9]
        self.weights = {"w": torch.zeros(3)}
        self.loads = 0
        self.submitted: list[str] = []  # request ids in the order they reached the engine

    def submit(self, requests):
        self.submitted += [r.request_id for r in requests]
        super().submit(requests)

    def _sample(self, requests):
        if any(r.sampling.max_tokens == 13 for r in requests):
            raise RuntimeError("engine exploded")  # a failure inside the engine: the server's problem (500)
        return [Trajectory([(r.seed or 0) % 1000, len(r.engine_prompt)], [-0.25, -0.5], "length", self.policy_version)
                for r in requests]

    def update_weights(self, named_tensors, version):
        self.weights = {n: t.clone() for n, t in named_tensors}
        self.loads += 1
        self.policy_version = version

    def score(self, prompts, completions, temperature=1.0):
        total = float(sum(t.sum() for t in self.weights.values()))
        return [[total / temperature] * len(c) for c in completions]

    def close(self):
        pass


@pytest.fixture
def served():
    """Two fake servers on loopback threads; yields [(engine, url)]; shut down after the test."""
    out, servers = [], []
    for _ in range(2):
        engine = FakeEngine()
        server, url = serve_in_thread(RolloutService(engine, TOKEN, model="fake", max_model_len=64, vocab_size=100))
        servers.append(server)
        out.append((engine, url))
    yield out
    for server in servers:
        server.shutdown()
        server.server_close()


def _post(url, body=b"{}", headers=None):
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_requests_without_the_right_token_are_refused(served):
    _, url = served[0]
    health = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())  # health needs no token
    assert health == {"status": "ok", "policy_version": 0, "model": "fake", "max_model_len": 64, "vocab_size": 100,
                      "stop_token_ids": [7, 9], "in_flight_updates": False}
    body = json.dumps({"prompts": [[1, 2]], "sampling": {"max_tokens": 2}, "seeds": [1]}).encode()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):  # none, wrong, not a bearer header
        submit = json.dumps({"requests": [{"request_id": "r", "prompt_ids": [1], "sampling": {"max_tokens": 2}}]}).encode()
        for path, payload in (("/generate", body), ("/score", body), ("/weights?version=3", b"x"), ("/submit", submit),
                              ("/poll", b"{}"), ("/abort", b'{"request_ids": null}')):
            with pytest.raises(urllib.error.HTTPError) as info:
                _post(url + path, payload, headers)
            assert info.value.code == 401
    assert served[0][0].policy_version == 0 and served[0][0].loads == 0 and not served[0][0].submitted  # nothing reached the engine
    ok = _post(url + "/generate", body, {"Authorization": f"Bearer {TOKEN}"})
    assert ok["completions"][0]["token_ids"] == [1, 2]
    with pytest.raises(RemoteEngineError, match="HTTP 401"):
        RemoteEngine([url], token="wrong").generate([[1]], SamplingConfig(2), [0])


def test_server_refuses_to_start_without_a_token():
    with pytest.raises(ValueError, match="COHORT_SERVER_TOKEN"):
        RolloutService(FakeEngine(), "")


def test_generation_is_split_across_servers_in_order_and_reports_the_pushed_version(served, monkeypatch):
    (e0, u0), (e1, u1) = served
    engine = RemoteEngine([u0, u1], token=TOKEN, timeout_s=10)
    prompts = [[7] * n for n in range(1, 6)]  # 5 prompts: server 0 gets 3, server 1 gets 2
    outs = engine.generate(prompts, SamplingConfig(2), seeds=[100, 101, 102, 103, 104])
    assert [o.token_ids for o in outs] == [[100, 1], [101, 2], [102, 3], [103, 4], [104, 5]]
    assert [o.logprobs for o in outs] == [[-0.25, -0.5]] * 5 and all(o.status == "length" for o in outs)
    # push in parts of at most 16 bytes: 3 tensors of 12, 12 and 40 bytes -> 3 parts per server
    monkeypatch.setattr(remote_engine, "PART_BYTES", 16)
    named = [("a", torch.ones(3)), ("b", torch.full((3,), 2.0)), ("c", torch.full((10,), 0.5))]
    sent = engine.update_weights(named, 7)
    assert sent == 2 * sum(len(b) for b in weight_parts(named, 16)) and len(list(weight_parts(named, 16))) == 3
    for fake in (e0, e1):  # loaded once, whole: 3 + 6 + 5
        assert fake.loads == 1 and fake.policy_version == 7 and sorted(fake.weights) == ["a", "b", "c"]
        assert fake.score([[1]], [[2]]) == [[14.0]]
    assert engine.score([[1], [4]], [[2, 3], [5]]) == [[14.0, 14.0], [14.0]]
    assert {o.policy_version for o in engine.generate(prompts, SamplingConfig(2), None)} == {7}


def test_a_stale_server_stops_the_run(served):
    (e0, u0), (e1, u1) = served
    engine = RemoteEngine([u0, u1], token=TOKEN, timeout_s=10)
    engine.update_weights([("w", torch.ones(2))], 1)
    e1.update_weights([("w", torch.zeros(2))], 1)  # server 1 silently lost its weights
    with pytest.raises(RemoteEngineError, match="disagrees .* on the canary by 2"):
        engine.score([[1]], [[2]])
    e1.policy_version = 0  # as after a restart
    with pytest.raises(RemoteEngineError, match="generated with policy version 0, but version 1 was pushed"):
        engine.generate([[1], [2]], SamplingConfig(2), [0, 1])


def test_a_silent_server_times_out_instead_of_hanging():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    start = time.perf_counter()
    try:
        with pytest.raises(RemoteEngineError, match="engine.server_timeout_s = 0.5"):
            RemoteEngine([url], token=TOKEN, timeout_s=0.5)
    finally:
        listener.close()
    assert time.perf_counter() - start < 5
    with pytest.raises(RemoteEngineError, match="is `cohort serve` running there"):  # nothing listening at all
        RemoteEngine([url], token=TOKEN, timeout_s=0.5)


def test_the_server_reports_engine_errors_and_keeps_serving(served):
    engine, url = served[0]
    remote = RemoteEngine([url], token=TOKEN, timeout_s=10)
    with pytest.raises(RemoteEngineError, match="HTTP 500 RuntimeError: engine exploded"):
        remote._post_json(url, "/generate", {"prompts": [[1]], "sampling": {"max_tokens": 13}})
    with pytest.raises(RemoteEngineError, match=r"HTTP 400 generate.sampling has unknown key\(s\) \['bogus'\]"):
        remote._post_json(url, "/generate", {"prompts": [[1]], "sampling": {"max_tokens": 2, "bogus": 1}})
    assert remote.generate([[1]], SamplingConfig(2), [5])[0].token_ids == [5, 1]


def test_too_short_server_is_reported_with_the_fix(served):
    _, url = served[0]
    with pytest.raises(RemoteEngineError, match="--max-model-len 100"):
        RemoteEngine([url], token=TOKEN, min_model_len=100)


_GEN = {"prompts": [[1, 2]], "sampling": {"max_tokens": 2}}
_REQ = {"request_id": "r0", "prompt_ids": [1, 2], "sampling": {"max_tokens": 4}, "seed": 1}
_PART = {"token_ids": [3, 4], "logprobs": [-1.0, -2.0], "status": "aborted", "policy_version": 0}  # as /abort returns one
MALFORMED = [  # (method, path, body, status, what the message must say); the served model: vocab 100, max_model_len 64
    ("POST", "/generate", b"not json", 400, "generate: the body is not valid JSON"),
    ("POST", "/generate", b"[1, 2]", 400, "generate: the body must be a JSON object, got a list"),
    ("POST", "/generate", {"sampling": {"max_tokens": 2}}, 400, "generate: missing key 'prompts' (the body has ['sampling'])"),
    ("POST", "/generate", {"prompts": [[1]]}, 400, "generate: missing key 'sampling'"),
    ("POST", "/generate", {**_GEN, "prompts": [[1, 2], [3, 100]]}, 400,
     "generate.prompts[1][1] = 100 is outside the vocabulary (token ids are 0..99)"),  # vocab 100: ids 0..99
    ("POST", "/generate", {**_GEN, "prompts": [[-1]]}, 400, "generate.prompts[0][0] = -1 is outside the vocabulary"),
    ("POST", "/generate", {**_GEN, "prompts": [[1, "2"]]}, 400, 'generate.prompts[0][1] must be an integer token id, got "2"'),
    ("POST", "/generate", {**_GEN, "prompts": [[1, True]]}, 400, "generate.prompts[0][1] must be an integer token id, got true"),
    ("POST", "/generate", {**_GEN, "prompts": "12"}, 400, "generate.prompts must be a non-empty list of token-id lists"),
    ("POST", "/generate", {**_GEN, "prompts": [[1] * 65]}, 400, "generate.prompts[0] is 65 tokens, more than the server's max_model_len = 64"),
    ("POST", "/generate", {**_GEN, "sampling": {"max_tokens": "2"}}, 400, 'generate.sampling.max_tokens must be an integer >= 1, got "2"'),
    ("POST", "/generate", {**_GEN, "sampling": {"max_tokens": 2, "top_p": 0}}, 400, "generate.sampling.top_p must be a number in (0, 1], got 0"),
    ("POST", "/generate", {**_GEN, "seeds": [1, 2]}, 400, "generate.seeds must be null or a list of 1 integers"),
    ("POST", "/score", {"prompts": [[1]], "completions": [[]]}, 400, "score.completions[0] must be a non-empty list of token ids, got []"),
    ("POST", "/score", {"prompts": [[1]], "completions": [[2]], "temperature": 0}, 400, "score.temperature must be a number > 0, got 0"),
    ("POST", "/score", {"completions": [[2]]}, 400, "score: missing key 'prompts'"),
    ("POST", "/score", {"prompts": [[1], [1]], "completions": [[2]]}, 400, "score.prompts and score.completions must be non-empty lists of token-id lists of the same length"),
    ("POST", "/submit", {}, 400, "submit: missing key 'requests'"),
    ("POST", "/submit", {"requests": []}, 400, "submit.requests must be a non-empty list of request objects"),
    ("POST", "/submit", {"requests": [{**_REQ, "request_id": ""}]}, 400, 'submit.requests[0].request_id must be a non-empty string, got ""'),
    ("POST", "/submit", {"requests": [_REQ, {**_REQ, "seed": 2}]}, 400, "submit.requests[1].request_id 'r0' repeats submit.requests[0]'s"),
    ("POST", "/submit", {"requests": [{**_REQ, "prompt_ids": [1, 100]}]}, 400,
     "submit.requests[0].prompt_ids[1] = 100 is outside the vocabulary (token ids are 0..99)"),
    ("POST", "/submit", {"requests": [{**_REQ, "sampling": {"max_tokens": 2, "top_k": -1}}]}, 400,
     "submit.requests[0].sampling.top_k must be an integer >= 0 (0: off), got -1"),
    ("POST", "/submit", {"requests": [{**_REQ, "seed": 1.5}]}, 400, "submit.requests[0].seed must be an integer or null, got 1.5"),
    ("POST", "/submit", {"requests": [{**_REQ, "n": 2}]}, 400, "submit.requests[0] has unknown key(s) ['n']"),
    ("POST", "/submit", {"requests": [{**_REQ, "resume": {**_PART, "status": "length"}}]}, 400,
     'submit.requests[0].resume.status must be "aborted" (only an aborted trajectory is continued), got "length"'),
    ("POST", "/submit", {"requests": [{**_REQ, "resume": {**_PART, "token_ids": [3, 100]}}]}, 400,
     "submit.requests[0].resume.token_ids[1] = 100 is outside the vocabulary"),
    ("POST", "/submit", {"requests": [{**_REQ, "resume": {**_PART, "logprobs": [-1.0]}}]}, 400,
     "submit.requests[0].resume.logprobs must be a list of 2 numbers (one per token), got [-1.0]"),
    ("POST", "/submit", {"requests": [{**_REQ, "resume": {**_PART, "loss_mask": [1, 2]}}]}, 400,
     "submit.requests[0].resume.loss_mask[1] must be one of the 0/1 integers, got 2"),
    # 63 prompt tokens fit max_model_len 64; with the 2 resumed tokens they are 65
    ("POST", "/submit", {"requests": [{**_REQ, "prompt_ids": [1] * 63, "resume": _PART}]}, 400,
     "submit.requests[0].prompt_ids + resume.token_ids is 65 tokens, more than the server's max_model_len = 64"),
    ("POST", "/poll", {"timeout_s": -1}, 400, "poll.timeout_s must be a number >= 0"),
    ("POST", "/abort", {}, 400, "abort: missing key 'request_ids'"),
    ("POST", "/abort", {"request_ids": "r0"}, 400, 'abort.request_ids must be a list of request id strings, or null for all, got "r0"'),
    ("POST", "/weights", b"x", 400, "weights: missing query parameter 'version'"),
    ("POST", "/weights?version=one", b"x", 400, "weights: query parameter version must be an integer, got 'one'"),
    ("POST", "/weights?version=1&part=2&parts=2", b"x", 400, "weights: part 2 of parts=2 is out of range"),
    ("POST", "/weights?version=1", b"garbage", 400, "weights: the body is not a safetensors file"),
    ("POST", "/nope", b"{}", 404, "no such endpoint: POST /nope; POST /generate, /score, /weights, /submit, /poll, /abort, /v1/chat/completions, "
     "GET /health, /v1/models"),
    ("GET", "/nope", None, 404, "no such endpoint: GET /nope"),
]


@pytest.mark.parametrize("method, path, body, status, message", MALFORMED, ids=[f"{m[1]}-{i}" for i, m in enumerate(MALFORMED)])
def test_malformed_requests_get_a_client_error_that_says_what_was_wrong(served, method, path, body, status, message):
    engine, url = served[0]
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    request = urllib.request.Request(url + path, data=data, method=method, headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == status
    assert info.value.headers["Content-Type"] == "application/json"
    error = json.loads(info.value.read())["error"]
    assert error.startswith(message) if status == 400 else message in error
    assert engine.policy_version == 0 and engine.loads == 0 and not engine.submitted  # nothing reached the engine
    assert _post(url + "/generate", json.dumps(_GEN).encode(), {"Authorization": f"Bearer {TOKEN}"})["completions"]  # still serving


def test_a_server_with_other_stop_tokens_is_refused_at_connect(served):
    urls = [url for _, url in served]
    assert RemoteEngine(urls, token=TOKEN, stop_token_ids=[9, 7]).stop_token_ids == [7, 9]  # the same set, any order
    served[1][0].stop_token_ids = [7]  # e.g. served from a checkpoint without the second eos id
    with pytest.raises(RemoteEngineError, match=r"stops at token ids \[7\] but the trainer's checkpoint stops at \[7, 9\]"):
        RemoteEngine(urls, token=TOKEN, stop_token_ids=[7, 9])


def test_stager_loads_only_complete_sets():
    stager = WeightStager()
    assert stager.add(1, 0, 2, {"a": 1, "x": 9}) is None
    assert stager.add(2, 0, 2, {"a": 3}) is None  # an interrupted push of version 1 is dropped ...
    assert stager.add(2, 1, 2, {"b": 2}) == {"a": 3, "b": 2}  # ... none of it leaks into version 2
    assert stager.add(3, 1, 2, {"b": 5}) is None  # a part without its set's part 0 never completes alone
    with pytest.raises(ValueError, match="out of range"):
        stager.add(3, 2, 2, {})


def test_split_evenly():
    assert split_evenly(5, 2) == [(0, 3), (3, 5)]
    assert split_evenly(1, 3) == [(0, 1)]
    assert split_evenly(6, 3) == [(0, 2), (2, 4), (4, 6)]


def test_concurrent_health_answers_during_a_slow_generation(served):
    engine, url = served[0]
    release = threading.Event()
    slow = engine._sample
    engine._sample = lambda *a, **k: (release.wait(5), slow(*a, **k))[1]
    remote = RemoteEngine([url], token=TOKEN, timeout_s=10)
    worker = threading.Thread(target=remote.generate, args=([[1]], SamplingConfig(2), [0]))
    worker.start()
    try:
        time.sleep(0.1)
        assert json.loads(urllib.request.urlopen(url + "/health", timeout=2).read())["status"] == "ok"
    finally:
        release.set()
        worker.join()


def test_server_mode_config_problems_name_the_fix(monkeypatch):
    from cohort.config import ConfigError
    from cohort.config.resolve import load_config
    from cohort.plan.validate import validate_config

    monkeypatch.delenv("COHORT_SERVER_TOKEN", raising=False)
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(None, ["engine.mode=server", "engine.server_timeout_s=0"]), check_files=False)
    text = str(info.value)
    assert "engine.server_urls is empty; start `cohort serve MODEL_DIR --port 8400`" in text
    assert "export COHORT_SERVER_TOKEN" in text and "engine.server_timeout_s = 0" in text
    monkeypatch.setenv("COHORT_SERVER_TOKEN", "t")
    with pytest.raises(ConfigError, match=r"must start with http:// or https://"):
        validate_config(load_config(None, ["engine.mode=server", "engine.server_urls=[127.0.0.1:8400]"]), check_files=False)
    validate_config(load_config(None, ["engine.mode=server", "engine.server_urls=[http://127.0.0.1:8400]"]), check_files=False)
    monkeypatch.delenv("COHORT_SERVER_TOKEN")  # under Ray the driver starts the servers and makes the token
    if importlib.util.find_spec("ray") is not None:
        validate_config(load_config(None, ["engine.mode=server", "distributed.backend=ray"]), check_files=False)


def test_split_cores_between_a_local_server_and_the_trainer():
    from cohort.rollout.server.app import split_cores

    # no overlap, nothing asked: the two take turns, each keeps its default (every core)
    assert split_cores([0, 1], None, False) == (None, None)
    # overlap: the engine takes the last half (at least one core), the trainer's thread count is the rest
    assert split_cores([0, 1], None, True) == ([1], 1)
    assert split_cores([3, 1, 2, 0], None, True) == ([2, 3], 2)
    assert split_cores([4, 5, 6], None, True) == ([6], 2)  # 3 // 2 = 1 core for the engine
    assert split_cores([0], None, True) == ([0], 1)  # one core: shared, the trainer still gets a thread
    # asked for: that many of the last cores (clamped to what exists); the trainer keeps its default without overlap
    assert split_cores([3, 1, 2, 0], 3, True) == ([1, 2, 3], 1)
    assert split_cores([0, 1, 2, 3], 1, False) == ([3], None)
    assert split_cores([0, 1], 5, True) == ([0, 1], 1)
