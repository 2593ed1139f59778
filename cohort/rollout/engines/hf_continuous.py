"""The transformers engine's streaming request level, on transformers' continuous batching (paged attention).

`ContinuousRequests` drives transformers' `ContinuousBatchingManager`
(transformers/generation/continuous_batching/continuous_api.py, made by `model.init_continuous_batching`), one
per sampling temperature. Each request is added with its own `max_new_tokens` and the engine's stop set, with
`streaming=True`, so every sampled token and its log-prob (`return_logprobs=True`: the log of the softmax of the
temperature-scaled logits, model_runner.py `_sample`; greedy gets temperature 1, as the trainer scores it) comes
back as it is generated. Requests join and leave the running batch one by one: a short completion is returned
while the long ones go on.

Generation runs only inside `poll`: between polls the manager's background thread is held in its public
`pause()`, so the trainer may use and update the shared module (the same contract as the in-process vLLM
engine). Every token streamed during a poll is stamped with the policy version the engine held in it. Taking the
pause waits at most HOLD_TIMEOUT_S (`enter_pause`): a generation thread that hung inside a step fails the run with
the fix instead of hanging it.

Abort: transformers' `cancel_request` drops a request without a word; its tokens so far are those the stream
delivered, which are all it generated (the loop delivers each step's tokens before it parks in the pause).
Internal request ids are unique per submission, so a request aborted and submitted again (resume) is never
hit by its own late cancellation.

Seeds: transformers samples every request from the process's one torch generator; it has no per-request seed.
`poll` seeds it from the first seed among the requests submitted since the last poll (the rule of the plain
`generate` path), so a drain (`generate`) is reproducible; a stream that submits while others run is
reproducible only as far as its polls return at the same steps. The manager's own `torch.manual_seed`
(done once when it is built) is undone, so building one does not reset the trainer's generator.

Left out, and sent to the plain `generate` path by `HFEngine`: top-k / top-p (transformers' log-probs would be
those of the filtered, renormalised distribution, not the trainer's), the trainer's autocast (thread-local: the
generation thread would run without it), and architectures the manager refuses or fails on (`start` probes
one token and says why), and a transformers that lacks what this module calls even through its adapter
(`missing_api`). CPU offload of the KV cache is off: a request that does not fit waits.

Versions: 5.19 (the project's) has all of it. 5.17 (the GPU machine's) names the page size `block_size`, has no
`auto_switch_to_flash` and its manager no `pause()`; the adapter (`_config`, `_LoopGate`) passes `block_size`, keeps
the attention transformers' own way (the model is switched to "paged|<its attention>" before the manager is built,
which its flash auto-switch leaves alone), and parks the generation loop between steps with a gate around the
manager's `_generation_loop_body` (the loop calls it once per step and once per 0.1 s wait when idle), which is what
5.19's `pause()` does. Tests: tests/rollout/test_hf_requests.py runs on both (`make gpu-lane` for 5.17).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
import transformers
from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

from cohort.rollout.base import Request, SamplingConfig, Trajectory, finish_reason


@dataclass
class _Stream:
    """One request in flight: what the stream delivered so far, and the version that sampled each token."""

    request: Request
    temperature: float
    policy_version: int  # the version held when it was submitted
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def piece(self, status: str) -> Trajectory:
        return Trajectory(list(self.token_ids), list(self.logprobs), status, self.policy_version, list(self.versions),
                          request_id=self.request.request_id)


_NEEDED_FIELDS = ("return_logprobs", "num_blocks", "max_batch_tokens", "max_requests_per_batch")


def missing_api() -> str | None:
    """What this module needs and the installed transformers lacks even through the adapter (None: nothing; module
    docstring, "Versions"): 5.17 and 5.19 have all of it."""
    lacking = [f"ContinuousBatchingConfig.{name}" for name in _NEEDED_FIELDS if not _has_field(name)]
    if not (_has_field("page_size") or _has_field("block_size")):
        lacking.append("ContinuousBatchingConfig.page_size (or block_size)")
    if not (hasattr(ContinuousBatchingManager, "pause") or hasattr(ContinuousBatchingManager, "_generation_loop_body")):
        lacking.append("ContinuousBatchingManager.pause() (or _generation_loop_body)")
    return ", ".join(lacking) or None


def api_adapter() -> str:
    """How this transformers is driven, in words (the engine choice prints it)."""
    native = _has_field("page_size") and _has_field("auto_switch_to_flash") and hasattr(ContinuousBatchingManager, "pause")
    return (f"transformers {transformers.__version__}: " +
            ("its own page_size and pause()" if native else "block_size, paged attention set by cohort, cohort's loop gate"))


def engine_choice(autocast: bool) -> str:
    """The transformers engine's sampling path in one line (`HFEngine.choice`; printed when a run builds it)."""
    missing = missing_api()
    if missing:
        return f"plain generate (transformers {transformers.__version__}'s continuous batching lacks {missing})"
    if autocast:
        return "plain generate (the trainer's autocast, which transformers' generation thread would not run under)"
    return f"continuous batching ({api_adapter()}); plain generate for top-k / top-p requests"


