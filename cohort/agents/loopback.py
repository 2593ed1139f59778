"""The loopback OpenAI-compatible endpoint an agent run's client talks to, in the training process.

`LoopbackServer(answer)` serves `POST /v1/chat/completions` on 127.0.0.1 (a free port) with the standard library's
threading HTTP server, the machinery `cohort serve` uses (cohort/rollout/server/app.py): one thread per request, JSON in
and out. Every request must carry `Authorization: Bearer <key>`, the key of a live agent run (each run gets its
own, `new_key`), or an `X-Session-ID` the run joined to its key (`join`: a framework that sends its own session id on
every call, as verifiers sends its trace id, while its API key is one for all runs); that picks the run, and
`answer(run, body, session_id)` (AgentEngine's: the endpoint's `ChatCompletions` with the run's `Conversation`; the
call's X-Session-ID or None, so a run that plays several seats knows each call's) writes the reply. A wrong or finished key gets 401, a body that is not a JSON object
or that the endpoint refuses (`ChatRequestError`) 400, anything else 500; errors come in OpenAI's shape
(`{"error": {"message", "type"}}`) so the `openai` client raises its usual exceptions.

`stream: true` is answered with server-sent events (cohort/agents/chat.py's `stream_chunks`); an error before the
reply is the JSON error above, as OpenAI's API answers a stream it cannot start.

Left out: other paths (`GET /v1/models` answers the one model).
"""

from __future__ import annotations

import json
import sys
import secrets
import threading
from http.server import ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlparse

from cohort.agents.chat import ChatRequestError, stream_chunks
from cohort.rollout.server.app import JSONHandler

MAX_BODY_BYTES = 64 * 1024 * 1024
READ_TIMEOUT_S = 600.0


def new_key() -> str:
    return "cohort-run-" + secrets.token_urlsafe(18)


class LoopbackServer:
    """`POST /v1/chat/completions` for the runs registered by key (module docstring); `url` is the client's base_url."""

    def __init__(self, answer: Callable[[Any, dict[str, Any], str | None], dict[str, Any]], model_name: str = "cohort"):
        self.answer, self.model_name = answer, model_name
        self._runs: dict[str, Any] = {}
        self._sessions: dict[str, str] = {}  # X-Session-ID -> the key of the run that joined it
        self._lock = threading.Lock()
        handler = type("LoopbackHandler", (_Handler,), {"owner": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="cohort-agent-endpoint", daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}/v1"

    def register(self, key: str, run: Any) -> None:
        with self._lock:
            self._runs[key] = run

    def unregister(self, key: str) -> None:
        with self._lock:
            self._runs.pop(key, None)
            self._sessions = {session: k for session, k in self._sessions.items() if k != key}

    def join(self, session_id: str, key: str) -> None:
        """Calls that carry `X-Session-ID: session_id` belong to the run of `key` (until it is unregistered)."""
        with self._lock:
            if key in self._runs:
                self._sessions[session_id] = key

    def run_of(self, header: str | None, session_id: str | None = None) -> Any:
        """The run whose joined session id the X-Session-ID header carries, else whose key the Authorization header
        carries, or None."""
        if session_id:
            with self._lock:
                key = self._sessions.get(session_id)
                if key is not None:
                    return self._runs.get(key)
        if not header or not header.startswith("Bearer "):
            return None
        key = header[len("Bearer "):].strip()
        with self._lock:
            for known, run in self._runs.items():
                if secrets.compare_digest(known, key):
                    return run
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # every run of a generation batch (or the held-out eval) may connect at once; the
    # default backlog of 5 resets the connections beyond it (the client's "Connection error")

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (an agent run cancelled mid-call: a batch's end under partial rollouts, an abort) is
        not an error of the server's: no traceback on the console for it. Any other error is printed as before."""
        if not isinstance(sys.exc_info()[1], ConnectionError):  # (ConnectionResetError, BrokenPipeError, ...)
            super().handle_error(request, client_address)


class _Handler(JSONHandler):
    owner: LoopbackServer  # set on the subclass LoopbackServer makes
    timeout = READ_TIMEOUT_S
    server_version = "cohort-agent-endpoint"
    protocol_version = "HTTP/1.1"  # keep-alive: the openai client reuses its connection

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        self._reply(status, {"error": {"message": message, "type": kind, "param": param, "code": None}})

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise ChatRequestError("body", f"{length} bytes exceed {MAX_BODY_BYTES}")
        return self.rfile.read(length)

    def do_GET(self):
        if urlparse(self.path).path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": self.owner.model_name, "object": "model", "owned_by": "cohort"}]})
        else:
            self._error(404, f"no such endpoint: GET {self.path}; POST /v1/chat/completions", "not_found_error")

    def do_POST(self):
        try:
            body = self._body()  # (read first: an unread body would break the kept-alive connection)
            run = self.owner.run_of(self.headers.get("Authorization"), self.headers.get("X-Session-ID"))
            if run is None:
                return self._error(401, "missing, wrong or expired API key (each agent run has its own)", "authentication_error")
            if urlparse(self.path).path != "/v1/chat/completions":
                return self._error(404, f"no such endpoint: POST {self.path}; POST /v1/chat/completions", "not_found_error")
            try:
                payload = json.loads(body or b"null")
            except ValueError as exc:
                raise ChatRequestError("body", f"not JSON: {exc}") from None
            if not isinstance(payload, dict):
                raise ChatRequestError("body", "must be a JSON object")
            response = self.owner.answer(run, payload, self.headers.get("X-Session-ID"))
            self._reply_chat(response, stream_chunks(payload, response))
        except ChatRequestError as exc:
            self._error(400, str(exc), "invalid_request_error", exc.param)
        except Exception as exc:  # noqa: BLE001 - the agent gets the reason; the endpoint keeps serving
            self._error(500, f"{type(exc).__name__}: {exc}", "server_error")
