"""The transformers engine's request level: streamed by continuous batching, aborted with tokens, resumed exactly.

Model: the random tiny Qwen2 (float32). Unless a test needs stops, the engine's stop set is [NEVER], an id
outside the 259-token vocabulary, so every request runs to exactly its max_tokens and the expected lengths below
are hand-checkable. Log-probs are checked against the trainer's (`sequence_logprobs`, temperature applied) at
atol 1e-5 (measured: at most ~1e-5 at T=0.7, from the paged attention kernel's summation order).
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from cohort.models.pretrained import load_policy
from cohort.models.logprobs import sequence_logprobs
from cohort.rollout.base import Request, SamplingConfig, Trajectory, generate_requests
from cohort.rollout.engines import hf_continuous
from cohort.rollout.engines.hf_continuous import ContinuousRequests, _LoopGate, enter_pause, missing_api
from cohort.rollout.engines.hf import HFEngine

# 5.17 (the GPU lane's) and 5.19 both stream (hf_continuous's adapter); a transformers the adapter cannot drive skips
pytestmark = pytest.mark.skipif(missing_api() is not None, reason=f"transformers lacks {missing_api()}")

EOS = 256
NEVER = 300  # not a token of the 259-token vocabulary: nothing stops before max_tokens
P1, P2, P3 = (49, 50, 43, 51, 61), (55, 45, 51, 61), (57, 61)  # "12+3=", "7-3=", "9="


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return load_policy(tiny_model_dir, "float32")


@pytest.fixture
def engine(policy):
    e = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[NEVER])
    yield e
    e.close()


def sampling(max_tokens: int, temperature: float = 0.7, **kw) -> SamplingConfig:
    return SamplingConfig(max_tokens=max_tokens, temperature=temperature, **kw)


def assert_trainer_logprobs(policy, prompt, t: Trajectory, temperature: float, start: int = 0):
    """t.logprobs[start:] equal the trainer's log-probs of those tokens after prompt + t.token_ids[:start]."""
    ref = sequence_logprobs(policy, list(prompt) + t.token_ids[:start], t.token_ids[start:], pad_id=EOS,
                            temperature=temperature)
    assert torch.allclose(torch.tensor(t.logprobs[start:]), ref, atol=1e-5), (t.logprobs[start:], ref.tolist())


def test_continuous_batching_is_on_for_float32_and_off_under_autocast(policy):
    assert HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS]).continuous is not None
    mixed = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS],
                     compute_context=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert mixed.continuous is None  # the generation thread would not run under the trainer's (thread-local) autocast
    assert HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS], continuous_batching=False).continuous is None


@pytest.mark.parametrize("gate", [False, True], ids=["own-pause", "loop-gate"])
def test_greedy_tokens_are_plain_generates_on_this_transformers(policy, monkeypatch, gate):
    # The same model, greedy, stop at EOS: continuous batching's tokens are plain `generate`'s, each prompt alone (no
    # left padding) and all in one call, and its log-probs (temperature 1) the trainer's. `loop-gate`: the pause of
    # transformers 5.17 (no ContinuousBatchingManager.pause()), cohort's gate around the loop, also on 5.19.
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

    if gate and hasattr(ContinuousBatchingManager, "pause"):
        monkeypatch.delattr(ContinuousBatchingManager, "pause")
    prompts = [list(P1), list(P2), list(P3), list(P1)]
    greedy = SamplingConfig(max_tokens=24, temperature=0.0)
    streamed = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS])
    plain = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[EOS], continuous_batching=False)
    try:
        got = streamed.generate(prompts, greedy, seeds=[0] * 4)
        assert streamed.continuous is not None and streamed.continuous._managers  # it ran, not the fallback
        assert bool(streamed.continuous._gates) == (gate or not hasattr(ContinuousBatchingManager, "pause"))
        alone = [plain.generate([p], greedy, seeds=[0])[0] for p in prompts]
        assert [t.token_ids for t in got] == [t.token_ids for t in alone]
        assert [t.status for t in got] == [t.status for t in alone]
        for p, t in zip(prompts, got):
            assert_trainer_logprobs(policy, p, t, 1.0)
    finally:
        streamed.close()


