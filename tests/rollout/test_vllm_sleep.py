"""VLLMEngine on a GPU, decided without one: the LLM's arguments, the sleep/wake order around a push, tensors handed
to vLLM as they are, and where a local server's vLLM is placed. A recording stand-in replaces vLLM's LLM (vLLM's
sleep mode needs CUDA); the engine's own code runs unchanged."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from cohort.models.placement import engine_gpus
from cohort.rollout.base import release_engine_memory
from cohort.rollout.server.app import child_visible_devices
from cohort.rollout.engines.vllm import VLLMEngine, llm_options


class _Runner:
    def __init__(self, calls):
        self.calls, self.received = calls, []

    def get_model(self):
        return torch.nn.Module()  # no config: no tied head to refresh

    def reload_weights(self, weights_iterator):
        self.calls.append("reload_weights")
        self.received = list(weights_iterator)


class _Worker:
    def __init__(self, calls):
        self.model_runner = _Runner(calls)


class _Executor:
    """vLLM's one-process executor has `driver_worker`; the multi-process one (tensor parallel) has not."""

    def __init__(self, calls, in_process: bool):
        if in_process:
            self.driver_worker = _Worker(calls)


class _LLM:
    """Records the calls VLLMEngine makes into vLLM's LLM. `collective_rpc(fn, args)` runs `fn` on each worker as vLLM
    does (in process: the object itself; multi-process: after a pickle round trip of the arguments, as vLLM's
    message queue sends them)."""

    def __init__(self, in_process: bool = True, workers: int = 1):
        self.calls: list = []
        self.workers = [_Worker(self.calls) for _ in range(workers)]
        self.runner = self.workers[0].model_runner
        self.llm_engine = type("LLMEngine", (), {})()
        self.llm_engine.model_executor = _Executor(self.calls, in_process)
        self.in_process = in_process

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if not self.in_process:
            args = pickle.loads(pickle.dumps(args))  # a generator or a CUDA-only tensor would fail here
        return [method(worker, *args, **(kwargs or {})) for worker in self.workers]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))
        return True

    def reset_prefix_cache(self, reset_running_requests=False):
        self.calls.append("reset_prefix_cache")
        return True


def _engine(sleep_mode: int, in_process: bool = True, workers: int = 1) -> VLLMEngine:
    engine = VLLMEngine.__new__(VLLMEngine)  # (no vLLM start: the state __init__ declares, with the stand-in)
    engine.llm, engine.sleep_mode, engine._asleep, engine._weights_discarded = _LLM(in_process, workers), sleep_mode, set(), False
    engine.policy_version, engine._live, engine._done, engine._scoring = 0, {}, [], {}
    if in_process:  # no real vLLM, so no parallel groups to restore in this process
        engine._ensure_parallel_state = lambda: None
    return engine


def test_llm_options_on_a_gpu_and_on_the_cpu():
    common = dict(dtype="bfloat16", seed=0, max_model_len=1024, enforce_eager=True, enable_prefix_caching=True)
    gpu = llm_options(Path("m"), cuda=True, gpu_memory_utilization=0.04, sleep_mode=2, tensor_parallel_size=2, **common)
    assert (gpu["gpu_memory_utilization"], gpu["enable_sleep_mode"], gpu["tensor_parallel_size"]) == (0.04, True, 2)
    assert "enable_chunked_prefill" not in gpu
    alone = llm_options(Path("m"), cuda=True, gpu_memory_utilization=None, sleep_mode=0, tensor_parallel_size=1, **common)
    assert alone["gpu_memory_utilization"] == 0.9 and "enable_sleep_mode" not in alone and "tensor_parallel_size" not in alone
    cpu = llm_options(Path("m"), cuda=False, gpu_memory_utilization=None, sleep_mode=0, tensor_parallel_size=1, **common)
    assert cpu["enable_chunked_prefill"] is False and "gpu_memory_utilization" not in cpu


