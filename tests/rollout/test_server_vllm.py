"""Server mode end to end on loopback with real vLLM: `cohort serve` in a subprocess and the
session's shared engine served on a thread (never a second engine in the pytest process).

- the CLI server refuses requests without the token, takes a pushed weight set and
  generates with it, reporting the new version, with log-probs equal to the trainer's;
- `cohort train` logic in engine.mode=server splits generation across both servers,
  pushes weights after every step (bytes and time reported) and ends with both
  servers holding exactly the trainer's policy;
- deliberately corrupted weights are caught by the canary and stop the run;
- a server that dies mid-run fails the run with the state before the failed step saved;
- the request level over HTTP: a request aborted after a shorter one came back and then resumed
  starts with exactly its partial tokens, and its whole trajectory's log-probs equal the trainer's;
  `generate` through the server equals the engine's own.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import torch

from cohort.config.resolve import load_config
from cohort.models.pretrained import load_policy, load_tokenizer
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import FINISHED, Request, SamplingConfig, Trajectory
from cohort.rollout.server.client import RemoteEngine
from cohort.rollout.server.app import LocalServer, RolloutService, serve_in_thread
from cohort.trainer import checkpoint
from cohort.trainer.failure import RunFailed
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training
from tests.builders import write_doubling

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def cli_server(tiny_model_dir):
    """`cohort serve` as a user runs it, in a child process on a free loopback port, with a fresh token."""
    server = LocalServer(tiny_model_dir, max_model_len=128, start_timeout_s=300)
    yield server
    server.close()
    assert server.process.poll() is not None  # stopped


@pytest.fixture
def thread_server(cli_server, vllm_engine, tiny_model_dir):
    """The session engine behind HTTP on a thread (same token); its initial weights are put back afterwards."""
    server, url = serve_in_thread(RolloutService(vllm_engine, cli_server.token, model=str(tiny_model_dir), max_model_len=128))
    yield url
    server.shutdown()
    server.server_close()
    vllm_engine.update_weights(load_policy(tiny_model_dir, "float32").named_parameters(), 0)


def test_cli_server_refuses_without_token_then_generates_with_pushed_weights(cli_server, tiny_model_dir):
    body = json.dumps({"prompts": [[1, 2, 3]], "sampling": {"max_tokens": 4}, "seeds": [0]}).encode()
    for headers in ({}, {"Authorization": "Bearer nope"}):
        request = urllib.request.Request(cli_server.url + "/generate", data=body, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        assert info.value.code == 401
    tok = load_tokenizer(tiny_model_dir)
    policy = load_policy(tiny_model_dir, "float32")
    with torch.no_grad():  # a policy the server has never seen
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    engine = RemoteEngine([cli_server.url], token=cli_server.token, timeout_s=120)
    prompt = tok("12+34=", add_special_tokens=False)["input_ids"]
    before = engine.generate([prompt], SamplingConfig(8, 1.0), [3])[0]
    assert (torch.tensor(before.logprobs) - sequence_logprobs(policy, prompt, before.token_ids)).abs().max() > 1e-2
    sent = engine.update_weights(policy.named_parameters(), 5)
    assert sent > sum(p.numel() * 4 for p in policy.parameters())  # float32 weights plus safetensors headers
    outs = engine.generate([prompt] * 3, SamplingConfig(8, 0.7), [1, 2, 3])
    assert [o.policy_version for o in outs] == [5, 5, 5]
    for o in outs:
        assert torch.allclose(torch.tensor(o.logprobs), sequence_logprobs(policy, prompt, o.token_ids, temperature=0.7), atol=1e-4)
    health = json.loads(urllib.request.urlopen(cli_server.url + "/health", timeout=30).read())
    assert health["policy_version"] == 5 and health["max_model_len"] == 128
    assert health["vocab_size"] == len(tok)  # the tiny model's lm_head has one row per tokenizer entry
    outside = json.dumps({"prompts": [[1, len(tok)]], "sampling": {"max_tokens": 4}}).encode()  # one past the last id
    request = urllib.request.Request(cli_server.url + "/generate", data=outside, method="POST",
                                     headers={"Authorization": f"Bearer {cli_server.token}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 400
    assert json.loads(info.value.read())["error"] == (
        f"generate.prompts[0][1] = {len(tok)} is outside the vocabulary (token ids are 0..{len(tok) - 1})")


def _config(tmp_path, model_dir, urls, steps):
    data = tmp_path / "train.jsonl"
    write_doubling(data, 32, answers=False)
    (tmp_path / "server_rewards.py").write_text(
        "def sevens(prompts, completions, **kw):\n    return [c.count('7') / max(1, len(c)) for c in completions]\n")
    return load_config(None, [
        f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "engine.mode=server",
        f"engine.server_urls={json.dumps(urls)}", "engine.server_timeout_s=120", "rollout.num_generations=4",
        "rollout.max_completion_length=6", "train.prompts_per_step=4", "train.micro_batch_size=16", f"train.max_steps={steps}",
        "train.learning_rate=3e-3", "rewards=[{name: 'server_rewards:sevens'}]", f"run.output_dir={tmp_path / 'run'}",
        "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=0",
    ])


def test_train_in_server_mode_pushes_weights_and_generates_with_the_new_version(
        cli_server, thread_server, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("COHORT_SERVER_TOKEN", cli_server.token)
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = Trainer(_config(tmp_path, tiny_model_dir, [cli_server.url, thread_server], steps=12))
    try:
        run_training(trainer)
        lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        weights = sum(p.numel() * 4 for p in trainer.parts.policy.parameters())
        for line in lines[:-1]:  # every step but the last ends with a push to both servers (step 1 also starts with one)
            pushes = 2 if line["step"] == 1 else 1
            assert 2 * pushes * weights < line["sync/bytes_sent"] < 2 * pushes * weights * 1.01, line
            assert line["timing/sync_s"] > 0
        assert trainer.sync.last_canary_gap < 1e-4
        first, last = sum(l["reward"] for l in lines[:3]) / 3, sum(l["reward"] for l in lines[-3:]) / 3
        assert last > first + 0.1, (first, last)  # the servers sample from the improving policy
        trainer.sync.push()  # push the final policy, then both servers must generate with it
        prompt = trainer.parts.train_ids[0]
        outs = trainer.parts.engine.generate([prompt] * 4, SamplingConfig(6, 1.0), [1, 2, 3, 4])  # 2 on each server
        assert [o.policy_version for o in outs] == [12] * 4
        for o in outs:
            assert torch.allclose(torch.tensor(o.logprobs), sequence_logprobs(trainer.parts.policy, prompt, o.token_ids), atol=1e-4)
    finally:
        trainer.close()


class CorruptingEngine(RemoteEngine):
    """Pushes subtly wrong weights from version 2 on: the norm scale of layer 0 gains 5 %."""

    def update_weights(self, named_tensors, version):
        def corrupt():
            for name, tensor in named_tensors:
                yield name, (tensor * 1.05 if version >= 2 and name.endswith("layers.0.input_layernorm.weight") else tensor)

        return super().update_weights(corrupt(), version)


def test_canary_catches_corrupted_weights_and_stops_the_run(cli_server, thread_server, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("COHORT_SERVER_TOKEN", cli_server.token)
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = CorruptingEngine([thread_server], token=cli_server.token, timeout_s=120)
    trainer = Trainer(_config(tmp_path, tiny_model_dir, [thread_server], steps=5), engine=engine)
    start = time.perf_counter()
    try:
        with pytest.raises(RuntimeError, match="weight sync check failed at policy version 2"):
            run_training(trainer)
    finally:
        trainer.close()
    assert trainer.state.step == 2  # versions 0 and 1 synced fine; the push after step 2 was caught
    assert time.perf_counter() - start < 120


def test_a_server_that_dies_mid_run_saves_the_state_before_the_failed_step(vllm_engine, tiny_model_dir, tmp_path, monkeypatch):
    # the session engine behind HTTP on a thread, shut down just before step 3's generation request, which then
    # meets a closed port: the real client error, in the generate phase, after two good steps
    monkeypatch.setenv("COHORT_SERVER_TOKEN", "t")
    monkeypatch.syspath_prepend(str(tmp_path))
    server, url = serve_in_thread(RolloutService(vllm_engine, "t", model=str(tiny_model_dir), max_model_len=128))
    trainer = Trainer(_config(tmp_path, tiny_model_dir, [url], steps=5))
    real_submit = trainer.parts.engine.submit

    def submit_to_a_dying_server(requests, *args, **kwargs):
        # the scheduler counts the generation batches it admits: the server dies as the third batch is submitted
        if trainer.scheduler.generation_index == 3 and not server.socket._closed:
            server.shutdown()
            server.server_close()
        return real_submit(requests, *args, **kwargs)

    monkeypatch.setattr(trainer.parts.engine, "submit", submit_to_a_dying_server)
    try:
        with pytest.raises(RunFailed) as err:
            run_training(trainer)
    finally:
        trainer.close()
        vllm_engine.update_weights(load_policy(tiny_model_dir, "float32").named_parameters(), 0)
    run_dir = tmp_path / "run"
    message = str(err.value)
    assert message.startswith(f"run failed at step 3 (generate): rollout server {url}/submit: "), message
    assert f"Saved the last good state (after step 2) to {run_dir}/checkpoints/step-000002." in message
    assert message.endswith(f"Full traceback: {run_dir}/logs/error.log")
    meta = json.loads((checkpoint.latest_checkpoint(run_dir) / "meta.json").read_text())
    assert (meta["step"], meta["policy_version"], meta["generation_index"]) == (2, 2, 2)  # rewound: step 3's batch not taken


def _take(engine, request_id: str, got: list[Trajectory]) -> Trajectory:
    """The trajectory of `request_id` among `got`, polling for it if it is not there yet."""
    while not any(t.request_id == request_id for t in got):
        got += engine.poll(30.0)
    return next(t for t in got if t.request_id == request_id)


def test_requests_over_http_abort_and_resume_match_the_trainer(vllm_engine, tiny_model_dir):
    service = RolloutService(vllm_engine, "t", model=str(tiny_model_dir), max_model_len=128)
    server, url = serve_in_thread(service)
    engine = RemoteEngine([url], token="t", timeout_s=120)
    tok = load_tokenizer(tiny_model_dir)
    policy = load_policy(tiny_model_dir, "float32")
    with torch.no_grad():  # a policy the engine has never seen
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.05)
    prompt = tok("12+34=", add_special_tokens=False)["input_ids"]
    try:
        engine.update_weights(policy.named_parameters(), 3)
        # both decode in the same engine steps, so "long" has at least as many tokens as "short" when that one ends,
        # however late the abort arrives (the driver's polls are short: an abort gets in after a step or a few)
        engine.submit([Request("short", tuple(prompt), SamplingConfig(12), 11), Request("long", tuple(prompt), SamplingConfig(96), 12)])
        got = engine.poll(60.0)
        short = _take(engine, "short", got)
        got += engine.abort(["long"])  # a streaming engine returns what it has; the batch adapter already finished it
        long = _take(engine, "long", got)
        assert engine.in_flight == 0 and short.status in FINISHED and len(long.token_ids) >= len(short.token_ids) >= 8, (short, long)
        if long.status == "aborted":
            partial = long
        else:  # the batch adapter: cut the finished one where a streaming abort could have left it
            k = len(long.token_ids) // 2
            partial = Trajectory(long.token_ids[:k], long.logprobs[:k], "aborted", long.policy_version, long.versions[:k],
                                 long.loss_mask[:k], list(prompt), "long")
        k = len(partial.token_ids)
        engine.submit([Request("long", tuple(prompt), SamplingConfig(96), 12, resume=partial)])
        resumed = _take(engine, "long", [])
        assert resumed.status in FINISHED and len(resumed.token_ids) > k
        assert resumed.token_ids[:k] == partial.token_ids and resumed.logprobs[:k] == partial.logprobs
        assert resumed.versions == [3] * len(resumed.token_ids) and resumed.prompt_ids == prompt
        for t in (short, resumed):
            assert torch.allclose(torch.tensor(t.logprobs), sequence_logprobs(policy, prompt, t.token_ids), atol=1e-4)
        over_http = engine.generate([prompt] * 3, SamplingConfig(8, 0.7), [1, 2, 3])
        in_process = vllm_engine.generate([prompt] * 3, SamplingConfig(8, 0.7), [1, 2, 3])
        assert [t.token_ids for t in over_http] == [t.token_ids for t in in_process]
        assert torch.allclose(torch.tensor([x for t in over_http for x in t.logprobs]),
                              torch.tensor([x for t in in_process for x in t.logprobs]), atol=1e-6)
    finally:
        engine.close()
        server.shutdown()
        server.server_close()
        service.close()
        vllm_engine.update_weights(load_policy(tiny_model_dir, "float32").named_parameters(), 0)