def test_a_short_request_comes_back_alone_while_a_long_one_goes_on(engine, policy):
    # Both start in the first forward pass (5 + 4 prompt tokens < max_batch_tokens); the short one is done after 2
    # decode steps, the long one needs 40: the first poll returns the short one only, the second the long one.
    engine.submit([Request("short", P1, sampling(2), seed=1), Request("long", P2, sampling(40), seed=1)])
    first = engine.poll()
    assert [t.request_id for t in first] == ["short"] and len(first[0].token_ids) == 2 and first[0].status == "length"
    assert engine.in_flight == 1
    second = engine.poll()
    assert [t.request_id for t in second] == ["long"] and len(second[0].token_ids) == 40
    assert engine.in_flight == 0 and engine.poll() == []
    assert_trainer_logprobs(policy, P1, first[0], 0.7)
    assert_trainer_logprobs(policy, P2, second[0], 0.7)


def test_plain_generate_fallback_returns_the_whole_batch_in_one_poll(policy):
    engine = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[NEVER], continuous_batching=False)
    engine.submit([Request("short", P1, sampling(2), seed=1), Request("long", P2, sampling(40), seed=1)])
    assert sorted((t.request_id, len(t.token_ids)) for t in engine.poll()) == [("long", 40), ("short", 2)]


def test_abort_returns_tokens_so_far_and_resume_completes_with_the_trainer_logprobs(engine, policy):
    # "pace" (3 tokens) ends the first poll; the two long requests decoded in the same steps, so each holds
    # k >= 3 tokens (fewer than 50) when aborted.
    engine.submit([Request("pace", P3, sampling(3), seed=7), Request("a", P1, sampling(50), seed=7),
                   Request("b", P2, sampling(50), seed=7)])
    assert [t.request_id for t in engine.poll()] == ["pace"]
    aborted = {t.request_id: t for t in engine.abort()}
    assert set(aborted) == {"a", "b"} and engine.in_flight == 0
    for rid, prompt in (("a", P1), ("b", P2)):
        t = aborted[rid]
        assert t.status == "aborted" and 3 <= len(t.token_ids) < 50 and t.versions == [0] * len(t.token_ids)
        assert_trainer_logprobs(policy, prompt, t, 0.7)
    engine.update_weights([], version=1)
    requests = [Request("a", P1, sampling(50), seed=8, resume=aborted["a"]),
                Request("b", P2, sampling(50), seed=8, resume=aborted["b"])]
    done = {t.request_id: t for t in generate_requests(engine, requests)}
    for rid, prompt in (("a", P1), ("b", P2)):
        t, k = done[rid], len(aborted[rid].token_ids)
        assert t.status == "length" and len(t.token_ids) == 50  # old k tokens + 50 - k new: max_tokens in all
        assert t.token_ids[:k] == aborted[rid].token_ids and t.logprobs[:k] == aborted[rid].logprobs
        assert t.versions == [0] * k + [1] * (50 - k)
        assert_trainer_logprobs(policy, prompt, t, 0.7)  # all 50: the resumed tokens conditioned exactly as sampled


def test_a_request_resubmitted_under_its_aborted_id_is_not_cancelled_again(engine):
    # transformers applies a cancellation at its next step; the engine's internal ids differ per submission, so
    # the resubmitted "x" runs to its end instead of being dropped by the late cancel of the first "x".
    engine.submit([Request("x", P1, sampling(20), seed=1)])
    (partial,) = engine.abort(["x"])
    assert partial.status == "aborted" and partial.token_ids == []  # aborted before any poll: nothing sampled
    engine.submit([Request("x", P1, sampling(20), seed=1, resume=partial)])
    (t,) = engine.poll()
    assert t.request_id == "x" and len(t.token_ids) == 20 and t.status == "length"