def _has_field(name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}


def _config(**kwargs) -> ContinuousBatchingConfig:
    """ContinuousBatchingConfig of this transformers: `page_size` as `block_size` where it has no `page_size` (5.17),
    `auto_switch_to_flash=False` where it has that field (the engine keeps the trainer's attention)."""
    if not _has_field("page_size"):
        kwargs["block_size"] = kwargs.pop("page_size")
    if _has_field("auto_switch_to_flash"):
        kwargs["auto_switch_to_flash"] = False
    return ContinuousBatchingConfig(**kwargs)


class _LoopGate:
    """`ContinuousBatchingManager.pause()` for a transformers without it (5.17): wraps the manager's
    `_generation_loop_body` (on the instance), which parks before its next step while a pause is held. `pause()`
    returns once the loop is parked (or gone); the loop delivers each step's tokens before it gets there."""

    def __init__(self, manager):
        self.manager = manager
        self.condition = threading.Condition()
        self.requested = False
        self.parked = False
        body = manager._generation_loop_body

        def gated(*args, **kwargs):
            with self.condition:
                if self.requested:
                    self.parked = True
                    self.condition.notify_all()
                    self.condition.wait_for(lambda: not self.requested)
                    self.parked = False
            return body(*args, **kwargs)

        manager._generation_loop_body = gated

    @contextlib.contextmanager
    def pause(self):
        with self.condition:
            self.requested = True
            while not self.parked and self.manager.is_running():  # a loop that stopped never parks
                self.condition.wait(timeout=0.1)
        try:
            yield
        finally:
            with self.condition:
                self.requested = False
                self.condition.notify_all()


HOLD_TIMEOUT_S = 120.0  # the loop parks after its current step (a step of one batch, seconds at most): far longer is a hung loop


def enter_pause(pause: contextlib.AbstractContextManager, timeout_s: float) -> None:
    """Enter `pause` (a manager's `pause()`, or `_LoopGate.pause()`), waiting at most `timeout_s` for the generation
    loop to park: neither waits with a timeout (transformers' `acquire_pause` waits on its condition for the loop to
    park or be marked stopped, which a loop hung inside a step, or a thread that died unmarked, never does), so the
    wait runs on a helper thread and a RuntimeError with the fix ends it (the helper is left waiting: a daemon). An
    error entering it (transformers: "The generation loop stopped before it could pause.") is raised here."""
    entered, failed = threading.Event(), []

    def enter() -> None:
        try:
            pause.__enter__()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)
        entered.set()

    threading.Thread(target=enter, name="cohort-hf-pause", daemon=True).start()
    if not entered.wait(timeout_s):
        raise RuntimeError(f"the transformers generation thread did not pause within {timeout_s:g} s (it is hung or "
                           "dead), so the trainer cannot take the model back from it; resume the run from its newest "
                           "checkpoint, or generate with engine.name=vllm")
    if failed:
        raise failed[0]


