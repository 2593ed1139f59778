"""The vLLM engine's request level: completions stream back as they finish, aborted ones continue from their tokens.

The seeds below were read off the tiny random model (tests/conftest.py, `build_random_tiny(seed=0)`) once: with the
prompt "12+34=", temperature 1.0 and 40 tokens allowed, seeds 3, 4 and 5 reach the limit without sampling a stop token
(seeds 0, 1, 2 stop after 27, 15 and 13). vLLM draws a seeded request from its own generator, so these samples do not
depend on what else is in the batch; each test asserts the property it relies on before using it.
"""

from __future__ import annotations

import pytest
import torch

from cohort.models.pretrained import load_policy, load_tokenizer
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import FINISHED, Request, SamplingConfig, Trajectory, batch_requests, generate_requests

pytestmark = pytest.mark.vllm

LONG = SamplingConfig(40, 1.0)


@pytest.fixture
def policy(vllm_engine, tiny_model_dir):
    """The checkpoint's weights, pushed into the shared engine (other tests may have changed them) as version 0."""
    policy = load_policy(tiny_model_dir, "float32")
    vllm_engine.update_weights(policy.named_parameters(), 0)
    yield policy
    vllm_engine.abort()  # nothing of a failed test stays in flight for the next one
    vllm_engine.update_weights(policy.named_parameters(), 0)


@pytest.fixture
def prompt(tiny_model_dir):
    return tuple(load_tokenizer(tiny_model_dir)("12+34=", add_special_tokens=False)["input_ids"])


def _close(engine_logprobs, trainer_logprobs) -> bool:
    return torch.allclose(torch.tensor(engine_logprobs), trainer_logprobs, atol=1e-4)


def test_poll_returns_short_completions_before_a_long_one(vllm_engine, policy, prompt):
    # the long request is submitted first; the two short ones (2 tokens, seeds whose first tokens are not a stop
    # token) finish at step 2, the long one at step 40. Before streaming, the first poll returned all three at once.
    long = Request("long", prompt, LONG, seed=3)
    shorts = [Request(f"short/{s}", prompt, SamplingConfig(2, 1.0), seed=s) for s in (4, 5)]
    vllm_engine.submit([long, *shorts])
    assert vllm_engine.in_flight == 3
    first = vllm_engine.poll()
    assert sorted(t.request_id for t in first) == ["short/4", "short/5"]
    assert [(len(t.token_ids), t.status) for t in first] == [(2, "length"), (2, "length")]
    assert vllm_engine.in_flight == 1
    (second,) = vllm_engine.poll()
    assert (second.request_id, len(second.token_ids), second.status) == ("long", 40, "length")
    assert list(second.prompt_ids) == list(prompt) and second.versions == [0] * 40
    assert vllm_engine.in_flight == 0 and vllm_engine.poll() == []


def _partial(engine, request: Request, steps: int):
    """`request` sampled for `steps` steps (a side request of `steps` tokens, polled to its end, paces it), then aborted."""
    side = Request(f"{request.request_id}/side", request.prompt_ids, SamplingConfig(steps, 1.0), seed=4)
    engine.submit([request, side])
    assert [t.request_id for t in engine.poll()] == [side.request_id]  # seed 4 does not stop within 40 tokens
    (partial,) = engine.abort([request.request_id])
    return partial


def test_an_aborted_request_continues_from_its_tokens_and_its_logprobs_match_the_trainer(vllm_engine, policy, prompt):
    request = Request("r", prompt, LONG, seed=3)
    partial = _partial(vllm_engine, request, steps=8)
    # one token per request per step: 8 steps, 8 tokens (before streaming, abort returned 0 tokens)
    assert (partial.status, len(partial.token_ids), partial.versions) == ("aborted", 8, [0] * 8)
    assert vllm_engine.in_flight == 0 and not vllm_engine.llm.llm_engine.has_unfinished_requests()
    assert _close(partial.logprobs, sequence_logprobs(policy, list(prompt), partial.token_ids))

    (whole,) = generate_requests(vllm_engine, [Request("r", prompt, LONG, seed=3, resume=partial)])
    assert whole.token_ids[:8] == partial.token_ids and whole.logprobs[:8] == partial.logprobs
    assert 8 < len(whole.token_ids) <= 40 and whole.status in FINISHED
    # every log-prob, the 8 old and the new ones, is the trainer's log-prob of that token after prompt + the tokens before
    assert _close(whole.logprobs, sequence_logprobs(policy, list(prompt), whole.token_ids))