def test_abort_returns_a_finished_unpolled_request_finished_and_ignores_unknown_ids(engine):
    # A resume with nothing left to sample is finished at submit; aborting it before a poll returns it as it is.
    old = Trajectory([60, 61], [-1.0, -2.0], "aborted")
    engine.submit([Request("full", P1, sampling(2), resume=old), Request("slow", P2, sampling(30), seed=1)])
    back = {t.request_id: t for t in engine.abort(["full", "slow", "unknown"])}
    assert back["full"].status == "length" and back["full"].token_ids == [60, 61]
    assert back["slow"].status == "aborted" and back["slow"].token_ids == []  # no poll yet: nothing sampled
    assert engine.in_flight == 0 and engine.poll() == []


@pytest.mark.parametrize("continuous", [True, False])
def test_resume_with_nothing_left_returns_the_old_tokens_as_length(policy, continuous):
    engine = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[NEVER], continuous_batching=continuous)
    old = Trajectory([60, 61, 62], [-1.0, -2.0, -3.0], "aborted")
    engine.submit([Request("full", P1, sampling(3), resume=old)])
    (t,) = engine.poll()
    assert (t.token_ids, t.logprobs, t.status, t.request_id) == ([60, 61, 62], [-1.0, -2.0, -3.0], "length", "full")
    engine.close()


@pytest.mark.parametrize("continuous", [True, False])
def test_resumed_requests_with_different_remaining_lengths_in_one_poll(policy, continuous):
    # Three resumes of max_tokens 12 holding 0, 4 and 9 tokens: 12, 8 and 3 left. The fallback groups them by
    # remaining sampling parameters (three generate calls); continuous batching runs them together.
    engine = HFEngine(policy, pad_token_id=EOS, stop_token_ids=[NEVER], continuous_batching=continuous)
    parts = engine.generate([list(P1), list(P2), list(P3)], sampling(9), seeds=[2, 2, 2])
    olds = [Trajectory([], [], "aborted"), Trajectory(parts[1].token_ids[:4], parts[1].logprobs[:4], "aborted"),
            Trajectory(parts[2].token_ids, parts[2].logprobs, "aborted")]
    requests = [Request(f"r{i}", p, sampling(12), seed=3, resume=o) for i, (p, o) in enumerate(zip((P1, P2, P3), olds))]
    done = generate_requests(engine, requests)
    for req, t in zip(requests, done):
        k = len(req.resume.token_ids)
        assert len(t.token_ids) == 12 and t.token_ids[:k] == req.resume.token_ids and t.status == "length"
        assert_trainer_logprobs(policy, req.prompt_ids, t, 0.7)
    engine.close()


