"""Weights updated under running requests on the in-process vLLM engine (asynchronous training's engine side).

The session's `vllm_engine` (tests/conftest.py) and its tiny random model. With the prompt "12+34=",
temperature 1.0 and 40 tokens allowed, seeds 3, 4 and 5 reach the limit without a stop token (read off the model
once, as tests/rollout/test_vllm_requests.py does; each test asserts what it relies on). One engine step adds one
token to every running request, so a side request of k tokens, polled to its end, leaves the others with k tokens.
"""

from __future__ import annotations

import pytest
import torch

from cohort.models.pretrained import load_policy, load_tokenizer
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import FINISHED, Request, SamplingConfig, generate_requests

pytestmark = pytest.mark.vllm

LONG = SamplingConfig(40, 1.0)
TOL = 1e-4  # vLLM's float32 log-probs against the trainer's: the bound the resume tests use


def perturbed(model_dir, scale: float = 0.05):
    """The checkpoint with every parameter moved by N(0, scale^2) noise (seed 0): the "new policy"."""
    model = load_policy(model_dir, "float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return model


@pytest.fixture(scope="module")
def old_policy(tiny_model_dir):
    return load_policy(tiny_model_dir, "float32")


@pytest.fixture(scope="module")
def new_policy(tiny_model_dir):
    return perturbed(tiny_model_dir)


@pytest.fixture
def engine(vllm_engine, old_policy):
    """The shared engine holding the checkpoint's weights as version 0, left so after the test."""
    vllm_engine.update_weights(old_policy.named_parameters(), 0)
    yield vllm_engine
    vllm_engine.abort()
    vllm_engine.update_weights(old_policy.named_parameters(), 0)


@pytest.fixture
def prompt(tiny_model_dir):
    return tuple(load_tokenizer(tiny_model_dir)("12+34=", add_special_tokens=False)["input_ids"])


def _advance(engine, prompt, steps: int, seed: int = 4) -> None:
    """Run `steps` engine steps for whatever is in flight: a side request of `steps` tokens, polled to its end."""
    engine.submit([Request(f"pace/{steps}/{seed}", prompt, SamplingConfig(steps, 1.0), seed=seed)])
    (side,) = engine.poll()
    assert side.request_id == f"pace/{steps}/{seed}" and len(side.token_ids) == steps  # seed 4 does not stop early


def _drain(engine) -> dict:
    out = {}
    while engine.in_flight:
        out.update({t.request_id: t for t in engine.poll()})
    return out


def _close(a, b) -> bool:
    return torch.allclose(torch.tensor(a), b, atol=TOL)


def test_weights_loaded_under_running_requests_sample_every_later_token_from_the_new_policy(
        engine, prompt, old_policy, new_policy):
    engine.submit([Request("a", prompt, LONG, seed=3), Request("b", prompt, LONG, seed=5)])
    _advance(engine, prompt, 6)
    # vLLM 0.32 will not drop a prefix cache whose blocks running requests hold (it warns and returns False): the
    # reason update_weights preempts them (reset_running_requests=True) instead of calling it plainly
    assert engine.llm.reset_prefix_cache() is False
    engine.update_weights(new_policy.named_parameters(), 1, in_flight=True)
    assert engine.policy_version == 1 and engine.in_flight == 2
    done = _drain(engine)

    for rid in ("a", "b"):
        t = done[rid]
        n = len(t.token_ids)
        assert n > 6 and t.status in FINISHED and t.policy_version == 0
        # the 6 tokens sampled before the update carry version 0, the n - 6 after it version 1
        assert t.versions == [0] * 6 + [1] * (n - 6)
        old = sequence_logprobs(old_policy, list(prompt), t.token_ids)
        new = sequence_logprobs(new_policy, list(prompt), t.token_ids)
        assert _close(t.logprobs[:6], old[:6])
        # every later token: the new policy's log-prob given prompt + all 6 + k tokens before it, recomputed with the
        # new weights (had vLLM kept the KV cache computed under the old weights, the first of them would be off)
        assert _close(t.logprobs[6:], new[6:])
        assert (torch.tensor(t.logprobs[6:]) - old[6:]).abs().max() > 100 * TOL  # the policies really differ there


def test_a_request_submitted_after_an_in_flight_update_samples_only_from_the_new_policy(
        engine, prompt, old_policy, new_policy):
    engine.submit([Request("running", prompt, LONG, seed=3)])
    _advance(engine, prompt, 3)
    engine.update_weights(new_policy.named_parameters(), 1, in_flight=True)
    engine.submit([Request("fresh", prompt, LONG, seed=5)])
    done = _drain(engine)
    fresh = done["fresh"]
    assert fresh.versions == [1] * len(fresh.token_ids) and fresh.policy_version == 1
    assert _close(fresh.logprobs, sequence_logprobs(new_policy, list(prompt), fresh.token_ids))
    running = done["running"]
    assert running.versions == [0] * 3 + [1] * (len(running.token_ids) - 3)
    assert _close(running.logprobs[3:], sequence_logprobs(new_policy, list(prompt), running.token_ids)[3:])


def test_an_update_under_running_requests_is_refused_unless_asked_for(engine, prompt, old_policy, new_policy):
    engine.submit([Request("busy", prompt, LONG, seed=3)])
    _advance(engine, prompt, 2)
    with pytest.raises(RuntimeError, match=r"VLLMEngine.update_weights while 1 requests are being sampled: .*"
                                           r"or pass in_flight=True"):
        engine.update_weights(new_policy.named_parameters(), 1)
    assert engine.policy_version == 0 and engine.in_flight == 1
    (busy,) = _drain(engine).values()
    assert busy.versions == [0] * 40  # nothing was loaded: every token is the old policy's
    assert _close(busy.logprobs, sequence_logprobs(old_policy, list(prompt), busy.token_ids))


def test_score_runs_beside_requests_in_flight_and_takes_none_of_their_tokens(engine, prompt, old_policy, new_policy):
    engine.submit([Request("s", prompt, LONG, seed=3)])
    _advance(engine, prompt, 5)
    engine.update_weights(new_policy.named_parameters(), 1, in_flight=True)
    canary = [5, 6, 7, 8, 9, 10]
    (scored,) = engine.score([list(prompt)], [canary])
    assert _close(scored, sequence_logprobs(new_policy, list(prompt), canary))  # the canary sees the new weights
    assert engine.in_flight == 1  # still ours; the score's own request is gone
    assert not engine._scoring
    (s,) = _drain(engine).values()
    # the request lost no token to the score: every log-prob is the trainer's given all the tokens before it
    n = len(s.token_ids)
    assert s.request_id == "s" and n > 5 and s.versions == [0] * 5 + [1] * (n - 5)
    assert _close(s.logprobs[:5], sequence_logprobs(old_policy, list(prompt), s.token_ids)[:5])
    assert _close(s.logprobs[5:], sequence_logprobs(new_policy, list(prompt), s.token_ids)[5:])


def test_a_failure_inside_vllm_while_scoring_raises_from_score_and_errors_the_requests(engine, prompt, monkeypatch):
    engine.submit([Request("f", prompt, LONG, seed=3)])

    def broken_step():
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(engine.llm.llm_engine, "step", broken_step)
    with pytest.raises(RuntimeError, match=r"VLLMEngine.score: vLLM raised in LLMEngine.step: RuntimeError: kernel exploded"):
        engine.score([list(prompt)], [[5, 6]])
    monkeypatch.undo()
    (failed,) = engine.poll()
    assert (failed.request_id, failed.status) == ("f", "error")
    assert not engine._scoring and not engine.llm.llm_engine.has_unfinished_requests()
    (again,) = generate_requests(engine, [Request("g", prompt, LONG, seed=3)])  # and it samples again
    assert len(again.token_ids) == 40
