"""Reading the rollout server's request bodies: every field checked before the engine sees it.

A malformed request is the client's mistake, so it raises `BadRequest` (the
server answers HTTP 400) with a message that names the field, what was
expected, and what came instead: `generate.prompts[0][3] = 70000 is outside the
vocabulary (token ids are 0..49151)`. Only a request that passes reaches the
engine; whatever fails after that is the server's problem (HTTP 500).

Checked: the body is a JSON object; required keys are present; token ids are
integers (not booleans, not floats) inside the vocabulary when its size is
known; sampling has only `SamplingConfig`'s keys, with `max_tokens >= 1`,
`temperature >= 0`, `0 < top_p <= 1`, `top_k >= 0`; seeds are one per prompt;
a prompt (plus, for /score, its completion; for /submit, the resumed tokens)
fits in `max_model_len`; a /submit request's id is a non-empty string unique
in its body, and a resumed trajectory is an aborted one whose log-probs,
versions and loss mask have one entry per token.
Left out: limits on batch size (the engine queues whatever it is given).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from cohort.rollout.base import Request, SamplingConfig, Trajectory

SAMPLING_KEYS = tuple(f.name for f in dataclasses.fields(SamplingConfig))


class BadRequest(ValueError):
    """A malformed request; the message says which field is wrong and what was expected."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the served model accepts; None where unknown (then unchecked)."""

    vocab_size: int | None = None
    max_model_len: int | None = None


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def json_object(raw: bytes, endpoint: str) -> dict[str, Any]:
    """The body as a JSON object, or BadRequest saying why it is not one."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"{endpoint}: the body is not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest(f"{endpoint}: the body must be a JSON object, got a {type(body).__name__}")
    return body


def required(body: dict[str, Any], key: str, endpoint: str) -> Any:
    if key not in body:
        raise BadRequest(f"{endpoint}: missing key {key!r} (the body has {sorted(body)})")
    return body[key]


def token_ids(value: Any, field: str, limits: Limits) -> list[int]:
    """A non-empty list of in-vocabulary token ids."""
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{field} must be a non-empty list of token ids, got {_show(value)}")
    for i, token in enumerate(value):
        if not _is_int(token):
            raise BadRequest(f"{field}[{i}] must be an integer token id, got {_show(token)}")
        if token < 0 or (limits.vocab_size is not None and token >= limits.vocab_size):
            bound = f"0..{limits.vocab_size - 1}" if limits.vocab_size is not None else "non-negative"
            raise BadRequest(f"{field}[{i}] = {token} is outside the vocabulary (token ids are {bound})")
    return value


def _fits(length: int, field: str, limits: Limits) -> None:
    if limits.max_model_len is not None and length > limits.max_model_len:
        raise BadRequest(f"{field} is {length} tokens, more than the server's max_model_len = {limits.max_model_len} "
                         f"(restart `cohort serve` with a larger --max-model-len)")


def sampling_config(value: Any, field: str = "generate.sampling") -> SamplingConfig:
    """`field` (e.g. generate.sampling) as a SamplingConfig, each key checked."""
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be a JSON object like {{\"max_tokens\": 16}}, got {_show(value)}")
    unknown = sorted(set(value) - set(SAMPLING_KEYS))
    if unknown:
        raise BadRequest(f"{field} has unknown key(s) {unknown}; the keys are {list(SAMPLING_KEYS)}")
    required(value, "max_tokens", field)
    checks = {
        "max_tokens": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
        "temperature": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
        "top_p": (lambda v: _is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
        "top_k": (lambda v: _is_int(v) and v >= 0, "an integer >= 0 (0: off)"),
    }
    for key, given in value.items():
        ok, expected = checks[key]
        if not ok(given):
            raise BadRequest(f"{field}.{key} must be {expected}, got {_show(given)}")
    return SamplingConfig(**value)


def generate_request(body: dict[str, Any], limits: Limits) -> tuple[list[list[int]], SamplingConfig, list | None]:
    """(prompts, sampling, seeds) of a /generate body."""
    prompts = required(body, "prompts", "generate")
    if not isinstance(prompts, list) or not prompts:
        raise BadRequest(f"generate.prompts must be a non-empty list of token-id lists, got {_show(prompts)}")
    prompts = [token_ids(p, f"generate.prompts[{i}]", limits) for i, p in enumerate(prompts)]
    for i, prompt in enumerate(prompts):
        _fits(len(prompt), f"generate.prompts[{i}]", limits)
    sampling = sampling_config(required(body, "sampling", "generate"))
    seeds = body.get("seeds")
    if seeds is not None:
        if not isinstance(seeds, list) or len(seeds) != len(prompts):
            raise BadRequest(f"generate.seeds must be null or a list of {len(prompts)} integers (one per prompt), got {_show(seeds)}")
        for i, seed in enumerate(seeds):
            if seed is not None and not _is_int(seed):
                raise BadRequest(f"generate.seeds[{i}] must be an integer or null, got {_show(seed)}")
    return prompts, sampling, seeds


def score_request(body: dict[str, Any], limits: Limits) -> tuple[list[list[int]], list[list[int]], float]:
    """(prompts, completions, temperature) of a /score body: pairs scored together."""
    prompts, completions = required(body, "prompts", "score"), required(body, "completions", "score")
    if not isinstance(prompts, list) or not isinstance(completions, list) or len(prompts) != len(completions) or not prompts:
        raise BadRequest(f"score.prompts and score.completions must be non-empty lists of token-id lists of the same length, "
                         f"got {_show(prompts)} and {_show(completions)}")
    prompts = [token_ids(p, f"score.prompts[{i}]", limits) for i, p in enumerate(prompts)]
    completions = [token_ids(c, f"score.completions[{i}]", limits) for i, c in enumerate(completions)]
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        _fits(len(prompt) + len(completion), f"score.prompts[{i}] + score.completions[{i}]", limits)
    temperature = body.get("temperature", 1.0)
    if not _is_number(temperature) or temperature <= 0:
        raise BadRequest(f"score.temperature must be a number > 0, got {_show(temperature)}")
    return prompts, completions, float(temperature)


def _int_list(value: Any, field: str, n: int, ok=lambda v: True, expected: str = "integers") -> list[int]:
    if not isinstance(value, list) or len(value) != n:
        raise BadRequest(f"{field} must be a list of {n} {expected} (one per token), got {_show(value)}")
    for i, v in enumerate(value):
        if not _is_int(v) or not ok(v):
            raise BadRequest(f"{field}[{i}] must be one of the {expected}, got {_show(v)}")
    return value


def resumed_trajectory(value: Any, field: str, limits: Limits) -> Trajectory:
    """The partial trajectory a request continues: an aborted one, its per-token lists as long as its tokens."""
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be null or a trajectory object (as /abort returned it), got {_show(value)}")
    if value.get("status") != "aborted":
        raise BadRequest(f"{field}.status must be \"aborted\" (only an aborted trajectory is continued), got {_show(value.get('status'))}")
    tokens = required(value, "token_ids", field)
    tokens = token_ids(tokens, f"{field}.token_ids", limits) if tokens != [] else []
    n = len(tokens)
    logprobs = required(value, "logprobs", field)
    if not isinstance(logprobs, list) or len(logprobs) != n or not all(_is_number(x) for x in logprobs):
        raise BadRequest(f"{field}.logprobs must be a list of {n} numbers (one per token), got {_show(logprobs)}")
    version = value.get("policy_version", 0)
    if not _is_int(version) or version < 0:
        raise BadRequest(f"{field}.policy_version must be an integer >= 0, got {_show(version)}")
    versions = _int_list(value.get("versions", [version] * n), f"{field}.versions", n, lambda v: v >= 0, "integers >= 0")
    mask = _int_list(value.get("loss_mask", [1] * n), f"{field}.loss_mask", n, lambda v: v in (0, 1), "0/1 integers")
    return Trajectory(tokens, [float(x) for x in logprobs], "aborted", version, versions, mask,
                      request_id=str(value.get("request_id") or ""))


def request(value: Any, field: str, limits: Limits) -> Request:
    """One /submit request: {request_id, prompt_ids, sampling, seed, resume}."""
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be a JSON object {{request_id, prompt_ids, sampling, seed, resume}}, got {_show(value)}")
    unknown = sorted(set(value) - {"request_id", "prompt_ids", "sampling", "seed", "resume"})
    if unknown:
        raise BadRequest(f"{field} has unknown key(s) {unknown}; the keys are request_id, prompt_ids, sampling, seed, resume")
    request_id = required(value, "request_id", field)
    if not isinstance(request_id, str) or not request_id:
        raise BadRequest(f"{field}.request_id must be a non-empty string, got {_show(request_id)}")
    prompt = token_ids(required(value, "prompt_ids", field), f"{field}.prompt_ids", limits)
    sampling = sampling_config(required(value, "sampling", field), f"{field}.sampling")
    seed = value.get("seed")
    if seed is not None and not _is_int(seed):
        raise BadRequest(f"{field}.seed must be an integer or null, got {_show(seed)}")
    resume = value.get("resume")
    if resume is not None:  # the resumed part belongs to this prompt (its trajectory's prompt_ids, whatever was sent)
        resume = dataclasses.replace(resumed_trajectory(resume, f"{field}.resume", limits), prompt_ids=list(prompt))
    done = len(resume.token_ids) if resume is not None else 0
    _fits(len(prompt) + done, f"{field}.prompt_ids" + (" + resume.token_ids" if resume is not None else ""), limits)
    return Request(request_id, tuple(prompt), sampling, seed, resume)


def submit_request(body: dict[str, Any], limits: Limits) -> list[Request]:
    """The requests of a /submit body, ids unique within it (uniqueness among those in flight: `RequestStream.submit`)."""
    items = required(body, "requests", "submit")
    if not isinstance(items, list) or not items:
        raise BadRequest(f"submit.requests must be a non-empty list of request objects, got {_show(items)}")
    requests = [request(r, f"submit.requests[{i}]", limits) for i, r in enumerate(items)]
    seen: dict[str, int] = {}
    for i, r in enumerate(requests):
        if r.request_id in seen:
            raise BadRequest(f"submit.requests[{i}].request_id {r.request_id!r} repeats submit.requests[{seen[r.request_id]}]'s; "
                             "ids must be unique")
        seen[r.request_id] = i
    return requests


def poll_request(body: dict[str, Any]) -> float:
    """timeout_s of a /poll body (default 0: answer at once)."""
    timeout = body.get("timeout_s", 0.0)
    if not _is_number(timeout) or timeout < 0:
        raise BadRequest(f"poll.timeout_s must be a number >= 0 (seconds to wait for a finished trajectory), got {_show(timeout)}")
    return float(timeout)


def abort_request(body: dict[str, Any]) -> list[str] | None:
    """request_ids of an /abort body: a list of ids, or null for every request in flight."""
    ids = required(body, "request_ids", "abort")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
        raise BadRequest(f"abort.request_ids must be a list of request id strings, or null for all, got {_show(ids)}")
    return ids


def weights_query(query: dict[str, list[str]]) -> tuple[int, int, int, bool]:
    """(version, part, parts, in_flight) from /weights?version=V&part=I&parts=K&in_flight=0|1; part, parts and
    in_flight default to 0, 1 and 0."""
    values = {}
    for key, default in (("version", None), ("part", "0"), ("parts", "1"), ("in_flight", "0")):
        given = query.get(key, [default])[0]
        if given is None:
            raise BadRequest("weights: missing query parameter 'version' (POST /weights?version=V&part=I&parts=K)")
        try:
            values[key] = int(given)
        except ValueError:
            raise BadRequest(f"weights: query parameter {key} must be an integer, got {given!r}") from None
    if values["parts"] < 1 or not 0 <= values["part"] < values["parts"]:
        raise BadRequest(f"weights: part {values['part']} of parts={values['parts']} is out of range (0 <= part < parts)")
    if values["in_flight"] not in (0, 1):
        raise BadRequest(f"weights: query parameter in_flight must be 0 or 1, got {values['in_flight']}")
    return values["version"], values["part"], values["parts"], bool(values["in_flight"])
