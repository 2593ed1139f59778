"""``remote``: a reward computed by an HTTP service.

Protocol: ``POST <url>`` with ``Content-Type: application/json`` and the body

    {"prompts": [...], "completions": [...], "completion_ids": [[...], ...], "<column>": [...], ...}

(one entry per completion in every list; numpy values become plain JSON). The reply
is a JSON list with one number or null per completion, or ``{"rewards": [...]}``.

Choices:
- ``batch_size`` None sends the whole batch in one request; otherwise chunks of that
  many rows, at most ``max_concurrency`` requests in flight.
- Each request has ``request_timeout_s``. Connection errors, timeouts, HTTP 429 and 5xx are
  retried up to ``max_retries`` times after ``backoff_s * 2**attempt`` seconds; other
  HTTP errors (a 400 means the request is wrong) fail at once. A reply of the wrong
  shape fails. A failure raises, naming the first row of the chunk, and the
  RewardSet's policy applies (``on_error: none`` to tolerate an unreliable service).
- Proxies from the environment are ignored (the service is addressed directly); a
  bearer token can come from the environment variable named by ``api_key_env``.
- stdlib only (urllib in worker threads); the work is ``async`` (``acall``); calling the
  function from plain Python returns the scores.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from cohort.rewards.calling import AsyncReward
from cohort.rewards.reward_registry import register
from cohort.rewards.calling import RewardRowError

RETRY_STATUS = {429, 500, 502, 503, 504}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


class RemoteReward(AsyncReward):
    __name__ = "remote"

    def __init__(self, url, request_timeout_s, max_retries, backoff_s, batch_size, max_concurrency, headers, api_key_env):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote needs an http(s) url, got {url!r}")
        if request_timeout_s <= 0 or max_retries < 0 or backoff_s < 0 or max_concurrency < 1:
            raise ValueError("remote needs request_timeout_s > 0, max_retries >= 0, backoff_s >= 0, max_concurrency >= 1")
        self.url = url
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key_env:
            if api_key_env not in os.environ:
                raise ValueError(f"remote: the environment variable {api_key_env!r} (api_key_env) is not set")
            self.headers["Authorization"] = f"Bearer {os.environ[api_key_env]}"
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _post_once(self, body: bytes) -> Any:
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        with self._opener.open(request, timeout=self.request_timeout_s) as response:
            return json.loads(response.read())

    def _post(self, body: bytes) -> Any:
        """POST with retries (runs in a worker thread)."""
        for attempt in range(self.max_retries + 1):
            try:
                return self._post_once(body)
            except urllib.error.HTTPError as exc:
                if exc.code not in RETRY_STATUS or attempt == self.max_retries:
                    detail = exc.read(300).decode("utf-8", "replace")
                    raise RuntimeError(f"{self.url} answered HTTP {exc.code}: {detail}") from exc
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as exc:
                if attempt == self.max_retries:
                    raise RuntimeError(f"{self.url} unreachable after {attempt + 1} tries: {exc}") from exc
            time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def _score_chunk(self, start: int, payload: dict[str, list], semaphore: asyncio.Semaphore) -> list:
        body = json.dumps(payload, default=_jsonable).encode()
        size = len(payload["completions"])
        async with semaphore:
            try:
                reply = await asyncio.to_thread(self._post, body)
            except Exception as exc:
                raise RewardRowError(start, str(exc)) from exc
        rewards = reply.get("rewards") if isinstance(reply, dict) else reply
        if not isinstance(rewards, list) or len(rewards) != size:
            shown = json.dumps(reply)[:200]
            raise RewardRowError(start, f"{self.url} must answer a list of {size} rewards, got {shown}")
        return rewards

    async def acall(self, **batch: Any) -> list[float | None]:
        n = len(batch["completions"])
        step = self.batch_size or max(n, 1)
        semaphore = asyncio.Semaphore(self.max_concurrency)
        chunks = [
            self._score_chunk(start, {k: list(v)[start : start + step] for k, v in batch.items()}, semaphore)
            for start in range(0, n, step)
        ]
        results = await asyncio.gather(*chunks)
        return [value for chunk in results for value in chunk]


@register("remote")
def remote(
    *,
    url: str,
    request_timeout_s: float = 30.0,
    max_retries: int = 3,
    backoff_s: float = 0.5,
    batch_size: int | None = None,
    max_concurrency: int = 4,
    headers: dict[str, str] | None = None,
    api_key_env: str | None = None,
) -> RemoteReward:
    """Rewards from an HTTP service: POSTs the batch as JSON, expects a list of floats/None back.

    Body: {"prompts", "completions", "completion_ids", and every column}, chunked by
    batch_size. Retries connection errors, timeouts, 429 and 5xx (max_retries, with
    exponential backoff); api_key_env names an environment variable holding a bearer token.
    """
    return RemoteReward(url, request_timeout_s, max_retries, backoff_s, batch_size, max_concurrency, headers, api_key_env)
