"""Partial rollouts (pipeline.over_provision): whole groups buffered FIFO, resumed from their tokens, the abort cap,
checkpointed; and the same through real vLLM, whose resumed log-probs match the trainer's.

The buffer-semantics test drives a real Trainer (tiny model, transformers parts) whose engine is `Scripted`: a
request-level engine of pure logic whose completions have lengths fixed per prompt and grow one token per poll,
so which groups finish first — and what is cut off where — is known by hand. The end-to-end tests use vLLM.
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
import torch

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.models.batching import pack_right_padded
from cohort.models.logprobs import completion_logprobs
from cohort.rollout.base import Trajectory, continuation_seed
from cohort.trainer import checkpoint
from cohort.trainer.trainer import Trainer
from cohort.plan.validate import validate_config
from tests.builders import tiny_run, write_doubling

QUIET = dict(log=lambda *a, **k: None)


@pytest.fixture
def data_file(tmp_path, monkeypatch):
    (tmp_path / "partial_rewards.py").write_text(
        "def by_slot(completions, **kwargs):\n"  # never constant within a group (no group is all-equal)
        "    return [float(i % 4) for i in range(len(completions))]\n"
        "def constant_on_row1(prompts, completions, **kwargs):\n"  # row 1's groups all-equal: dynamic sampling drops them
        "    return [1.0 if p.startswith('1+') else float(i % 4) for i, p in enumerate(prompts)]\n"
        "def digit_share(completions, **kwargs):\n"
        "    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "train.jsonl"
    write_doubling(path, 10, answers=False)
    return path


def _config(tmp_path, data_file, model_dir, *extra, name="run"):
    return load_config(None, tiny_run(
        model_dir, data_file, tmp_path / name, "engine.name=hf", "rollout.max_completion_length=40", "train.prompts_per_step=2",
        "train.micro_batch_size=8", "train.max_steps=4", "data.shuffle=false", "pipeline.over_provision=2",
        "pipeline.max_aborts=2", "rewards=[{name: 'partial_rewards:by_slot'}]", *extra))


class Scripted:
    """A request-level engine of pure logic: a request's completion has `lengths[prompt]` tokens (token 5 + its position
    mod 10, the last one the stop id), log-prob -1 each, and every poll adds one token to every request in flight.
    A resumed request continues from its tokens; abort returns what each had (status "aborted")."""

    def __init__(self, lengths: dict[tuple, int], stop_id: int):
        self.lengths, self.stop_id = lengths, stop_id
        self.live: dict[str, tuple] = {}  # id -> (request, new tokens)
        self.policy_version, self.stop_token_ids, self.submitted = 0, [stop_id], []

    def submit(self, requests):
        for r in requests:
            self.live[r.request_id] = (r, [])
            self.submitted.append(r)

    def _have(self, r, new):
        return len(r.resume.token_ids if r.resume is not None else []) + len(new)

    def poll(self, timeout=None):
        done = []
        for rid, (r, new) in list(self.live.items()):
            target = self.lengths[tuple(r.prompt_ids)]
            n = self._have(r, new)
            new.append(self.stop_id if n + 1 == target else 5 + n % 10)
            if n + 1 == target:
                done.append(r.complete(Trajectory(new, [-1.0] * len(new), "stop", self.policy_version)))
                del self.live[rid]
        return done

    def abort(self, request_ids=None):
        out = []
        for rid in list(request_ids if request_ids is not None else self.live):
            if rid in self.live:
                r, new = self.live.pop(rid)
                out.append(r.complete(Trajectory(new, [-1.0] * len(new), "aborted", self.policy_version)))
        return out

    @property
    def in_flight(self):
        return len(self.live)

    def update_weights(self, named, version):
        self.policy_version = version

    def score(self, prompts, completions, temperature=1.0):
        return [[-1.0] * len(c) for c in completions]

    def close(self):
        pass


def test_buffer_keeps_whole_groups_fifo_resumes_from_tokens_and_caps_aborts(tmp_path, data_file, tiny_model_dir):
    trainer = Trainer(_config(tmp_path, data_file, tiny_model_dir), **QUIET)
    ids = trainer.parts.train_ids  # rows in file order (data.shuffle=false): the sampler takes rows 0, 1, 2, ...
    # Completion lengths per row: rows 0 and 2 short, rows 1 and 3 long (the tail), then short again.
    lengths = {0: 3, 1: 12, 2: 4, 3: 14, 4: 5, 5: 6, 6: 2, 7: 3, 8: 2, 9: 2}
    engine = Scripted({tuple(ids[row]): n for row, n in lengths.items()}, stop_id=trainer.parts.engine.stop_token_ids[0])
    trainer.swap_engine(engine)
    try:
        # Step 1: B = 2, over_provision 2 → 4 groups (rows 0, 1 from the batch, 2, 3 extra). After 4 polls rows 0
        # and 2 are done (3 and 4 tokens): the batch. Rows 1 and 3 are cut off holding 4 tokens each (one per poll).
        m1 = trainer.step()
        assert trainer.state.batch.row_indices == [0] * 4 + [2] * 4
        assert m1["partial/aborted"] == 8 and m1["partial/buffered_groups"] == 2 and m1["partial/ratio"] == 0
        buffered = list(trainer.scheduler.buffer.groups)
        assert [g.rows[0] for g in buffered] == [1, 3] and all(g.aborts == [1] * 4 for g in buffered)
        assert all(m.status == "aborted" and m.token_ids == [5, 6, 7, 8] for g in buffered for m in g.members)
        assert all(m.versions == [0] * 4 for g in buffered for m in g.members)
        # Step 2: the buffer first (rows 1, 3 resumed from their 4 tokens with new seeds), then the batch's rows 4, 5;
        # ceil(2 × 2) = 4 in flight, so no extra. Rows 4 and 5 finish after 5 and 6 polls: rows 1, 3 are cut again
        # with 4 + 6 = 10 tokens (abort 2 = max_aborts: pinned from now on).
        engine.submitted.clear()
        m2 = trainer.step()
        resumed = [r for r in engine.submitted if r.resume is not None]
        assert len(resumed) == 8 and all(r.resume.token_ids == [5, 6, 7, 8] for r in resumed)
        seeds = {r.request_id.rsplit("/", 1)[1]: r.seed for r in resumed[:4]}
        assert seeds["0"] == continuation_seed(buffered[0].seeds[0], 1) != buffered[0].seeds[0]
        assert trainer.state.batch.row_indices == [4] * 4 + [5] * 4
        assert m2["partial/resumed"] == 8 and m2["partial/aborted"] == 8 and m2["partial/pinned"] == 0
        assert [g.aborts for g in trainer.scheduler.buffer.groups] == [[2] * 4, [2] * 4]
        assert all(len(m.token_ids) == 10 and m.versions == [0] * 4 + [1] * 6 for g in trainer.scheduler.buffer.groups for m in g.members)
        # Step 3: rows 1, 3 pinned (first in line), rows 6, 7 new. Rows 6, 7 finish first (2, 3 tokens) but the step
        # waits for the pinned groups (2 and 4 more tokens) and they are the batch; 6 and 7 are buffered complete.
        m3 = trainer.step()
        assert trainer.state.batch.row_indices == [1] * 4 + [3] * 4
        assert m3["partial/pinned"] == 2 and m3["partial/aborted"] == 0 and m3["partial/ratio"] == 1.0
        assert [len(c) for c in trainer.state.batch.completion_ids] == [12] * 4 + [14] * 4
        # tokens 0-3 sampled at version 0, 4-9 at version 1, the rest at 2 = the trainer's version now
        assert trainer.state.batch.versions[0] == [0] * 4 + [1] * 6 + [2] * 2 and trainer.state.batch.taken_version == 2
        # staleness over the 8 × (12 or 14) trained tokens: rows 1: 4×2 + 6×1 per member; row 3: same + 4 fresh
        assert m3["staleness/max"] == 2 and m3["staleness/mean"] == pytest.approx(4 * (8 + 6) * 2 / (4 * 26))
        assert m3["staleness/off_policy_frac"] == pytest.approx(4 * 10 * 2 / (4 * 26))
        assert [g.rows[0] for g in trainer.scheduler.buffer.groups] == [6, 7]
        assert all(m.finished for g in trainer.scheduler.buffer.groups for m in g.members)
        # Step 4: the complete rows 6, 7 are taken at once; the new rows 8, 9 are cut before sampling anything, so
        # they are buffered with no tokens and no abort counted.
        m4 = trainer.step()
        assert trainer.state.batch.row_indices == [6] * 4 + [7] * 4
        assert m4["partial/aborted"] == 0 and [g.aborts for g in trainer.scheduler.buffer.groups] == [[0] * 4] * 2
    finally:
        trainer.close()


def test_the_buffer_survives_a_checkpoint_and_resume_loses_and_repeats_no_prompt(tmp_path, data_file, tiny_model_dir):
    lengths = {0: 3, 1: 12, 2: 4, 3: 14, 4: 5, 5: 6, 6: 2, 7: 3, 8: 2, 9: 2}

    def run(name, steps, resume=None):
        trainer = Trainer(_config(tmp_path, data_file, tiny_model_dir, name=name), **QUIET)
        trainer.swap_engine(Scripted({tuple(trainer.parts.train_ids[r]): n for r, n in lengths.items()}, trainer.parts.engine.stop_token_ids[0]))
        rows = []
        try:
            if resume is not None:
                checkpoint.load_checkpoint(trainer.checkpointed(), resume)
            for _ in range(steps):
                trainer.step()
                rows.append(trainer.state.batch.row_indices[::4])
            checkpoint.save_checkpoint(trainer.checkpointed())
            return rows, trainer.parts.run_dir
        finally:
            trainer.close()

    whole, _ = run("whole", 4)
    first, run_dir = run("first", 1)  # stops with rows 1 and 3 in the buffer, cut off
    second, _ = run("second", 3, resume=checkpoint.latest_checkpoint(run_dir))
    assert first + second == whole == [[0, 2], [4, 5], [1, 3], [6, 7]]


def test_over_provision_is_validated_before_any_model_loads(tmp_path, data_file, tiny_model_dir):
    for bad, field in (("pipeline.over_provision=0.5", "pipeline.over_provision = 0.5"),
                       ("pipeline.max_aborts=-1", "pipeline.max_aborts = -1")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("+", r"\+")):
            validate_config(_config(tmp_path, data_file, tiny_model_dir, bad, "engine.name=vllm"))


@pytest.mark.parametrize("objective", ["decoupled", "coupled", "mask_stale"])
def test_off_policy_objectives_by_hand(tmp_path, data_file, tiny_model_dir, objective):
    # One member resumed: tokens 0-1 sampled at version 0, 2-3 at version 1; the trainer holds version 1 (taken_version).
    # Engine log-probs = the trainer's - [log 3, log 1.5, 0, 0]. decoupled: prox = the trainer's, weights
    # exp(prox - engine) truncated at 2 = [2, 1.5, 1, 1]; coupled: the denominator is the engine's, no weights;
    # mask_stale: the two old tokens leave the mask.
    trainer = Trainer(_config(tmp_path, data_file, tiny_model_dir, f"algorithm.off_policy_objective={objective}"), **QUIET)
    try:
        from cohort.trainer.rollout_batch import RolloutBatch
        import numpy as np
        logp = torch.tensor([[-1.0, -2.0, -0.5, -0.25]])
        engine = (logp[0] - torch.tensor([math.log(3.0), math.log(1.5), 0.0, 0.0])).tolist()
        batch = RolloutBatch([0], [[1, 2]], [[5, 6, 7, 8]], [engine], [False], ["x"], np.zeros(1), np.zeros((1, 0)),
                             torch.zeros(1, 4), versions=[[0, 0, 1, 1]], taken_version=1, policy_version=0)
        trainer.state.policy_version = 1
        mbi = trainer.pack(batch, [0])
        mask = mbi.mask
        sums = __import__("collections").defaultdict(float)
        old, weights = trainer._off_policy(batch, [0], mbi, logp, logp.detach(), sums)
        if objective == "decoupled":
            assert torch.allclose(weights, torch.tensor([[2.0, 1.5, 1.0, 1.0]]), atol=1e-6) and torch.equal(old, logp)
            # Kish ESS over 4 tokens: (5.5)^2 / (4 + 2.25 + 1 + 1) / 4 = 30.25 / 8.25 / 4
            assert trainer._update_metrics({**sums, "loss": 0.0, "entropy": 0.0, "tokens": 4.0, "padding": 0.0, "cells": 1.0},
                                           0.0)["correction/ess"] == pytest.approx(30.25 / 8.25 / 4)
        elif objective == "coupled":
            assert weights is None and torch.allclose(old, torch.tensor([engine]), atol=1e-6)
        else:
            assert weights is None and torch.equal(mask, torch.tensor([[0.0, 0.0, 1.0, 1.0]]))
        assert sums["off_policy_tokens"] == (2.0 if objective != "mask_stale" else 0.0)
        assert sums["staleness_max"] == (1.0 if objective != "mask_stale" else 0.0)  # over the tokens trained
    finally:
        trainer.close()


@pytest.mark.slow
def test_vllm_partial_rollouts_resume_with_log_probs_of_the_policy_that_sampled_each_token(tmp_path, data_file, tiny_model_dir):
    # Real vLLM in-process. G = 2, B = 2, over_provision 3: 6 groups per step for 2; the random model stops at a
    # random length (its EOS is one of 64 tokens), so some groups finish early and the others are cut off. Every
    # trained token's engine log-prob must equal the log-prob under the weights of the version stamped on it
    # (a copy of the policy kept per version), resumed prefixes included.
    pytest.importorskip("vllm")
    import copy

    cfg = _config(tmp_path, data_file, tiny_model_dir, "engine.name=vllm", "rollout.num_generations=2",
                  "pipeline.over_provision=3", "rollout.max_completion_length=48", "engine.kv_cache_gib=0.25",
                  "train.learning_rate=3e-3", "train.max_steps=4", "rewards=[{name: 'partial_rewards:digit_share'}]")
    trainer = Trainer(cfg, **QUIET)
    copies, resumed_tokens, aborted = {}, 0, 0
    try:
        for _ in range(4):
            copies[trainer.state.policy_version] = copy.deepcopy(trainer.parts.policy).eval()
            m = trainer.step()
            aborted += m["partial/aborted"]
            batch = trainer.state.batch
            for i, (prompt, ids) in enumerate(zip(batch.prompt_ids, batch.completion_ids)):
                versions = batch.versions[i]
                for v in set(versions):
                    packed = pack_right_padded([prompt], [ids], trainer.parts.pad_id)
                    with torch.no_grad():
                        want, _ = completion_logprobs(copies[v], packed.input_ids, packed.attention_mask, packed.prompt_lengths,
                                                      packed.completion_ids, packed.completion_mask, temperature=1.0)
                    at = torch.tensor([x == v for x in versions])
                    got = torch.tensor(batch.engine_logp[i])[at]
                    assert torch.allclose(got, want[0, : len(ids)][at].float(), atol=2e-4), (i, v)
                    resumed_tokens += int(at.sum()) if v < batch.taken_version else 0
    finally:
        trainer.close()
    assert aborted > 0 and resumed_tokens > 0  # the run really cut off and resumed requests


def test_with_dynamic_sampling_the_batch_is_the_first_b_groups_kept(tmp_path, data_file, tiny_model_dir):
    # Rows 0-3 (lengths 3, 2, 4, 14): row 1 finishes first but its rewards are all equal, so it is dropped; rows 0 and
    # 2 are kept and are the batch; row 3 is cut off and buffered. No refill: 3 groups could still fill the batch of 2.
    trainer = Trainer(_config(tmp_path, data_file, tiny_model_dir, "pipeline.dynamic_sampling=true",
                              "rewards=[{name: 'partial_rewards:constant_on_row1'}]"), **QUIET)
    lengths = {0: 3, 1: 2, 2: 4, 3: 14, 4: 5, 5: 6, 6: 2, 7: 3, 8: 2, 9: 2}
    trainer.swap_engine(Scripted({tuple(trainer.parts.train_ids[r]): n for r, n in lengths.items()}, trainer.parts.engine.stop_token_ids[0]))
    try:
        m = trainer.step()
        assert trainer.state.batch.row_indices == [0] * 4 + [2] * 4
        assert m["dynamic_sampling/groups_dropped"] == 1 and m["dynamic_sampling/groups_generated"] == 3
        assert [g.rows[0] for g in trainer.scheduler.buffer.groups] == [3] and m["partial/aborted"] == 4
    finally:
        trainer.close()


def test_a_buffered_multi_turn_member_round_trips_through_a_checkpoint_without_its_environment(tmp_path):
    # The tool loop's record (conversation, counts, token segments) survives torch.save / torch.load(weights_only=True);
    # the environment instance does not travel (a resumed trajectory gets a fresh one).
    from collections import Counter

    from cohort.tools.episode import Episode
    from cohort.rollout.partial import BufferedGroup

    episode = Episode(conversation=[{"role": "assistant", "content": "<<mul(2, 3)>>"}, {"role": "tool", "content": "6"}],
                      environment=object(), turns=1, calls=Counter({"mul": 1}), segments=[(0, 5, "assistant"), (5, 7, "tool")])
    member = Trajectory([5, 6, 7, 8, 9, 1, 2], [-1.0] * 5 + [0.0, 0.0], "aborted", 0, loss_mask=[1] * 5 + [0, 0],
                        episode=episode)
    group = BufferedGroup([3, 3], [11, 12], [member, None], [1, 0])
    torch.save(group.to_state(), tmp_path / "state.pt")
    back = BufferedGroup.from_state(torch.load(tmp_path / "state.pt", weights_only=True))
    got = back.members[0]
    assert got.token_ids == member.token_ids and got.loss_mask == member.loss_mask and back.members[1] is None
    assert got.episode.conversation == episode.conversation and got.episode.calls == Counter({"mul": 1})
    assert got.episode.segments == [(0, 5, "assistant"), (5, 7, "tool")] and got.episode.environment is None


def test_a_cut_off_agent_run_starts_over_and_a_cut_off_tool_episode_resumes():
    # One interrupted group of 4: a tool-loop member cut after 3 tokens (resumable: kept to continue), an agent run cut
    # after its first call's 2 tokens (AgentRun.resumable is False: buffered as None, to start over from its prompt),
    # a finished agent run (kept as it is) and an agent run cut before any call returned tokens (None, as any member
    # that sampled nothing). The cuts that sampled something count: aborts [1, 1, 0, 0], partial/aborted 2. Next step
    # every unfinished member (continued or restarted) draws continuation_seed(its seed, its aborts); the finished one
    # keeps its seed and is not run again.
    from cohort.agents.runs import AgentRun
    from cohort.rollout.partial import BufferedGroup, ContinuationBuffer
    from cohort.tools.episode import Episode

    tool = Trajectory([5, 6, 7], [-1.0] * 3, "aborted", 0, episode=Episode(turns=1))
    cut_agent = Trajectory([8, 9], [-1.0] * 2, "aborted", 0, episode=AgentRun(status="aborted", turns=1))
    done_agent = Trajectory([4, 2], [-1.0] * 2, "stop", 0, episode=AgentRun(outcome={"reward": 1.0}, turns=1))
    empty_agent = Trajectory([], [], "aborted", 0, episode=AgentRun(status="aborted"))
    buffer = ContinuationBuffer(max_aborts=2)
    buffer.record(0, BufferedGroup([7] * 4, [11, 12, 13, 14], [None] * 4, [0] * 4))
    buffer.put_interrupted([(0, [7] * 4, [tool, cut_agent, done_agent, empty_agent])])
    (group,) = buffer.groups
    assert group.members == [tool, None, done_agent, None] and group.aborts == [1, 1, 0, 0]
    assert buffer.counts.aborted == 2
    _, seeds, _, partial = group.submission([[1, 2]] * 4)
    assert seeds == [continuation_seed(11, 1), continuation_seed(12, 1), 13, continuation_seed(14, 0)]
    assert partial == [tool, None, done_agent, None]


def test_tail_seconds_count_the_polls_while_fewer_than_half_the_batch_decode(tmp_path, data_file, tiny_model_dir, monkeypatch):
    # Synchronous, B = 3 groups of G = 4: half the batch is 6 completions. Rows 0, 1, 2 take 3, 12 and 4 tokens, one
    # per poll: polls 1-3 run with 12 requests decoding (row 0 done at poll 3), poll 4 with 8 (row 2 done), polls 5-12
    # with row 1's 4 < 6: 8 tail polls. The scheduler's clock advances 1 s per reading, so each poll lasts exactly 1 s.
    trainer = Trainer(_config(tmp_path, data_file, tiny_model_dir, "pipeline.over_provision=1", "train.prompts_per_step=3",
                              "train.micro_batch_size=12"), **QUIET)
    ids = trainer.parts.train_ids
    trainer.swap_engine(Scripted({tuple(ids[row]): n for row, n in {0: 3, 1: 12, 2: 4}.items()},
                                 stop_id=trainer.parts.engine.stop_token_ids[0]))
    clock = iter(float(s) for s in range(10**6))
    monkeypatch.setattr("cohort.rollout.scheduler.time", SimpleNamespace(perf_counter=lambda: next(clock), monotonic=time.monotonic))
    try:
        assert trainer.step()["rollout/tail_s"] == 8.0
    finally:
        trainer.close()