def test_a_drain_is_reproducible_from_its_seeds_and_building_a_manager_keeps_the_trainer_rng_and_mode(engine):
    torch.manual_seed(5)
    engine.model.train()
    engine.continuous.start(0.7)  # builds the manager (transformers seeds torch and calls model.eval() there) and probes
    after_build = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after_build, torch.rand(3))
    assert engine.model.training  # else the trainer's dropout (LoRA's) would silently stay off after the first rollout
    engine.model.eval()
    prompts = [list(P1), list(P2), list(P3)] * 2
    runs = [[t.token_ids for t in engine.generate(prompts, sampling(16), seeds=[s] * 6)] for s in (11, 11, 12)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_top_k_requests_take_the_plain_path_and_keep_unfiltered_logprobs(engine, policy):
    # transformers' continuous batching would report log(softmax) of the top-k-filtered logits (each >= the
    # unfiltered one); the plain path reports the trainer's unfiltered log-probs.
    (t,) = engine.generate([list(P1)], sampling(10, top_k=5), seeds=[4])
    assert engine.continuous.in_flight == 0
    assert_trainer_logprobs(policy, P1, t, 0.7)


def test_weights_changed_between_polls_are_the_ones_the_next_tokens_see(tiny_model_dir):
    # The loop is parked between polls and reads the live module: tokens sampled after an in-place update score
    # like the updated trainer's, to 1e-5.
    model = load_policy(tiny_model_dir, "float32")
    engine = HFEngine(model, pad_token_id=EOS, stop_token_ids=[NEVER])
    engine.submit([Request("pace", P3, sampling(2), seed=1), Request("a", P1, sampling(30), seed=1)])
    engine.poll()
    (partial,) = engine.abort(["a"])
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(-1.5)
    (t,) = generate_requests(engine, [Request("a", P1, sampling(30), seed=2, resume=partial)])
    assert_trainer_logprobs(model, P1, t, 0.7, start=len(partial.token_ids))
    engine.close()


def test_an_eager_attention_model_streams_and_the_trainer_keeps_eager_between_polls(tiny_model_dir):
    # transformers switches "eager" to "paged|eager" for its manager; the engine hands "eager" back after each poll,
    # so the trainer's forward passes never run the paged variant outside generation.
    model = load_policy(tiny_model_dir, "float32")
    model.set_attn_implementation("eager")
    engine = HFEngine(model, pad_token_id=EOS, stop_token_ids=[NEVER])
    (t,) = engine.generate([list(P1)], sampling(12), seeds=[1])
    assert model.config._attn_implementation == "eager" and len(t.token_ids) == 12
    assert_trainer_logprobs(model, P1, t, 0.7)
    engine.close()


def test_a_model_continuous_batching_refuses_falls_back_to_generate_with_a_warning(tiny_model_dir, monkeypatch):
    # Stands in for an architecture transformers' manager rejects (ValueError from `switch_to_cb_friendly_attn` for
    # an attention implementation it cannot page): the engine says so once and samples with plain generate.
    model = load_policy(tiny_model_dir, "float32")

    def refuse(**kwargs):
        raise ValueError("Implementation flex_attention is not supported for continuous batching")

    monkeypatch.setattr(model, "init_continuous_batching", refuse)
    engine = HFEngine(model, pad_token_id=EOS, stop_token_ids=[NEVER])
    with pytest.warns(UserWarning, match="flex_attention is not supported.*falls back to plain generate"):
        (t,) = engine.generate([list(P1)], sampling(8), seeds=[1])
    assert engine.continuous is None and len(t.token_ids) == 8
    assert_trainer_logprobs(model, P1, t, 0.7)


# ------------------------------------------------------------------ a generation thread that never pauses (issue 60, 6)

class HungLoop:
    """A manager whose generation loop is stuck inside a step: its `pause()` never returns (transformers' waits on its
    condition with no timeout for a loop that parks, or is marked stopped, and this one does neither)."""

    def __init__(self):
        self.released = threading.Event()

    @contextlib.contextmanager
    def pause(self):
        self.released.wait()
        yield


def test_holding_a_hung_generation_loop_fails_with_the_fix_instead_of_hanging(monkeypatch):
    # at 74eaa87 `_hold` entered transformers' pause() directly: this call never returned, and the run hung
    monkeypatch.setattr(hf_continuous, "HOLD_TIMEOUT_S", 0.2)
    requests, loop = ContinuousRequests(None, stop_token_ids=[NEVER], pad_token_id=EOS), HungLoop()
    requests._managers[0.7] = loop
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"generation thread did not pause within 0.2 s \(it is hung or dead\).*"
                                           r"engine.name=vllm"):
        requests._hold(0.7)
    assert time.monotonic() - start < 2 and requests._pauses == {}
    loop.released.set()  # (the helper thread waiting in pause() finishes)


def test_a_loop_gate_over_a_loop_that_never_steps_is_bounded_and_a_stopped_loop_s_error_is_raised():
    # 5.17's gate (`_LoopGate`): its pause waits while the manager runs and the loop has not parked
    class Running:
        running = True

        def _generation_loop_body(self):
            pass

        def is_running(self):
            return self.running

    manager = Running()
    with pytest.raises(RuntimeError, match="did not pause within 0.1 s"):
        enter_pause(_LoopGate(manager).pause(), 0.1)
    manager.running = False  # (the helper thread's wait ends)

    @contextlib.contextmanager
    def stopped():  # transformers' own pause() when the loop died and was marked so
        raise RuntimeError("The generation loop stopped before it could pause.")
        yield

    with pytest.raises(RuntimeError, match="stopped before it could pause"):
        enter_pause(stopped(), 5.0)