def test_engine_enforce_eager_unset_is_eager_on_the_cpu_and_captures_cuda_graphs_on_a_gpu():
    # engine.enforce_eager's default (None) leaves vLLM its own choice per device: graphs on CUDA (enforce_eager False),
    # none on the CPU (True, as cohort always passed before); a value the user sets is passed as it is on either
    common = dict(dtype="bfloat16", seed=0, max_model_len=1024, enable_prefix_caching=True, gpu_memory_utilization=None,
                  sleep_mode=0, tensor_parallel_size=1)
    chosen = {(cuda, eager): llm_options(Path("m"), cuda=cuda, enforce_eager=eager, **common)["enforce_eager"]
              for cuda in (True, False) for eager in (None, True, False)}
    assert chosen == {(True, None): False, (False, None): True, (True, True): True, (False, True): True,
                      (True, False): False, (False, False): False}


def test_vllm_gets_its_batch_limits_from_the_batch_plan_on_a_gpu(tmp_path, monkeypatch):
    """build_engine hands vLLM max_num_seqs = the generation batch (4 prompts × 8 = 32 here) and one step's tokens
    (8,192 here, at least max_model_len); on CUDA they reach vllm.LLM, where vLLM's H100/H200 default of 1,024
    sequences would size a 2.3 GiB start-up sampler pass (cohort.plan.memory.engine_batch_limits). On the CPU, vLLM's own."""
    from cohort.config.resolve import load_config
    from cohort.trainer import build_engine as engines

    built = {}
    monkeypatch.setattr(engines, "VLLMEngine", lambda model_dir, **kwargs: built.update(kwargs))
    monkeypatch.setattr(engines, "stop_token_ids", lambda model_dir, tokenizer: [2])  # (no tokenizer here)
    cfg = load_config(None, ["train.prompts_per_step=4", "rollout.num_generations=8"])
    engines.build_engine(cfg, tmp_path, None, max_model_len=300, precision=None)
    assert built["batch_limits"] == (32, 8192)
    assert built["stop_ids"] == [2]  # from the caller's tokenizer: vLLM's side loads none of its own for them
    common = dict(dtype="bfloat16", seed=0, max_model_len=300, enforce_eager=True, enable_prefix_caching=True,
                  gpu_memory_utilization=0.04, sleep_mode=0, tensor_parallel_size=1, batch_limits=(32, 8192))
    gpu = llm_options(Path("m"), cuda=True, **common)
    assert (gpu["max_num_seqs"], gpu["max_num_batched_tokens"]) == (32, 8192)
    assert "max_num_seqs" not in llm_options(Path("m"), cuda=False, **common)


def test_per_request_seeds_on_the_cpu_only_unless_set(tmp_path, monkeypatch):
    """engine.per_request_seeds unset: each request carries its seed on the CPU (seeded runs repeat exactly there) and
    none on CUDA, where vLLM samples seeded requests one by one (issue 38, item 7); a value set is kept on either. The
    request's SamplingParams then carry its seed, or None (the engine's generator, LLM(seed=rollout.seed))."""
    from types import SimpleNamespace

    from cohort.config.resolve import load_config
    from cohort.rollout.base import SamplingConfig
    from cohort.rollout.engines.vllm import seeds_each_request
    from cohort.trainer import build_engine as engines

    chosen = {(cuda, s): seeds_each_request(s, cuda=cuda) for cuda in (True, False) for s in (None, True, False)}
    assert chosen == {(True, None): False, (False, None): True, (True, True): True, (False, True): True,
                      (True, False): False, (False, False): False}
    sampling = SamplingConfig(max_tokens=4, temperature=1.0)
    for each, expected in ((True, 1234), (False, None)):
        engine = SimpleNamespace(per_request_seeds=each, stop_token_ids=[2])
        assert VLLMEngine._params(engine, sampling, 1234).seed == expected
    built = {}
    monkeypatch.setattr(engines, "VLLMEngine", lambda model_dir, **kwargs: built.update(kwargs))
    monkeypatch.setattr(engines, "stop_token_ids", lambda model_dir, tokenizer: [2])
    for value in (None, False):
        cfg = load_config(None, ["train.prompts_per_step=4", "rollout.num_generations=8", "engine.per_request_seeds=" + {None: "null", False: "false"}[value]])
        engines.build_engine(cfg, tmp_path, None, max_model_len=300, precision=None)
        assert built["per_request_seeds"] is value