class ContinuousRequests:
    """submit / poll / abort / in_flight on transformers' continuous batching (module docstring)."""

    def __init__(self, model: torch.nn.Module, *, stop_token_ids: list[int], pad_token_id: int,
                 max_requests_per_batch: int = 256, cache_tokens: int = 32768, page_size: int = 64,
                 max_batch_tokens: int = 512):
        """`cache_tokens`: the KV cache's capacity in tokens, over all requests (bytes per token: 2 x layers x KV heads
        x head dim x dtype size); requests that do not fit wait. `page_size` tokens per block, the least one request
        holds. `max_batch_tokens`: the tokens of one forward pass (longer prefills are split). Both are set here
        because transformers sizes them from free memory otherwise, which on a CPU is the machine's RAM: its
        attention mask alone (max_batch_tokens x (cache + max_batch_tokens) floats, cache.py
        `attention_mask_bytes`) took 2.4 GB for the tiny model."""
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.max_requests_per_batch = max_requests_per_batch
        self.num_blocks = max(1, cache_tokens // page_size)
        self.page_size = page_size
        self.max_batch_tokens = max_batch_tokens
        self._managers: dict[float, object] = {}  # by temperature
        self._pauses: dict[float, contextlib.AbstractContextManager] = {}  # the pause each one is held in
        self._streams: dict[str, _Stream] = {}  # by internal id
        self._done: list[Trajectory] = []  # finished, not yet returned by poll
        self._seed: int | None = None  # the first seed submitted since the last poll
        self._ids = itertools.count()
        self._cb_attention: dict[float, str] = {}  # the attention implementation each manager runs with
        self._gates: dict[float, _LoopGate] = {}  # where the manager has no pause() (5.17)

    @staticmethod
    def accepts(sampling: SamplingConfig) -> bool:
        """Whether transformers' log-probs are the trainer's for these parameters (no top-k / top-p filtering)."""
        return sampling.top_k == 0 and sampling.top_p >= 1.0

    def _attention(self) -> str:
        return self.model.config._attn_implementation

    @property
    def in_flight(self) -> int:
        return len(self._streams) + len(self._done)

    def start(self, temperature: float) -> None:
        """Build (once) and probe the manager for `temperature`; raises RuntimeError when transformers cannot serve it."""
        if temperature in self._managers:
            return
        missing = missing_api()
        if missing:
            raise RuntimeError(f"transformers {transformers.__version__}'s continuous batching lacks {missing}")
        generation = GenerationConfig(do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                                      top_k=0 if temperature > 0 else None, top_p=None, eos_token_id=self.stop_token_ids,
                                      pad_token_id=self.pad_token_id)
        rng, was_training, attention = torch.get_rng_state(), self.model.training, self._attention()
        try:  # (the config too: a transformers whose config lacks a field raises TypeError here, and falls back)
            cb = _config(return_logprobs=True, num_blocks=self.num_blocks, page_size=self.page_size,
                         max_batch_tokens=self.max_batch_tokens, max_requests_per_batch=self.max_requests_per_batch,
                         use_async_batching=False, allow_block_sharing=False, seed=0)
            if not _has_field("auto_switch_to_flash") and "paged|" not in attention:  # 5.17: its flash auto-switch
                self.model.set_attn_implementation(f"paged|{attention}")  # passes a paged one by (5.19 warns on it)
            manager = self.model.init_continuous_batching(generation_config=generation, continuous_batching_config=cb)
            manager.warmup()  # builds the batch processor here, in this thread (it calls torch.manual_seed)
        except Exception as e:  # an attention implementation or cache layout it does not support
            if self._attention() != attention:
                self.model.set_attn_implementation(attention)
            raise RuntimeError(f"transformers continuous batching refused this model: {e}") from e
        finally:  # the manager also switched the shared module to eval mode: the trainer's dropout would stay off
            torch.set_rng_state(rng)
            self.model.train(was_training)
        # the generation thread inherits daemon-ness from the thread that starts it: a daemon, so a process that
        # never calls close() still exits
        if not hasattr(manager, "pause"):
            self._gates[temperature] = _LoopGate(manager)
        starter = threading.Thread(target=manager.start, daemon=True)
        starter.start()
        starter.join()
        error = self._probe(manager)
        self._managers[temperature] = manager
        self._hold(temperature)
        # the manager also switched "eager" attention to "paged|eager" (continuous_api.py
        # `switch_to_cb_friendly_attn`): the trainer gets its own back between polls
        self._cb_attention[temperature] = self._attention()
        self.model.set_attn_implementation(attention)
        if error is not None:
            self._stop(temperature)
            raise RuntimeError(f"transformers continuous batching failed on this model: {error}")

    def _probe(self, manager) -> str | None:
        """One greedy-or-sampled token from a one-token prompt: None when it came back, else why not."""
        rng = torch.get_rng_state()
        try:
            manager.add_request([self.pad_token_id], request_id="cohort-probe", max_new_tokens=1)
            out = manager.get_result(timeout=120)
        finally:
            torch.set_rng_state(rng)
        if out is None:
            return "no result within 120 s"
        if out.error is not None:
            return str(out.error)
        return None if len(out.logprobs) == len(out.generated_tokens) == 1 else f"got {out.generated_tokens}, {out.logprobs}"

    def submit(self, requests: Sequence[Request], policy_version: int) -> None:
        for r in requests:
            remaining = r.remaining
            if remaining.max_tokens == 0:  # resumed with nothing left to sample
                self._done.append(r.complete(Trajectory([], [], "length", policy_version)))
                continue
            self.start(remaining.temperature)
            if self._seed is None and r.seed is not None:
                self._seed = r.seed
            internal_id = f"{r.request_id}#{next(self._ids)}"
            self._streams[internal_id] = _Stream(r, remaining.temperature, policy_version)
            self._managers[remaining.temperature].add_request(
                r.engine_prompt, request_id=internal_id, max_new_tokens=remaining.max_tokens, streaming=True,
                eos_token_id=self.stop_token_ids)

    def poll(self, timeout: float | None, policy_version: int) -> list[Trajectory]:
        """Run the manager of the oldest request in flight until one request finishes (or `timeout`); return all finished."""
        if not self._done and self._streams:
            temperature = next(iter(self._streams.values())).temperature
            manager = self._managers[temperature]
            if self._seed is not None:
                torch.manual_seed(self._seed)
                self._seed = None
            was_training, attention = self.model.training, self._attention()
            self.model.eval()
            self.model.set_attn_implementation(self._cb_attention[temperature])
            self._release(temperature)
            try:
                self._read(manager, policy_version, timeout)
            finally:
                self._hold(temperature)
                self.model.train(was_training)
                self.model.set_attn_implementation(attention)
            self._read(manager, policy_version, 0)  # what the last step delivered before the loop parked
        done, self._done = self._done, []
        return done

    def _read(self, manager, policy_version: int, timeout: float | None) -> None:
        """Take the manager's outputs until one request finished (timeout None), or for `timeout` seconds at most (0:
        only what is there)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
            out = manager.get_result(timeout=wait)
            if out is not None:
                self._take(out, policy_version)
            elif not manager.is_running():
                self._fail_all(manager, "the transformers generation thread stopped")
                return
            if self._done and manager.output_router.output_queue.empty():
                return
            if out is None and deadline is not None and time.monotonic() >= deadline:
                return

    def _take(self, out, policy_version: int) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return  # aborted (its cancellation not yet applied) or the probe
        new = len(out.generated_tokens) - len(stream.token_ids)
        stream.token_ids, stream.logprobs = list(out.generated_tokens), list(out.logprobs)
        stream.versions += [policy_version] * new
        if not out.is_finished():
            return
        del self._streams[out.request_id]
        if out.error is not None:
            piece = Trajectory([], [], "error", stream.policy_version, error=str(out.error))
        else:
            piece = stream.piece(finish_reason(stream.token_ids, self.stop_token_ids))
        self._done.append(stream.request.complete(piece))

    def _fail_all(self, manager, reason: str) -> None:
        for internal_id, stream in list(self._streams.items()):
            if self._managers[stream.temperature] is manager:
                del self._streams[internal_id]
                self._done.append(stream.request.complete(Trajectory([], [], "error", stream.policy_version, error=reason)))

    def abort(self, request_ids: Iterable[str] | None, policy_version: int) -> list[Trajectory]:
        """Cancel these requests (None: all); each one's trajectory so far, status "aborted" (finished ones as finished)."""
        ids = None if request_ids is None else set(request_ids)
        for manager in self._managers.values():
            self._read(manager, policy_version, 0)  # finished-but-unread results first (paused: nothing new arrives)
        out = [t for t in self._done if ids is None or t.request_id in ids]
        self._done = [t for t in self._done if not (ids is None or t.request_id in ids)]
        for internal_id, stream in list(self._streams.items()):
            if ids is None or stream.request.request_id in ids:
                self._managers[stream.temperature].cancel_request(internal_id)
                del self._streams[internal_id]
                out.append(stream.request.complete(stream.piece("aborted")))
        return out

    def _hold(self, temperature: float) -> None:
        """Park this manager's generation loop (returns once it is parked; RuntimeError when it does not park within
        HOLD_TIMEOUT_S: `enter_pause`)."""
        gate = self._gates.get(temperature)
        pause = gate.pause() if gate is not None else self._managers[temperature].pause()
        enter_pause(pause, HOLD_TIMEOUT_S)
        self._pauses[temperature] = pause

    def _release(self, temperature: float) -> None:
        self._pauses.pop(temperature).__exit__(None, None, None)

    def _stop(self, temperature: float) -> None:
        manager = self._managers.pop(temperature)
        if temperature in self._pauses:
            self._release(temperature)
        self._gates.pop(temperature, None)
        manager.stop(block=True, timeout=10, hard_stop=True)
        manager.destroy()

    def close(self) -> None:
        for temperature in list(self._managers):
            with contextlib.suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._stop(temperature)
