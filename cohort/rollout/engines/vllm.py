"""vLLM in the training process ("colocate"), with weights updated in place.

The engine is built once per run and never restarted. After each optimizer step
the trainer streams its parameters into vLLM's model runner with
`reload_weights`, which re-runs vLLM's post-load processing: on the CPU backend
that repacks the oneDNN copies of the linear layers and re-ties the LM head, so
no stale copy survives (a plain `load_weights` would leave them behind). The
prefix cache is then cleared, because cached KV blocks were computed with the
old weights.

Log-probs are requested in `processed_logprobs` mode: the log-softmax of the
logits after temperature (and top-k/top-p), which is what the trainer computes.

Each reload makes vLLM warn "<layer>: Failed to load weights" for layers that get
no tensor from the push and keep their old ones. Two are expected and are dropped
(a logging filter, only around our reload): `RotaryEmbedding` (its cos/sin cache
is derived from the config, not a weight) and, for a tied head, `ParallelLMHead`
(re-tied by `_refresh_tied_lm_head`). Any other layer's warning still shows.

Stop tokens: every request carries the checkpoint's stop set
(`cohort.models.pretrained.stop_token_ids`, the set the transformers engine uses)
as `stop_token_ids`, so stopping never depends on what vLLM itself reads from
the checkpoint (it adds the tokenizer's EOS and generation_config.json's
eos ids, both already in the set). The rollout server builds this engine from
its own checkpoint directory, so it computes the same set; `/health` reports it.

Requests stream (cohort/rollout/base.py's protocol): `submit` adds each request
to vLLM's scheduler (`LLMEngine.add_request`, DELTA outputs: each step hands
back only the new tokens and their log-probs), `poll` runs `LLMEngine.step`
until at least one request finishes and returns the finished ones whole, in the
order they finished, so a short completion comes back before a long one of the
same submit. Every new token is stamped with the policy version the engine
held at the step it arrived (`versions`). `abort` drops requests from vLLM and
returns what each had streamed back so far ("aborted"); submitting it again
with `resume=` continues from prompt + those tokens. `generate` is the drain
of the same stream (`RequestEngineMixin`): seeded, it samples exactly the
tokens `llm.generate` sampled, since vLLM draws each seeded request from its
own generator, whatever else is in the batch.
An exception inside `step` is not re-raised by `poll`: every request in flight
comes back with status "error" and the message (the trainer's drain raises it
with the request id); vLLM is told to drop them.

Weights change between engine steps, also with requests in flight
(`update_weights(..., in_flight=True)`, for asynchronous training): the new
weights are loaded, then vLLM's `reset_prefix_cache(reset_running_requests=True)`
preempts every running request and frees its KV blocks, so the whole prefix
cache (hashes included) is dropped; without `reset_running_requests` vLLM 0.32
refuses the reset while any block is in use (it logs "Failed to reset prefix
cache" and returns False, which would leave KV computed with the old weights
to be served to new requests). So, unlike AReaL, the in-flight requests' own
KV cache computed under the old weights is NOT kept: vLLM recomputes it (one
prefill over prompt + tokens sampled so far) with the new weights before their
next token. Every token sampled after the update is stamped with the new
version and its log-prob is exactly the new policy's given the whole sequence
(the trainer's log-prob, tests/rollout/test_vllm_inflight.py); the tokens
before keep the old version and log-probs. The cost is that prefill per update;
the gain is that no token mixes two policies (keeping the old KV, as AReaL
does, put the first new tokens' log-probs up to 7.5 nats away from the new
policy's on the tiny model with weights moved by N(0, 0.05^2)). Under async
scheduling (vLLM's default on GPU; the CPU backend turns it off, so it is
untested here) a batch may already be scheduled when `step` returns: the
preemption marks its output stale and vLLM drops it (`drop_stale_output`), so
those positions are resampled with the new weights too.
With `in_flight=False` (the synchronous trainer) an update while requests are
sampling raises RuntimeError, as before.

`score` (the sync check's canaries) runs through the same stepping as the
requests: its requests go into vLLM next to those in flight, which make
progress meanwhile and keep every token (nothing is swallowed), so the
canary also works between in-flight updates.

On CPU chunked prefill is off: vLLM samples a token for a request whose prefill is only partly done, throws it away
and rewinds the request's generator, which the CPU's generators cannot do ("CPU Generator does not use offset"), so
any seeded request whose prompt was split across steps failed: a batch of long prompts larger than one step's token
budget, resumed requests (prompt + sampled tokens), in-flight updates' recomputation. With it off, each prefill is
scheduled whole (tests/rollout/test_vllm_requests.py pins a 19,200-token seeded batch). vLLM warns that the model
"does not officially support disabling chunked prefill"; the log-prob tests agree with transformers as before.

On a GPU (CUDA only; none of this runs on the CPU backend, where validation refuses engine.sleep_mode):
- `gpu_memory_utilization` is the fraction of the GPU's *total* memory vLLM takes (vLLM 0.32 refuses to start when
  less than that is free, and sizes its KV cache to fill what its weights and profile run leave of it); cohort's
  planner derives it (cohort/plan/memory.py); None here means vLLM alone on its GPU: 0.9, vLLM's own default.
- Sleep mode (engine.sleep_mode, vLLM built with enable_sleep_mode, which turns on its CuMem allocator):
  `release_memory()`, which the trainer calls before its update, runs `LLM.sleep(level)`. vLLM first pauses its
  scheduler (aborting whatever it holds, which is nothing: it sleeps only when no request is in flight) and clears
  the prefix cache; level 1 then copies the weights to pinned CPU memory and discards the KV cache; level 2 discards
  both, keeping CPU copies of only the model's buffers (rotary caches) and vLLM's runtime and graph pools. Waking is
  in two halves, each only when needed: `update_weights` wakes the weights just before loading the push (at level 2
  they come back as uninitialised memory, which the push overwrites whole), then the KV cache just after, so the
  canary and the next generation find it; `submit`/`score` wake whatever still sleeps. Before each wake the
  process's cached CUDA blocks are returned to the driver (`torch.cuda.empty_cache`): the trainer's freed
  activations would otherwise stay reserved by PyTorch's allocator, out of reach of vLLM's. A level-2 engine whose
  weights were discarded and not pushed since refuses to generate (it would sample from uninitialised weights).
- The in-process push hands the trainer's tensors to vLLM's loader as they are: a CUDA tensor goes device to device
  (vLLM's `param.copy_`), never through host memory; the trainer's stream makes each tensor (its cast) when vLLM
  reads it, and vLLM's layerwise reload holds at most one decoder layer's tensors before processing them, which
  bounds the bytes in flight.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch

from cohort.models.pretrained import load_tokenizer, stop_token_ids
from cohort.rollout.base import Request, RequestEngineMixin, SamplingConfig, Trajectory, finish_reason

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _refresh_tied_lm_head(model: torch.nn.Module) -> None:
    """Re-tie and re-pack an LM head that shares the input embedding.

    With tied embeddings the checkpoint has no `lm_head.weight`, so vLLM's reload
    loads nothing into the head and puts its *old* packed (oneDNN / sgl) copy
    back: the engine would sample with a stale output layer (it logs
    "ParallelLMHead: Failed to load weights"). Point the head at the freshly
    loaded embedding and run its post-load processing again.
    """
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    if not (getattr(config, "tie_word_embeddings", False) and head is not None and embed is not None):
        return
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None and hasattr(method, "process_weights_after_loading"):
        method.process_weights_after_loading(head)


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for the given layer classes (see the module docstring)."""

    def __init__(self, layers: tuple[str, ...]):
        super().__init__()
        self.layers = layers

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args and record.args[0] in self.layers)