def test_tokens_sampled_after_a_weight_update_carry_the_new_version(vllm_engine, policy, prompt, tiny_model_dir):
    partial = _partial(vllm_engine, Request("v", prompt, LONG, seed=5), steps=6)
    assert partial.versions == [0] * 6
    updated = load_policy(tiny_model_dir, "float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    vllm_engine.update_weights(updated.named_parameters(), 1)

    (whole,) = generate_requests(vllm_engine, [Request("v", prompt, LONG, seed=5, resume=partial)])
    n = len(whole.token_ids)
    assert n > 6 and whole.versions == [0] * 6 + [1] * (n - 6) and whole.policy_version == 0
    # old tokens keep the old policy's log-probs; the new ones are the updated policy's, given all tokens before them
    assert whole.logprobs[:6] == partial.logprobs
    assert _close(whole.logprobs[6:], sequence_logprobs(updated, list(prompt), whole.token_ids)[6:])
    assert not _close(whole.logprobs[6:], sequence_logprobs(policy, list(prompt), whole.token_ids)[6:])  # it did change


def test_a_request_with_no_tokens_left_finishes_at_once(vllm_engine, policy, prompt):
    (done,) = vllm_engine.generate([list(prompt)], SamplingConfig(3, 1.0), [3])
    cut = Trajectory(done.token_ids, done.logprobs, "aborted")  # as if aborted right after its 3rd token of 3
    again = Request("full", prompt, SamplingConfig(3, 1.0), seed=3, resume=cut)
    vllm_engine.submit([again])
    assert vllm_engine.in_flight == 1 and not vllm_engine.llm.llm_engine.has_unfinished_requests()  # vLLM not asked
    (finished,) = vllm_engine.abort()  # finished before the abort, not yet polled: it comes back finished
    assert (finished.token_ids, finished.logprobs, finished.status) == (done.token_ids, done.logprobs, "length")
    vllm_engine.submit([again])
    (polled,) = vllm_engine.poll()
    assert (polled.token_ids, polled.status, vllm_engine.in_flight) == (done.token_ids, "length", 0)


def test_generate_is_the_drain_of_submit_and_poll_and_samples_what_llm_generate_sampled(vllm_engine, policy, prompt):
    from vllm.inputs import TokensPrompt

    prompts = [list(prompt)] * 3 + [[5, 6, 7, 8]] * 3
    sampling, seeds = SamplingConfig(12, 0.7, top_k=20), [11, 12, 13, 14, 15, 16]
    generated = vllm_engine.generate(prompts, sampling, seeds)

    requests = batch_requests(prompts, sampling, seeds, prefix="drain")
    vllm_engine.submit(requests)
    by_id = {}
    while vllm_engine.in_flight:
        by_id.update({t.request_id: t for t in vllm_engine.poll()})
    streamed = [by_id[r.request_id] for r in requests]
    assert [t.token_ids for t in streamed] == [t.token_ids for t in generated]
    assert [t.logprobs for t in streamed] == [t.logprobs for t in generated]

    # the batch call this engine made before it streamed: llm.generate, final outputs only
    params = [vllm_engine._params(sampling, s) for s in seeds]
    before = vllm_engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in before] == [t.token_ids for t in generated]
    assert len({tuple(t.token_ids) for t in generated}) == 6  # six seeds, six different samples


def test_weights_cannot_change_while_requests_sample_unless_in_flight(vllm_engine, policy, prompt):
    vllm_engine.submit([Request("busy", prompt, LONG, seed=3)])
    with pytest.raises(RuntimeError, match=r"VLLMEngine.update_weights while 1 requests are being sampled"):
        vllm_engine.update_weights(policy.named_parameters(), 7)
    assert vllm_engine.policy_version == 0 and vllm_engine.in_flight == 1
    (aborted,) = vllm_engine.abort()
    assert aborted.status == "aborted"
    assert len(vllm_engine.score([list(prompt)], [[5, 6]])[0]) == 2  # (score runs beside requests: test_vllm_inflight.py)


def test_bad_submissions_fail_and_leave_nothing_in_flight(vllm_engine, policy, prompt):
    vllm_engine.submit([Request("dup", prompt, LONG, seed=3)])
    with pytest.raises(ValueError, match=r"request 'dup' was refused: request id 'dup' is already in flight"):
        vllm_engine.submit([Request("other", prompt, LONG, seed=4), Request("dup", prompt, LONG, seed=5)])
    assert vllm_engine.in_flight == 1  # "other" was taken back, the first "dup" kept
    vllm_engine.abort()
    with pytest.raises(ValueError, match=r"request 'too-long' was refused"):  # 130 prompt tokens, max_model_len 128
        vllm_engine.submit([Request("fine", prompt, LONG, seed=3), Request("too-long", (5,) * 130, LONG, seed=3)])
    assert vllm_engine.in_flight == 0 and not vllm_engine.llm.llm_engine.has_unfinished_requests()


def test_an_error_inside_vllm_returns_every_request_in_flight_with_status_error(vllm_engine, policy, prompt, monkeypatch):
    def broken_step():
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(vllm_engine.llm.llm_engine, "step", broken_step)
    vllm_engine.submit([Request("e/0", prompt, LONG, seed=3), Request("e/1", prompt, LONG, seed=4)])
    failed = vllm_engine.poll()
    assert sorted((t.request_id, t.status) for t in failed) == [("e/0", "error"), ("e/1", "error")]
    assert all(t.error == "vLLM raised in LLMEngine.step: RuntimeError: kernel exploded" for t in failed)
    assert vllm_engine.in_flight == 0
    with pytest.raises(RuntimeError, match=r"failed on request b\d+/0: vLLM raised in LLMEngine.step: .*kernel exploded"):
        vllm_engine.generate([list(prompt)], LONG, [3])
    monkeypatch.undo()
    assert not vllm_engine.llm.llm_engine.has_unfinished_requests()  # vLLM was told to drop them
    assert len(vllm_engine.generate([list(prompt)], LONG, [3])[0].token_ids) == 40  # and samples again


def test_a_batch_of_seeded_requests_too_large_for_one_step_is_sampled_whole(vllm_engine, policy):
    # 192 seeded requests with distinct 100-token prompts: 19,200 prompt tokens, more than vLLM schedules in one step.
    # With chunked prefill (vLLM's default) the CPU sampler rewinds each seeded generator after a partial prefill and
    # raises "CPU Generator does not use offset" for every request; the engine turns it off on CPU, so each request's
    # prefill is scheduled whole and every request comes back finished.
    sampling = SamplingConfig(max_tokens=3)
    requests = [Request(f"big/{i}", tuple(5 + (i * 7 + j) % 50 for j in range(100)), sampling, seed=1000 + i)
                for i in range(192)]
    outs = generate_requests(vllm_engine, requests)
    assert len(outs) == 192 and all(o.finished and 1 <= len(o.token_ids) <= 3 for o in outs)
