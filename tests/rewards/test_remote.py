"""remote: POST JSON to a loopback server started here; retries, timeouts, bad replies."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from cohort.rewards import RewardEntry, RewardError, RewardSet, get


class Handler(BaseHTTPRequestHandler):
    calls: dict = {}

    def log_message(self, *args):
        pass

    def _reply(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, request, dict(self.headers)))
        count = self.server.calls[self.path] = self.server.calls.get(self.path, 0) + 1
        lengths = [len(c) for c in request["completions"]]
        if self.path == "/score":
            self._reply(200, [float(n) if n else None for n in lengths])
        elif self.path == "/wrapped":
            self._reply(200, {"rewards": [1.0] * len(lengths)})
        elif self.path == "/flaky":
            self._reply(503, {"error": "busy"}) if count <= 2 else self._reply(200, [0.5] * len(lengths))
        elif self.path == "/bad":
            self._reply(400, {"error": "missing field"})
        elif self.path == "/short":
            self._reply(200, [1.0])
        elif self.path == "/slow":
            time.sleep(1.0)
            self._reply(200, [1.0] * len(lengths))


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.requests, httpd.calls = [], {}
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def call(reward, n=3, **columns):
    completions = ["a" * i for i in range(n)]
    return reward(prompts=["p"] * n, completions=completions, completion_ids=[[1] * i for i in range(n)], **columns)


def test_posts_every_column_and_reads_a_list(server):
    httpd, base = server
    reward = get("remote", url=f"{base}/score")
    assert call(reward, answer=np.array([1, 2, 3]), level=["x", "y", "z"]) == [None, 1.0, 2.0]
    path, body, headers = httpd.requests[0]
    assert body == {
        "prompts": ["p", "p", "p"],
        "completions": ["", "a", "aa"],
        "completion_ids": [[], [1], [1, 1]],
        "answer": [1, 2, 3],
        "level": ["x", "y", "z"],
    }
    assert headers["Content-Type"] == "application/json"


def test_chunks_and_wrapped_reply(server, monkeypatch):
    httpd, base = server
    monkeypatch.setenv("COHORT_TEST_TOKEN", "s3cret")
    reward = get("remote", url=f"{base}/wrapped", batch_size=2, api_key_env="COHORT_TEST_TOKEN")
    assert call(reward, n=5) == [1.0] * 5
    assert sorted(len(body["completions"]) for _, body, _ in httpd.requests) == [1, 2, 2]
    assert all(headers["Authorization"] == "Bearer s3cret" for _, _, headers in httpd.requests)


def test_retries_server_errors(server):
    httpd, base = server
    reward = get("remote", url=f"{base}/flaky", max_retries=3, backoff_s=0.01)
    assert call(reward) == [0.5] * 3
    assert httpd.calls["/flaky"] == 3  # two 503s, then the answer


def test_gives_up_after_retries_and_on_client_errors(server):
    httpd, base = server
    with pytest.raises(Exception, match="HTTP 503"):
        call(get("remote", url=f"{base}/flaky", max_retries=1, backoff_s=0.01))
    assert httpd.calls["/flaky"] == 2
    with pytest.raises(Exception, match="HTTP 400"):
        call(get("remote", url=f"{base}/bad", max_retries=3, backoff_s=0.01))
    assert httpd.calls["/bad"] == 1  # a 400 is not retried


def test_timeout_and_unreachable(server):
    _, base = server
    start = time.monotonic()
    with pytest.raises(Exception, match="unreachable after 2 tries"):
        call(get("remote", url=f"{base}/slow", request_timeout_s=0.2, max_retries=1, backoff_s=0.01))
    assert time.monotonic() - start < 1.0
    with pytest.raises(Exception, match="unreachable"):
        call(get("remote", url="http://127.0.0.1:9/score", max_retries=0))  # port 9: nobody listens


def test_wrong_shape_in_a_reward_set(server):
    _, base = server
    entries = [RewardEntry("remote", get("remote", url=f"{base}/short"))]
    with RewardSet(entries) as rs:
        with pytest.raises(RewardError, match=r"'remote' failed.*must answer a list of 3 rewards"):
            rs.score(prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=[[1]] * 3)
    tolerant = [RewardEntry("remote", get("remote", url=f"{base}/bad", max_retries=0), on_error="none")]
    with RewardSet(tolerant) as rs:
        out = rs.score(prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=[[1]] * 3)
    assert out.metrics["rewards/remote/errors"] == 3.0 and np.isnan(out.total).all()


def test_bad_options():
    with pytest.raises(ValueError, match="http"):
        get("remote", url="ftp://example")
    with pytest.raises(ValueError, match="COHORT_NOT_SET_VARIABLE"):
        get("remote", url="http://127.0.0.1:1/", api_key_env="COHORT_NOT_SET_VARIABLE")