def test_sleep_before_the_update_weights_woken_before_the_push_and_kv_cache_after():
    engine = _engine(sleep_mode=2)
    assert release_engine_memory(engine) is True
    assert release_engine_memory(engine) is False  # already asleep: nothing more to release
    weight = torch.ones(3)
    engine.update_weights([("w", weight)], version=1)
    assert engine.llm.calls == [("sleep", 2), ("wake_up", ("weights",)), "reload_weights", ("wake_up", ("kv_cache",)),
                                "reset_prefix_cache"]
    assert engine.policy_version == 1 and not engine._asleep


def test_a_push_hands_vllm_each_tensor_as_it_is_never_a_host_copy():
    """A `meta` tensor stands for a CUDA one: `.cpu()` of it would raise, and what vLLM receives is the same storage."""
    engine = _engine(sleep_mode=0)
    tensors = [("a", torch.empty(4, 4, device="meta")), ("b", torch.ones(2))]
    engine.update_weights(iter(tensors), version=3)
    received = engine.llm.runner.received
    assert [name for name, _ in received] == ["a", "b"] and received[0][1].device.type == "meta"
    assert received[1][1].data_ptr() == tensors[1][1].data_ptr()
    assert engine.llm.calls == ["reload_weights", "reset_prefix_cache"]  # no sleep mode: no sleep, no wake


def test_no_sleep_without_sleep_mode_or_with_requests_in_flight_and_no_sampling_from_discarded_weights():
    assert release_engine_memory(_engine(sleep_mode=0)) is False
    busy = _engine(sleep_mode=1)
    busy._live = {"r": object()}
    assert release_engine_memory(busy) is False and busy.llm.calls == []
    discarded = _engine(sleep_mode=2)
    release_engine_memory(discarded)
    with pytest.raises(RuntimeError, match="discarded by engine.sleep_mode = 2 and no weights were pushed"):
        discarded._wake(("weights", "kv_cache"))
    level1 = _engine(sleep_mode=1)  # level 1 keeps a CPU copy of the weights: waking without a push is fine
    release_engine_memory(level1)
    level1._wake(("weights", "kv_cache"))
    assert level1.llm.calls == [("sleep", 1), ("wake_up", ("weights", "kv_cache"))]


def test_a_local_servers_gpus_follow_the_trainers():
    # one trainer process, 2 GPUs: vLLM on GPU 1; 4 trainers + tensor parallel 2 on 8 GPUs: GPUs 4 and 5
    assert (engine_gpus(1, 1, 2).devices, engine_gpus(1, 1, 2).shared) == ([1], False)
    assert engine_gpus(4, 2, 8).devices == [4, 5]
    assert (engine_gpus(1, 1, 1).devices, engine_gpus(1, 1, 1).shared) == ([0], True)  # one GPU: shared, split by the planner
    assert engine_gpus(1, 4, 2) is None and engine_gpus(1, 1, 0) is None
    # the child's CUDA_VISIBLE_DEVICES in the machine's numbering when the parent has its own list
    assert child_visible_devices("4,5,6,7", [1]) == "5" and child_visible_devices(None, [2, 3]) == "2,3"
    with pytest.raises(ValueError, match="not among"):
        child_visible_devices("0,1", [2])


def test_tensor_parallel_workers_are_reached_through_collective_rpc_never_driver_worker():
    """vLLM with tensor_parallel_size > 1 runs a MultiprocExecutor, which has no `driver_worker`: before, the first
    submit (`_ensure_parallel_state`) and every push (`_model_runner`) raised AttributeError there. Now both go
    through `collective_rpc`; each of the two workers gets every tensor (its loader takes its shard), as host
    copies, since the arguments are pickled to the workers' processes."""
    engine = _engine(sleep_mode=0, in_process=False, workers=2)
    engine._ensure_parallel_state()  # the workers keep their own groups: nothing to restore, no AttributeError
    engine.update_weights(iter([("a", torch.ones(2)), ("b", torch.zeros(3))]), version=1)
    assert engine.llm.calls == ["reload_weights", "reload_weights", "reset_prefix_cache"]
    for worker in engine.llm.workers:
        received = worker.model_runner.received
        assert [(n, t.tolist()) for n, t in received] == [("a", [1.0, 1.0]), ("b", [0.0, 0.0, 0.0])]
    assert engine.policy_version == 1
