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
(`cohort.models.loading.stop_token_ids`, the set the transformers engine uses)
as `stop_token_ids`, so stopping never depends on what vLLM itself reads from
the checkpoint (it adds the tokenizer's EOS and generation_config.json's
eos ids, both already in the set). The rollout server builds this engine from
its own checkpoint directory, so it computes the same set; `/health` reports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterable

import torch

from cohort.models.loading import load_tokenizer, stop_token_ids
from cohort.rollout.base import BatchRequests, Request, SamplingConfig, Trajectory

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


class VLLMEngine(BatchRequests):
    def __init__(self, model_dir: Path, *, dtype: str, max_model_len: int, seed: int = 0, enforce_eager: bool = True,
                 enable_prefix_caching: bool = True, kv_cache_gib: float = 1.0, gpu_memory_utilization: float = 0.5):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gib)))))
        from vllm import LLM

        kwargs = dict(
            model=str(model_dir), tokenizer=str(model_dir), dtype=dtype, seed=seed, max_model_len=max_model_len,
            enforce_eager=enforce_eager, enable_prefix_caching=enable_prefix_caching, logprobs_mode="processed_logprobs",
        )
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = LLM(**kwargs)
        self.policy_version = 0
        self.stop_token_ids = stop_token_ids(model_dir, load_tokenizer(model_dir))  # the checkpoint's set, as every engine's

    def _params(self, sampling: SamplingConfig, seed: int | None, logprobs: bool = True):
        from vllm import SamplingParams

        return SamplingParams(
            n=1, max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1, seed=seed, logprobs=0 if logprobs else None,
            stop_token_ids=list(self.stop_token_ids),
            detokenize=False,  # the trainer reads token ids; incremental detokenizing cost 20-30% of tokens/s (bench/rollout.py)
        )

    def _ensure_parallel_state(self) -> None:
        """Rebuild vLLM's process-wide parallel groups if another engine of this process was closed since.

        vLLM keeps its (here one-process) parallel groups in module globals, and an engine's shutdown destroys them
        for the whole process, so the engines still alive would fail on their next call ("pipeline model parallel
        group is not initialized"). Re-running the worker's own distributed set-up restores them.
        """
        from vllm.config import set_current_vllm_config
        from vllm.distributed import parallel_state
        from vllm.platforms import current_platform
        from vllm.utils.network_utils import get_open_port
        from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

        if parallel_state.model_parallel_is_initialized():
            return
        worker = self.llm.llm_engine.model_executor.driver_worker.worker
        with set_current_vllm_config(worker.vllm_config):
            init_worker_distributed_environment(worker.vllm_config, worker.rank, f"tcp://127.0.0.1:{get_open_port()}",
                                                worker.local_rank, current_platform.dist_backend)

    def _sample(self, requests: list[Request]) -> list[Trajectory]:
        from vllm.inputs import TokensPrompt

        self._ensure_parallel_state()
        live = [i for i, r in enumerate(requests) if r.remaining.max_tokens > 0]
        out = [Trajectory([], [], "length", self.policy_version) for _ in requests]  # nothing left to sample
        if not live:
            return out
        params = [self._params(requests[i].remaining, requests[i].seed) for i in live]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=requests[i].engine_prompt) for i in live], params,
                                    use_tqdm=False)
        for i, result in zip(live, outputs):
            sample = result.outputs[0]
            ids = list(sample.token_ids)
            logps = [float(step[tok].logprob) for step, tok in zip(sample.logprobs or [], ids)]
            out[i] = Trajectory.sampled(ids, logps, self.stop_token_ids, self.policy_version)
        return out

    def _model_runner(self):
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self._ensure_parallel_state()
        runner = self._model_runner()
        tied = getattr(getattr(runner.get_model(), "config", None), "tie_word_embeddings", False)
        with expected_reload_warnings_dropped(tied):
            runner.reload_weights(weights_iterator=((n, t.detach()) for n, t in named_tensors))
        _refresh_tied_lm_head(runner.get_model())
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float = 1.0) -> list[list[float]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._ensure_parallel_state()
        params = SamplingParams(max_tokens=1, temperature=temperature, prompt_logprobs=0, detokenize=False)
        requests = [TokensPrompt(prompt_token_ids=list(p) + list(c)) for p, c in zip(prompts, completions)]
        outs = self.llm.generate(requests, params, use_tqdm=False)
        return [[float(entry[tok].logprob) for entry, tok in zip(out.prompt_logprobs[len(p):], c)]
                for out, p, c in zip(outs, prompts, completions)]

    def close(self) -> None:
        import gc

        del self.llm
        gc.collect()
