"""The rollout server: a rollout engine behind HTTP (`cohort serve MODEL_DIR`).

The trainer reaches it through `RemoteEngine` (engine.mode=server), which
speaks the same `RolloutEngine` protocol as the in-process engines, so the
driver loop does not know where generation runs.

Endpoints (JSON bodies unless said otherwise). Every one except `/health`
needs `Authorization: Bearer <token>`, the token being the server's
`COHORT_SERVER_TOKEN`; a request without it gets 401.

    GET  /health     -> {status, policy_version, model, max_model_len, vocab_size, stop_token_ids, in_flight_updates}
    POST /generate   {prompts: [[id]], sampling: {max_tokens, temperature, top_p, top_k}, seeds: [int] | null}
                     -> {policy_version, completions: [{token_ids, logprobs, status, policy_version, versions, loss_mask, prompt_ids, request_id, error}]}
    POST /score      {prompts: [[id]], completions: [[id]], temperature} -> {policy_version, logprobs: [[float]]}
    POST /weights?version=V&part=I&parts=K[&in_flight=1]   body: safetensors bytes (one part of the full set)
                     -> {policy_version, parts_received}

The request level (cohort/rollout/base.py's submit / poll / abort / resume), which
`RemoteEngine` uses; `trajectory` is the object /generate's completions hold:

    POST /submit     {requests: [{request_id, prompt_ids: [id], sampling: {...}, seed: int | null,
                                  resume: trajectory | null}]} -> {accepted, policy_version}
    POST /poll       {timeout_s} -> {completions: [trajectory], in_flight, policy_version}
                     waits up to timeout_s (at most 30 s) until a trajectory is finished, then returns
                     every finished one; in_flight counts the requests not handed back yet (a
                     /v1/chat/completions call's own requests are neither counted nor handed out)
    POST /abort      {request_ids: [id] | null (all)} -> {completions: [trajectory], in_flight, policy_version}
                     each request's trajectory so far (status "aborted"; one that had finished comes
                     back finished); submit it again as `resume` to continue it

OpenAI-compatible (cohort/agents/chat.py, when the server is given one: `cohort serve` always is):

    POST /v1/chat/completions   OpenAI's chat-completions body (messages, tools, tool_choice, n, temperature,
                     top_p, max_tokens / max_completion_tokens, stop, logprobs, seed) -> an OpenAI chat.completion;
                     tool calls parsed by `--tool-parser`; sampled through the request stream (so it is answered
                     while a trainer's requests generate), recorded nowhere; rendered with the checkpoint's
                     chat template, or `--chat-template FILE` and `--chat-template-kwargs JSON` (vLLM's
                     spellings; the same as model.chat_template / chat_template_kwargs, which a local_server
                     engine passes its child, so it renders and stops as the trainer does)
    GET  /v1/models  -> {object: "list", data: [{id: model, object: "model", ...}]}

Errors on /v1/ paths come in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}` (a bad field: 400
with type "invalid_request_error" and `param` naming it).

One driver thread moves the engine forward while requests are in flight
(cohort/rollout/server/request_stream.py). A request id must be unique among the
requests in flight (400 otherwise). While requests are generating, /generate
gets 409 (a batch call would take the streamed requests' results), and so do
/weights and /score unless the engine takes weights under running requests
(`in_flight_updates`, reported by /health: the vLLM engine does) and, for
/weights, the client asks for it with `in_flight=1` (asynchronous training;
the synchronous trainer syncs only when idle and gets 409 if it is not). Such
a push is staged part by part while the driver thread keeps generating; the
full set is loaded under the engine lock, so between two driver polls, and the
requests in flight continue under the new weights (`VLLMEngine.update_weights`).

Weights travel as safetensors over HTTP, so a push needs no CUDA, no NCCL and
no shared filesystem: it works between CPU machines (TRL's server mode needs
NCCL for this). A full set is sent in K parts of bounded size; the server
stages parts 0..K−1 of one version and loads them together when the last one
arrives (a partial set is never loaded), then reports version V in every
generation that follows.

A malformed request (a body that is not a JSON object, a missing or mistyped
field, an unknown sampling key, a token id outside the vocabulary, a prompt
longer than the model holds, a weights part that is not safetensors) gets 400
with `{"error": "..."}` naming the field and what was expected; an unknown path
gets 404; 500 is left for failures inside the engine (a failure while
streaming comes back as trajectories with status "error" and the reason).

Stop tokens are computed server-side: the engine reads the set from its own
checkpoint directory with the function the trainer uses
(`cohort.models.pretrained.stop_token_ids`), rather than taking it from each
request, so any client of the server samples the checkpoint's stopping, and
the trainer checks the set `/health` reports against its own at connect time
(`RemoteEngine`), which catches a server started from another checkpoint.

Choices: the standard library's threading HTTP server (no extra dependency);
one lock serialises engine calls (vLLM's offline engine is not re-entrant), so
`/health` still answers during a long generation; results stream by long
polling (no chunked responses or websockets to maintain). The server binds loopback
by default and refuses to start without a token. Left out: TLS (put a reverse
proxy in front for untrusted networks), request queues across trainers (one
trainer drives a server).
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import json
import os
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse

from cohort.models.pretrained import ModelLoadError, load_tokenizer, resolve_model_dir, stop_token_ids
from cohort.rollout.server import bodies
from cohort.rollout.base import EngineLock, Request, Trajectory, engine_thread
from cohort.rollout.server.request_stream import Conflict, RequestStream
from cohort.rollout.engines.vllm import VLLMEngine

TOKEN_ENV = "COHORT_SERVER_TOKEN"
POST_PATHS = ("/generate", "/score", "/weights", "/submit", "/poll", "/abort", "/v1/chat/completions")
GET_PATHS = ("/health", "/v1/models")
OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 409: "conflict_error",
                      413: "invalid_request_error"}
MAX_BODY_BYTES = 4 * 2**30  # one request (a weights part is at most server/client.py PART_BYTES)
READ_TIMEOUT_S = 120.0  # a client that stops sending mid-request frees its thread after this


def completion_to_json(c: Trajectory) -> dict[str, Any]:
    return {"token_ids": list(c.token_ids), "logprobs": list(c.logprobs), "status": c.status,
            "policy_version": c.policy_version, "versions": list(c.versions), "loss_mask": list(c.loss_mask),
            "prompt_ids": list(c.prompt_ids), "request_id": c.request_id, "error": c.error}


def completion_from_json(d: dict[str, Any]) -> Trajectory:
    return Trajectory(list(d["token_ids"]), [float(x) for x in d["logprobs"]], d["status"], int(d["policy_version"]),
                      [int(v) for v in d.get("versions") or []], [int(m) for m in d.get("loss_mask") or []],
                      [int(t) for t in d.get("prompt_ids") or []], str(d.get("request_id") or ""), d.get("error"))


def request_to_json(r: Request) -> dict[str, Any]:
    return {"request_id": r.request_id, "prompt_ids": [int(t) for t in r.prompt_ids], "sampling": dataclasses.asdict(r.sampling),
            "seed": r.seed, "resume": completion_to_json(r.resume) if r.resume is not None else None}


def request_from_json(d: Any, limits: bodies.Limits = bodies.Limits()) -> Request:
    """A Request from its JSON, every field checked (BadRequest naming the field otherwise)."""
    return bodies.request(d, "request", limits)


class WeightStager:
    """Collects the K parts of one weight version; hands back the full set when the last part arrives."""

    def __init__(self):
        self.version: int | None = None
        self.parts: dict[int, dict] = {}

    def add(self, version: int, part: int, parts: int, tensors: dict) -> dict | None:
        if not 0 <= part < parts:
            raise ValueError(f"part {part} of {parts} is out of range")
        if part == 0 or version != self.version:
            self.version, self.parts = version, {}
        self.parts[part] = tensors
        if len(self.parts) < parts:
            return None
        full: dict = {}
        for i in range(parts):
            full.update(self.parts[i])
        self.version, self.parts = None, {}
        return full


class RolloutService:
    """The server's state: one engine, its lock, the weight stager, the token and a description."""

    def __init__(self, engine, token: str, *, model: str = "", max_model_len: int | None = None,
                 vocab_size: int | None = None, chat: Callable[[Callable], Any] | None = None):
        """`chat`: builds the /v1/chat/completions handler (cohort.agents.chat.ChatCompletions) from the blocking
        sample function it is given (the request stream's `run`); None: the server has no OpenAI endpoint."""
        if not token:
            raise ValueError(f"the rollout server needs a token: set {TOKEN_ENV} (e.g. `export {TOKEN_ENV}=$(openssl rand -hex 16)`)")
        self.engine = engine
        self.token = token
        self.model = model
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.limits = bodies.Limits(vocab_size, max_model_len)
        self.lock = EngineLock()
        self.stream = RequestStream(engine, self.lock)
        self.stager = WeightStager()
        self.chat = chat(self.stream.run) if chat is not None else None

    def authorized(self, header: str | None) -> bool:
        prefix = "Bearer "
        if not header or not header.startswith(prefix):
            return False
        return hmac.compare_digest(header[len(prefix):].encode(), self.token.encode())

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "policy_version": self.engine.policy_version, "model": self.model,
                "max_model_len": self.max_model_len, "vocab_size": self.vocab_size,
                "stop_token_ids": list(self.engine.stop_token_ids), "in_flight_updates": self.in_flight_updates}

    @property
    def in_flight_updates(self) -> bool:
        return bool(getattr(self.engine, "in_flight_updates", False))

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts, sampling, seeds = bodies.generate_request(body, self.limits)
        with self.lock:
            self.stream.refuse_while_generating("generate")
            outs = self.engine.generate(prompts, sampling, seeds)
            version = self.engine.policy_version
        return {"policy_version": version, "completions": [completion_to_json(c) for c in outs]}

    def score(self, body: dict[str, Any]) -> dict[str, Any]:
        prompts, completions, temperature = bodies.score_request(body, self.limits)
        with self.lock:
            if not self.in_flight_updates:  # an engine that can scores next to the requests in flight
                self.stream.refuse_while_generating("score")
            logprobs = self.engine.score(prompts, completions, temperature)
            version = self.engine.policy_version
        return {"policy_version": version, "logprobs": logprobs}

    def weights(self, version: int, part: int, parts: int, payload: bytes, in_flight: bool = False) -> dict[str, Any]:
        from safetensors.torch import load as load_safetensors

        if in_flight and not self.in_flight_updates:
            raise Conflict(f"weights: in_flight=1 but this server's engine ({type(self.engine).__name__}) cannot load "
                           "weights under running requests; push without in_flight once they are done")
        try:
            tensors = load_safetensors(payload)
        except Exception as exc:  # safetensors raises its own error types for a bad header
            raise bodies.BadRequest(f"weights: the body is not a safetensors file ({type(exc).__name__}: {exc})") from None
        with self.lock:  # held between two driver polls: weights never change under an engine step
            if not in_flight:
                self.stream.refuse_while_generating("weights")
            full = self.stager.add(version, part, parts, tensors)
            if full is not None and in_flight:
                self.engine.update_weights(full.items(), version, in_flight=True)
            elif full is not None:
                self.engine.update_weights(full.items(), version)
            return {"policy_version": self.engine.policy_version, "parts_received": part + 1}

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        requests = bodies.submit_request(body, self.limits)
        self.stream.submit(requests)
        return {"accepted": len(requests), "policy_version": self.engine.policy_version}

    def poll(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._handed_back(self.stream.poll(bodies.poll_request(body)))

    def abort(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._handed_back(self.stream.abort(bodies.abort_request(body)))

    def chat_completions(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        """The chat.completion, and its stream events when the body asked for `stream: true` (else None)."""
        if self.chat is None:
            raise _HTTPError(HTTPStatus.NOT_FOUND, "this server has no OpenAI-compatible endpoint (start it with `cohort serve`)")
        response, _ = self.chat.create(body)
        return response, self.chat.stream_chunks(body, response)

    def models(self) -> dict[str, Any]:
        name = getattr(self.chat, "model_name", "") or self.model  # the name clients send (`cohort serve`'s MODEL argument)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "cohort",
                                            "max_model_len": self.max_model_len}]}

    def _handed_back(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        with self.stream.ready:
            in_flight = self.stream.unclaimed
        return {"completions": [completion_to_json(t) for t in trajectories], "in_flight": in_flight,
                "policy_version": self.engine.policy_version}

    def close(self) -> None:
        self.stream.close()


class JSONHandler(BaseHTTPRequestHandler):
    """JSON replies, no per-request log lines: the base of this server's handler and the agents' loopback one."""

    def log_message(self, fmt, *args):  # quiet: one line per request would drown the trainer's log
        pass

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply_events(self, chunks: list[dict[str, Any]]) -> None:
        """Server-sent events: `data: <chunk>` each, then `data: [DONE]` (an OpenAI stream; one body with its length,
        so a kept-alive connection stays usable)."""
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply_chat(self, response: dict[str, Any], chunks: list[dict[str, Any]] | None) -> None:
        """A chat completion as JSON, or as the events `chunks` when the request asked for a stream."""
        if chunks is None:
            self._reply(200, response)
        else:
            self._reply_events(chunks)


class _Handler(JSONHandler):
    service: RolloutService  # set on the subclass made by make_server
    timeout = READ_TIMEOUT_S
    server_version = "cohort-rollout"

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise bodies.BadRequest(f"Content-Length must be an integer, got {self.headers.get('Content-Length')!r}") from None
        if length > MAX_BODY_BYTES:
            raise _HTTPError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes exceeds {MAX_BODY_BYTES}")
        return self.rfile.read(length)

    def _error(self, status: int, message: str, param: str | None = None) -> None:
        """An error reply: `{"error": message}`, or OpenAI's error object on /v1/ paths."""
        if urlparse(self.path).path.startswith("/v1/"):
            self._reply(status, {"error": {"message": message, "type": OPENAI_ERROR_TYPES.get(int(status), "server_error"),
                                           "param": param, "code": None}})
        else:
            self._reply(status, {"error": message})

    def _authorize(self) -> None:
        if not self.service.authorized(self.headers.get("Authorization")):
            raise _HTTPError(HTTPStatus.UNAUTHORIZED, f"missing or wrong bearer token (the server's {TOKEN_ENV})")

    def do_GET(self):
        path = urlparse(self.path).path
        try:
            if path == "/health":
                self._reply(200, self.service.health())
            elif path == "/v1/models":
                self._authorize()
                self._reply(200, self.service.models())
            else:
                raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such endpoint: GET {path}; GET {', '.join(GET_PATHS)}, "
                                                       f"POST {', '.join(POST_PATHS)}")
        except _HTTPError as exc:
            self._error(exc.status, exc.message)

    def do_POST(self):
        url = urlparse(self.path)
        try:
            self._authorize()
            if url.path == "/v1/chat/completions":
                body = bodies.json_object(self._body(), "chat.completions")
                self._reply_chat(*self.service.chat_completions(body))
            elif url.path == "/generate":
                self._reply(200, self.service.generate(bodies.json_object(self._body(), "generate")))
            elif url.path == "/score":
                self._reply(200, self.service.score(bodies.json_object(self._body(), "score")))
            elif url.path in ("/submit", "/poll", "/abort"):
                handler = getattr(self.service, url.path[1:])
                self._reply(200, handler(bodies.json_object(self._body(), url.path[1:])))
            elif url.path == "/weights":
                version, part, parts, in_flight = bodies.weights_query(parse_qs(url.query))
                self._reply(200, self.service.weights(version, part, parts, self._body(), in_flight))
            else:
                raise _HTTPError(HTTPStatus.NOT_FOUND, f"no such endpoint: POST {url.path}; POST {', '.join(POST_PATHS)}, "
                                                       f"GET {', '.join(GET_PATHS)}")
        except _HTTPError as exc:
            self._error(exc.status, exc.message)
        except Conflict as exc:  # the right request at the wrong time: the message says what to do first
            self._error(HTTPStatus.CONFLICT, str(exc))
        except bodies.BadRequest as exc:  # the client's mistake, said plainly
            self._error(HTTPStatus.BAD_REQUEST, str(exc), getattr(exc, "param", None))
        except Exception as exc:  # the trainer gets the reason, the server keeps serving
            self._error(500, f"{type(exc).__name__}: {exc}")


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = int(status), message