@contextlib.contextmanager
def expected_reload_warnings_dropped(tied_head: bool):
    """While reloading: no warning for RotaryEmbedding, nor for ParallelLMHead when the head is tied."""
    quiet = _ExpectedReloadWarnings(("RotaryEmbedding", "ParallelLMHead") if tied_head else ("RotaryEmbedding",))
    logger = logging.getLogger(RELOAD_LOGGER)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _reload_on_worker(worker, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run by `collective_rpc` on every vLLM worker (in this process, or each tensor-parallel worker's own): reload
    the weights in place (each worker's loader takes its shard) and re-tie a tied head, with the expected warnings
    dropped (module docstring). `worker` is vLLM's WorkerWrapperBase; its `.worker` the Worker."""
    worker = getattr(worker, "worker", worker)
    model = worker.model_runner.get_model()
    with expected_reload_warnings_dropped(getattr(getattr(model, "config", None), "tie_word_embeddings", False)):
        worker.model_runner.reload_weights(weights_iterator=iter(named_tensors))
    _refresh_tied_lm_head(worker.model_runner.get_model())


def _restore_parallel_state(worker) -> None:
    """Run by `collective_rpc` on the in-process worker: its distributed set-up again (`_ensure_parallel_state`)."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.utils.network_utils import get_open_port
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

    worker = getattr(worker, "worker", worker)
    with set_current_vllm_config(worker.vllm_config):
        init_worker_distributed_environment(worker.vllm_config, worker.rank, f"tcp://127.0.0.1:{get_open_port()}",
                                            worker.local_rank, current_platform.dist_backend)


OWN_GPU_UTILIZATION = 0.9  # vLLM's own default: the engine alone on its GPU (cohort.plan derives it when shared)


def llm_options(model_dir: Path, *, dtype: str, seed: int, max_model_len: int, enforce_eager: bool | None,
                enable_prefix_caching: bool, cuda: bool, gpu_memory_utilization: float | None, sleep_mode: int,
                tensor_parallel_size: int, batch_limits: tuple[int, int] | None = None) -> dict:
    """The keyword arguments of `vllm.LLM` for this engine: the GPU ones only on CUDA, the CPU's chunked-prefill
    switch only on CPU (module docstring); sleep mode only when asked (vLLM then allocates through its CuMem pool).
    `batch_limits`: (max_num_seqs, max_num_batched_tokens) from the batch plan (cohort.plan.memory.engine_batch_limits),
    passed on CUDA, where vLLM's own defaults (1,024 sequences on an H100/H200) size a start-up sampler pass that
    a colocated split has no room for; None, or on the CPU, vLLM's defaults. `enforce_eager` None: eager on the CPU,
    CUDA graphs on a GPU (engine.enforce_eager)."""
    kwargs = dict(
        model=str(model_dir), tokenizer=str(model_dir), dtype=dtype, seed=seed, max_model_len=max_model_len,
        enforce_eager=(not cuda) if enforce_eager is None else enforce_eager, enable_prefix_caching=enable_prefix_caching,
        logprobs_mode="processed_logprobs",
    )
    if cuda:
        kwargs["gpu_memory_utilization"] = OWN_GPU_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
        if batch_limits is not None:
            kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"] = batch_limits
    else:  # (module docstring: vLLM's CPU sampler cannot rewind a seeded request's generator after a partial prefill)
        kwargs["enable_chunked_prefill"] = False
    if sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = tensor_parallel_size
    return kwargs


def seeds_each_request(setting: bool | None, *, cuda: bool) -> bool:
    """engine.per_request_seeds: whether each request carries its own seed. None: on the CPU only. On CUDA vLLM 0.32's
    sampler draws a seeded request's noise one request at a time (`random_sample`: a kernel per request per decoding
    step) and its FlashInfer sampler refuses per-request generators; unseeded requests share one draw, from the engine's
    generator (`LLM(seed=rollout.seed)`)."""
    return (not cuda) if setting is None else setting


class _Live:
    """A request inside vLLM: what it has streamed back so far (token ids, log-probs, the version of each token)."""

    def __init__(self, request: Request, policy_version: int):
        self.request = request
        self.policy_version = policy_version  # the version held when this piece started
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []

    def trajectory(self, status: str, error: str | None = None) -> Trajectory:
        """The request's whole trajectory (its resumed tokens first) from what this piece has so far."""
        piece = Trajectory(list(self.token_ids), list(self.logprobs), status, self.policy_version, list(self.versions),
                           error=error)
        return self.request.complete(piece)


class VLLMEngine(RequestEngineMixin):
    in_flight_updates = True  # update_weights(..., in_flight=True) loads between steps (module docstring)

    def __init__(self, model_dir: Path, *, dtype: str, max_model_len: int, seed: int = 0, enforce_eager: bool | None = None,
                 enable_prefix_caching: bool = True, kv_cache_gib: float = 1.0, gpu_memory_utilization: float | None = None,
                 sleep_mode: int = 0, tensor_parallel_size: int = 1, batch_limits: tuple[int, int] | None = None,
                 per_request_seeds: bool | None = None, stop_ids: list[int] | None = None):
        """`stop_ids`: the checkpoint's stop token ids (`stop_token_ids`), when the caller has its tokenizer at hand;
        None: read from model_dir's tokenizer here (`cohort serve`)."""
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gib)))))
        from vllm import LLM

        kwargs = llm_options(model_dir, dtype=dtype, seed=seed, max_model_len=max_model_len, enforce_eager=enforce_eager,
                             enable_prefix_caching=enable_prefix_caching, cuda=torch.cuda.is_available(),
                             gpu_memory_utilization=gpu_memory_utilization, sleep_mode=sleep_mode,
                             tensor_parallel_size=tensor_parallel_size, batch_limits=batch_limits)
        self.llm = LLM(**kwargs)
        self.per_request_seeds = seeds_each_request(per_request_seeds, cuda=torch.cuda.is_available())
        self.sleep_mode = sleep_mode
        self._asleep: set[str] = set()  # "weights", "kv_cache": what vLLM holds asleep now (sleep mode)
        self._weights_discarded = False  # level 2 slept and no push since: the weights are uninitialised memory
        self.policy_version = 0
        # the checkpoint's set, as every engine's
        self.stop_token_ids = stop_ids if stop_ids is not None else stop_token_ids(model_dir, load_tokenizer(model_dir))
        self._live: dict[str, _Live] = {}  # request id -> its progress, for the requests inside vLLM
        self._done: list[Trajectory] = []  # finished, not yet returned by poll
        self._scoring: dict[str, object] = {}  # score()'s request ids inside vLLM -> their final output (None until then)
        self._scoring_failed: str | None = None  # why vLLM failed while score() was waiting
        self._score_ids = itertools.count()

    def _params(self, sampling: SamplingConfig, seed: int | None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1, max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1, seed=seed if self.per_request_seeds else None, logprobs=0,
            stop_token_ids=list(self.stop_token_ids),
            detokenize=False,  # the trainer reads token ids; incremental detokenizing cost 20-30% of tokens/s (bench/rollout.py)
            output_kind=RequestOutputKind.DELTA,  # each step returns only the new tokens: appended, never re-copied
        )

    def _workers_here(self) -> bool:
        """Whether vLLM's worker lives in this process (its one-process executor, which has a `driver_worker`). With
        `tensor_parallel_size > 1` vLLM runs a `MultiprocExecutor` (or a Ray one) instead: no `driver_worker`, each
        worker in its own process, reached only through `collective_rpc`."""
        return hasattr(self.llm.llm_engine.model_executor, "driver_worker")

    def _ensure_parallel_state(self) -> None:
        """Rebuild vLLM's process-wide parallel groups if another engine of this process was closed since.

        vLLM keeps its (here one-process) parallel groups in module globals, and an engine's shutdown destroys them
        for the whole process, so the engines still alive would fail on their next call ("pipeline model parallel
        group is not initialized"). Re-running the worker's own distributed set-up restores them. Workers in their
        own processes (tensor parallel) keep their own groups: nothing here can destroy them.
        """
        if not self._workers_here():
            return
        from vllm.distributed import parallel_state

        if parallel_state.model_parallel_is_initialized():
            return
        self.llm.collective_rpc(_restore_parallel_state)

    def submit(self, requests: Sequence[Request]) -> None:
        """Add each request to vLLM's scheduler (prompt + resumed tokens, as sampled); one with no tokens left to
        sample (`remaining.max_tokens == 0`) is finished at once ("length")."""
        from vllm.inputs import TokensPrompt

        self._ensure_parallel_state()
        self._wake(("weights", "kv_cache"))
        added: list[str] = []
        current = None
        try:
            for r in requests:
                current = r.request_id
                if r.request_id in self._live or any(t.request_id == r.request_id for t in self._done):
                    raise ValueError(f"request id {r.request_id!r} is already in flight; ids must be unique until poll "
                                     "or abort returns them")
                added.append(r.request_id)
                if r.remaining.max_tokens == 0:
                    self._done.append(_Live(r, self.policy_version).trajectory("length"))
                    continue
                # the LLM's own renderer step, as llm.generate takes it (a raw prompt in add_request is deprecated)
                prompt = self.llm._preprocess_cmpl_one(TokensPrompt(prompt_token_ids=r.engine_prompt))
                self.llm.llm_engine.add_request(r.request_id, prompt, self._params(r.remaining, r.seed))
                self._live[r.request_id] = _Live(r, self.policy_version)
        except Exception as exc:  # e.g. a prompt longer than max_model_len: none of this call's requests stays
            self.abort(added)
            raise ValueError(f"VLLMEngine.submit: request {current!r} was refused: {exc}") from exc

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        """Step vLLM until a request finishes (or none is left, or `timeout` s passed); the finished ones, whole."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._ensure_parallel_state()
        while self._live and not self._done and (deadline is None or time.monotonic() < deadline):
            self._step()
        done, self._done = self._done, []
        return done

    def _step(self) -> None:
        """One vLLM step: new tokens appended (stamped with the version held now), finished requests moved to _done."""
        try:
            outputs = self.llm.llm_engine.step()
        except Exception as exc:
            self._fail(exc)
            return
        for out in outputs:
            if out.request_id in self._scoring:
                if out.finished:
                    self._scoring[out.request_id] = out
                continue
            live = self._live.get(out.request_id)
            if live is None:
                continue  # aborted since it was scheduled
            sample = out.outputs[0]
            new = list(sample.token_ids)
            live.token_ids += new
            live.logprobs += [float(step[tok].logprob) for step, tok in zip(sample.logprobs or [], new)]
            live.versions += [self.policy_version] * len(new)
            if out.finished:
                del self._live[out.request_id]
                self._done.append(live.trajectory(finish_reason(live.token_ids, self.stop_token_ids)))

    def _fail(self, exc: Exception) -> None:
        """vLLM raised inside a step: every request in flight comes back with status "error" and the message (the
        drain, `generate`, raises it); what each had sampled is kept, and vLLM is told to drop them."""
        message = f"vLLM raised in LLMEngine.step: {type(exc).__name__}: {exc}"
        failed, self._live = self._live, {}
        if self._scoring:
            self._scoring_failed = message
        with contextlib.suppress(Exception):
            self.llm.llm_engine.abort_request(list(failed) + list(self._scoring))
        self._done += [live.trajectory("error", message) for live in failed.values()]

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        """Stop these requests (None: all); each one's trajectory so far, "aborted" (finished ones come back finished)."""
        ids = set(self._live) | {t.request_id for t in self._done} if request_ids is None else set(request_ids)
        finished = [t for t in self._done if t.request_id in ids]
        self._done = [t for t in self._done if t.request_id not in ids]
        stopped = [self._live.pop(i) for i in list(self._live) if i in ids]
        if stopped:
            self.llm.llm_engine.abort_request([live.request.request_id for live in stopped])
        return finished + [live.trajectory("aborted") for live in stopped]

    @property
    def in_flight(self) -> int:
        return len(self._live) + len(self._done)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, *,
                       in_flight: bool = False) -> None:
        """Load new weights between two engine steps; tokens sampled from now on carry `version`.

        With requests being sampled this needs `in_flight=True` (else RuntimeError): they continue under the new
        weights, their KV cache recomputed with them, and the prefix cache is dropped (module docstring)."""
        if self._live and not in_flight:
            raise RuntimeError(f"VLLMEngine.update_weights while {len(self._live)} requests are being sampled: poll "
                               "them to the end or abort them first, or pass in_flight=True to load the new weights "
                               "under them (asynchronous training)")
        self._ensure_parallel_state()
        self._wake(("weights",))  # (sleep mode: the weights first, the KV cache once they are loaded)
        tensors = ((n, t.detach()) for n, t in named_tensors)  # each as it is: a CUDA one is copied device to device
        if not self._workers_here():  # workers in other processes: the tensors travel pickled, as host copies
            tensors = [(n, t.cpu()) for n, t in tensors]
        self.llm.collective_rpc(_reload_on_worker, args=(tensors,))
        self._weights_discarded = False
        self._wake(("kv_cache",))
        # reset_running_requests: preempt the running requests (their KV recomputed with the new weights) so that
        # every block is free; vLLM refuses (returns False) to reset a cache whose blocks are in use
        if not self.llm.reset_prefix_cache(reset_running_requests=bool(self._live)):
            raise RuntimeError("VLLMEngine.update_weights: vLLM refused to reset its prefix cache after the new weights "
                               "were loaded; KV computed with the old weights could be reused")
        self.policy_version = version

    def release_memory(self) -> bool:
        """Sleep while the trainer updates (engine.sleep_mode 1 or 2; module docstring): the KV cache, and the weights,
        leave the GPU. A no-op (False) without sleep mode, when already asleep, or with requests in flight (vLLM would
        abort them)."""
        if not self.sleep_mode or self._asleep or self._live or self._scoring or self._done:
            return False
        self.llm.sleep(level=self.sleep_mode)
        self._asleep = {"weights", "kv_cache"}
        self._weights_discarded = self.sleep_mode == 2
        return True

    def _wake(self, tags: tuple[str, ...]) -> None:
        """Wake those of `tags` that sleep, after handing the process's cached CUDA blocks back to the driver."""
        todo = [tag for tag in tags if tag in self._asleep]
        if not todo:
            return
        if "kv_cache" in todo and self._weights_discarded:
            raise RuntimeError("VLLMEngine: the weights were discarded by engine.sleep_mode = 2 and no weights were "
                               "pushed since; push the policy (update_weights) before generating or scoring")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the trainer's freed blocks, held by PyTorch's cache, to vLLM's allocator
        self.llm.wake_up(tags=todo)
        self._asleep -= set(todo)

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        """The engine's log-probs of each completion after its prompt, also with requests in flight: the scoring
        requests are stepped with them (they progress and keep their tokens; nothing of theirs is returned here)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self._ensure_parallel_state()
        self._wake(("weights", "kv_cache"))
        params = SamplingParams(max_tokens=1, temperature=temperature, prompt_logprobs=0, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        ids = [f"cohort-score/{next(self._score_ids)}" for _ in prompts]
        self._scoring_failed = None
        try:
            for rid, p, c in zip(ids, prompts, completions):
                prompt = self.llm._preprocess_cmpl_one(TokensPrompt(prompt_token_ids=list(p) + list(c)))
                self.llm.llm_engine.add_request(rid, prompt, params)
                self._scoring[rid] = None
            while any(self._scoring[rid] is None for rid in ids):
                if self._scoring_failed is not None:
                    raise RuntimeError(f"VLLMEngine.score: {self._scoring_failed}")
                self._step()
            outs = [self._scoring[rid] for rid in ids]
        finally:
            left = [rid for rid in ids if self._scoring.pop(rid, None) is None]
            if left:
                with contextlib.suppress(Exception):
                    self.llm.llm_engine.abort_request(left)
        return [[float(entry[tok].logprob) for entry, tok in zip(out.prompt_logprobs[len(p):], c)]
                for out, p, c in zip(outs, prompts, completions)]

    def close(self) -> None:
        import gc

        del self.llm
        gc.collect()