class _EngineHTTPServer(ThreadingHTTPServer):
    """A thread per request, each with PyTorch's thread count applied before it touches the engine (engine_thread)."""

    def process_request_thread(self, request, client_address):
        engine_thread(super().process_request_thread)(request, client_address)


def make_server(service: RolloutService, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server bound to (host, port) for `service`; port 0 picks a free one. Call serve_forever()."""
    handler = type("RolloutHandler", (_Handler,), {"service": service})
    server = _EngineHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(service: RolloutService, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start a server on a daemon thread; returns (server, base url). `server.shutdown()` stops it."""
    server = make_server(service, host, port)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="cohort-rollout-server", daemon=True).start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host}:{bound_port}"


def split_cores(cores: list[int], engine_threads: int | None, overlap: bool) -> tuple[list[int] | None, int | None]:
    """Share this process's CPUs between a local rollout server and the trainer.

    Returns (the cores the engine's threads are bound to, or None for vLLM's own
    binding; the trainer's thread count, or None for PyTorch's default). Without
    overlap the two take turns, so each may use every core unless told
    otherwise; with overlap they run at once, and two OpenMP pools spinning on
    the same cores slow each other 10-40x, so the engine takes the last
    `engine_threads` cores (default half, at least one) and the trainer the rest.
    """
    cores = sorted(cores)
    if engine_threads is None and not overlap:
        return None, None
    k = max(1, min(len(cores), engine_threads if engine_threads is not None else len(cores) // 2))
    return cores[-k:], (max(1, len(cores) - k) if overlap else None)


def child_visible_devices(parent: str | None, indices: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for a child that must see this process's GPUs `indices` (numbered as this process sees
    them): the parent's own list, when it has one, maps them back to the machine's ids ("4,5,6,7" and [1] -> "5")."""
    visible = [d.strip() for d in parent.split(",") if d.strip()] if parent else None
    if visible is not None and max(indices) >= len(visible):
        raise ValueError(f"GPU {max(indices)} is not among this process's CUDA_VISIBLE_DEVICES={parent}")
    return ",".join(visible[i] if visible is not None else str(i) for i in indices)


class LocalServer:
    """`cohort serve` in a child process on a free loopback port, with a fresh token; `close()` stops it.

    For a process that cannot or should not hold vLLM itself: engine.mode=local_server
    (generation in its own process, on its own cores), rank 0 of a multi-process
    run (vLLM builds its own torch.distributed groups, which would need every
    rank), and benchmarks. The child gets none of torchrun's variables;
    `cpu_cores` binds its OpenMP threads to those cores (vLLM's CPU backend).
    """

    TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")

    def __init__(self, model_dir, *, dtype: str = "float32", max_model_len: int | None = None, seed: int = 0,
                 kv_cache_gib: float = 1.0, gpu_memory_utilization: float | None = None, start_timeout_s: float = 600.0,
                 cpu_cores: list[int] | None = None, cuda_devices: list[int] | None = None, tensor_parallel_size: int = 1,
                 chat_template: str | None = None, chat_template_kwargs: dict | None = None):
        import secrets
        import subprocess

        self.token = secrets.token_hex(16)
        env = {k: v for k, v in os.environ.items() if k not in self.TORCHRUN_ENV and not k.startswith("TORCHELASTIC")}
        env[TOKEN_ENV] = self.token
        if cpu_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpu_cores)
            env["OMP_NUM_THREADS"] = str(len(cpu_cores))
        if cuda_devices:  # the GPUs cohort chose for the engine (server/client.py engine_gpus), as this process numbers them
            env["CUDA_VISIBLE_DEVICES"] = child_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), cuda_devices)
        cmd = [sys.executable, "-m", "cohort.cli", "serve", str(model_dir), "--port", "0", "--dtype", dtype, "--seed", str(seed),
               "--kv-cache-gib", str(kv_cache_gib), "--tensor-parallel-size", str(tensor_parallel_size)]
        if gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        if max_model_len:
            cmd += ["--max-model-len", str(max_model_len)]
        if chat_template:  # the child renders (and computes its stop tokens) with the run's template
            cmd += ["--chat-template", chat_template]
        if chat_template_kwargs:
            cmd += ["--chat-template-kwargs", json.dumps(chat_template_kwargs)]
        self.process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=None, text=True)
        self.url = self._wait_ready(start_timeout_s)

    def _wait_ready(self, timeout_s: float) -> str:
        found: dict[str, str] = {}
        ready = threading.Event()

        def read():  # keeps draining stdout so the child never blocks on a full pipe; its lines join our stderr
            for line in self.process.stdout:  # (under `cohort train`: RUN_DIR/logs/engine.log, like the child's stderr)
                sys.stderr.write(line)
                if "listening on " in line and not ready.is_set():
                    found["url"] = line.rsplit("listening on ", 1)[1].strip()
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the local rollout server did not start (exit code {self.process.returncode}; "
                                   f"waited up to {timeout_s:.0f} s); its output went to this process's stderr "
                                   "(RUN_DIR/logs/engine.log under `cohort train`)")
        return found["url"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except Exception:
                self.process.kill()


# --------------------------------------------------------------------------- cohort serve


def add_serve_command(sub, chat: Callable[..., Any] | None = None) -> None:
    """The `cohort serve` subcommand; `chat` builds its /v1/chat/completions (cohort.agents.chat.ChatCompletions, which
    sits above this package, so the command line hands it in)."""
    serve = sub.add_parser("serve", help="run a vLLM rollout server for engine.mode=server (needs COHORT_SERVER_TOKEN)",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("model", help="model directory (a transformers checkpoint) or tiny:arith")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 exposes it to the network)")
    serve.add_argument("--port", type=int, default=8400, help="port (0: pick a free one and print it)")
    serve.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="generation dtype; match the trainer's")
    serve.add_argument("--max-model-len", type=int, default=None, help="longest prompt + completion in tokens (default: the model's)")
    serve.add_argument("--seed", type=int, default=0, help="engine seed (every request also carries per-completion seeds)")
    serve.add_argument("--kv-cache-gib", type=float, default=1.0, help="vLLM on CPU: KV cache size in GiB")
    serve.add_argument("--gpu-memory-utilization", type=float, default=None,
                       help="vLLM on GPU: fraction of the GPU's memory to take (default 0.9: the engine alone on its GPU)")
    serve.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM: GPUs the model is split across")
    serve.add_argument("--tool-parser", default="hermes",
                       help="how /v1/chat/completions reads tool calls from the sampled text: hermes | compact | "
                            "my_module.my_parser (as tools.parser)")
    serve.add_argument("--no-tools-in-prompt", dest="tools_in_prompt", action="store_false",
                       help="do not render a request's tools into the prompt (the template's tools block): for a checkpoint "
                            "trained without it, as tiny:tool_calc (whose 128 positions it would overflow) and the prompts of "
                            "the in-process tool loop; tool calls are parsed alike")
    serve.add_argument("--chat-template", default=None,
                       help="a Jinja file, or the name of a template file inside the checkpoint, to render with instead of the "
                            "tokenizer's own (as model.chat_template and vLLM's --chat-template)")
    serve.add_argument("--chat-template-kwargs", type=json.loads, default=None,
                       help="the template's keyword arguments as JSON, e.g. '{\"enable_thinking\": false}' (as "
                            "model.chat_template_kwargs and vLLM's --chat-template-kwargs)")
    serve.set_defaults(func=lambda ns: cmd_serve(ns, chat))


def cmd_serve(ns, chat: Callable[..., Any] | None = None) -> int:
    """`chat`: the OpenAI endpoint's class (cohort.agents.chat.ChatCompletions; the command line passes it)."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"cohort serve: set {TOKEN_ENV} first (the trainer sends the same token), e.g. "
              f"`export {TOKEN_ENV}=$(openssl rand -hex 16)`", file=sys.stderr)
        return 2
    model_dir = resolve_model_dir(ns.model)
    try:  # a checkpoint saved by a run holds its template already; --chat-template replaces it
        tokenizer = load_tokenizer(model_dir, ns.chat_template, ns.chat_template_kwargs)
    except ModelLoadError as exc:
        print(f"cohort serve: {exc}", file=sys.stderr)
        return 2
    if chat is not None:
        try:  # a --tool-parser that does not exist fails now, not after the engine has loaded
            chat(tokenizer, [], lambda requests: [], parser=ns.tool_parser)
        except ValueError as exc:
            print(f"cohort serve: --tool-parser: {exc}", file=sys.stderr)
            return 2
    start = time.perf_counter()
    engine = VLLMEngine(model_dir, dtype=ns.dtype, max_model_len=ns.max_model_len, seed=ns.seed,
                        kv_cache_gib=ns.kv_cache_gib, gpu_memory_utilization=ns.gpu_memory_utilization,
                        tensor_parallel_size=ns.tensor_parallel_size, stop_ids=stop_token_ids(model_dir, tokenizer))
    model_config = engine.llm.llm_engine.model_config
    max_model_len = model_config.max_model_len
    make_chat = None if chat is None else (lambda sample: chat(tokenizer, engine.stop_token_ids, sample, parser=ns.tool_parser,
                                                                model_name=ns.model, max_model_len=max_model_len,
                                                                render_tools=ns.tools_in_prompt))
    service = RolloutService(engine, token, model=str(model_dir), max_model_len=max_model_len,
                             vocab_size=model_config.get_vocab_size(), chat=make_chat)
    server = make_server(service, ns.host, ns.port)
    host, port = server.server_address[:2]
    if host not in ("127.0.0.1", "::1", "localhost"):
        print(f"cohort serve: WARNING: listening on {host}, reachable from the network; the token is sent in clear text "
              "(use a private network or a TLS proxy)", file=sys.stderr)
    print(f"cohort serve: {model_dir} ready in {time.perf_counter() - start:.0f} s; listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        service.close()
        engine.close()
    return 0
