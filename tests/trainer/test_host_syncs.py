"""The log-prob kernel queues its work without waiting for the device (issue 38, item 7).

On a GPU, an op whose result size or value the host must know (`.item()`, `.tolist()`, `nonzero`, a boolean-mask
index, `bool(t)`) waits for everything queued before it. Right after the decoder body's forward that is the whole
forward: the host cannot queue the LM head until the body has run, once per micro-batch. A `TorchFunctionMode`
records every such call while the kernel's forward and backward run (on the CPU, where nothing waits; the calls are
what a CUDA device would wait on); there must be none in cohort's code. (transformers' own mask builder reads the
padding mask once, `fast_all` in masking_utils.py, before the body's forward is queued: not counted here.)
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from cohort.models.batching import pack_right_padded
from cohort.models.pretrained import load_policy
from cohort.models.logprobs import completion_logprobs

COHORT = str(Path(__file__).resolve().parents[2] / "cohort")

HOST_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.__bool__,
              torch.masked_select, torch.Tensor.masked_select}


class HostSyncs(TorchFunctionMode):
    """Records the calls that make the host wait for a device: the reads above and boolean-mask indexing."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame.f_code.co_name == "__torch_function__":  # a subclass's own frames: the caller is above them
            frame = frame.f_back
        if frame.f_code.co_filename.startswith(COHORT):  # cohort's own calls only
            self.record(func, args, f"{frame.f_code.co_filename[len(COHORT) + 1:]}:{frame.f_lineno}")
        return func(*args, **(kwargs or {}))

    def record(self, func, args, where: str) -> None:
        if func in HOST_READS:
            self.calls.append(f"{getattr(func, '__name__', func)} {where}")
        elif func is torch.Tensor.__getitem__ and _has_bool_index(args[1]):
            self.calls.append(f"boolean-mask index {where}")


def _has_bool_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(torch.is_tensor(p) and p.dtype == torch.bool for p in parts)


def test_the_log_prob_kernel_never_waits_for_the_device(tiny_model_dir):
    policy = load_policy(tiny_model_dir, "float32")
    b = pack_right_padded([[49, 50, 43, 51, 61], [55, 45, 51, 61], [57, 61]], [[52, 256], [51, 52, 53, 256], [48]], 256)
    mask = b.completion_mask.clone()
    mask[1, 1] = 0  # a token out of the loss (a tool's output, say) inside a completion
    with HostSyncs() as syncs:
        logp, entropy = completion_logprobs(policy, b.input_ids, b.attention_mask, b.prompt_lengths, b.completion_ids,
                                            mask, chunk_size=2, entropy_grad=True)
        (logp.sum() + entropy.sum()).backward()
    assert syncs.calls == []  # before: 3 boolean-mask indexes and a nonzero per call
    assert logp[1, 1] == 0 and entropy[1, 1] == 0 and logp[2, 1] == 0  # out of the mask: 0, as before
    assert (logp[mask.bool()] < 0).all()  # (outside the recorded region: the test's own reads)


class HostTraffic(HostSyncs):
    """HostSyncs, plus every tensor cohort's code makes from Python data (`torch.tensor`, `torch.as_tensor`): on a GPU
    each is a host-to-device copy, which waits for the device's queue when made on it (a blocking copy)."""

    def record(self, func, args, where: str) -> None:
        if func in (torch.tensor, torch.as_tensor):
            self.calls.append(f"{func.__name__} {where}")
        super().record(func, args, where)


def test_the_update_loop_copies_nothing_to_the_device_and_reads_nothing_back(tmp_path, tiny_model_dir):
    # Every host-made tensor a micro-batch needs (the engine's log-probs, each token's staleness and off-policy flag,
    # the loss mask) is made when the micro-batches are packed, before the first forward; the loop over them queues
    # forward, loss and backward without a copy or a read. The batch exercises every branch that used to make one:
    # 4 completions, 2 micro-batches of 2; completion 0 has 2 tokens sampled at version 2 (taken at 3: off-policy, so
    # the rollout correction runs on the engine's log-probs), the rest at 3; engine log-probs on every token
    # (mismatch metrics); staleness metrics (versions present).
    import numpy as np

    from cohort.algorithms.aggregation import aggregation_count
    from cohort.config.resolve import load_config
    from cohort.trainer.rollout_batch import RolloutBatch
    from cohort.trainer.trainer import Trainer
    from tests.builders import tiny_run, write_doubling

    data = write_doubling(tmp_path / "train.jsonl", 8)
    cfg = load_config(None, tiny_run(tiny_model_dir, data, tmp_path / "run", "engine.name=hf", "train.prompts_per_step=1",
                                     "train.micro_batch_size=2", "rollout.max_completion_length=8",
                                     "rewards=[{name: exact_match}]"))
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    try:
        trainer.state.policy_version = 3
        completions = [[5, 6, 7, 8], [5, 6, 7], [9, 10], [11, 12, 13]]
        batch = RolloutBatch([0] * 4, [[1, 2, 3]] * 4, completions, [[-1.0] * len(c) for c in completions], [False] * 4,
                             ["x"] * 4, np.zeros(4), np.zeros((4, 0)), torch.tensor([[1.0] * 4, [-1.0] * 4, [0.5] * 4, [-0.5] * 4]),
                             policy_version=3, versions=[[2, 2, 3, 3], [3, 3, 3], [3, 3], [3, 3, 3]], taken_version=3)
        micro = trainer.micro_batches(batch, list(range(4)))
        packed = [trainer.pack(batch, mb) for mb in micro]
        assert len(micro) == 2
        num_items = sum(aggregation_count(p.mask, trainer.parts.aggregation) for p in packed)  # as update() counts
        sums = defaultdict(float)
        with HostTraffic() as traffic:
            trainer.backward_micro_batches(batch, micro, packed, num_items, sums)
        assert traffic.calls == []  # before: 15 (per micro-batch: 3-4 torch.tensor, 2 as_tensor, 1 bool on the 1st)
        assert float(sums["off_policy_tokens"]) == 2.0 and float(sums["staleness_sum"]) == 2.0  # 2 tokens 1 version behind
        assert float(sums["mismatch_tokens"]) == 10.0  # the tokens sampled by the trainer's version: 4 + 3 + 2 + 3 - 2
    finally:
        trainer.close()


def test_the_log_prob_pass_moves_every_micro_batch_before_its_first_forward(tiny_model_dir):
    # score_completions (old, reference and teacher log-probs) over 2 micro-batches: the 5 tensors of each packed
    # micro-batch (ids, attention mask, prompt lengths, completion ids and mask) are made before the first forward
    # (an embedding lookup), not one micro-batch's between two forwards, where each waits for the forward before it.
    from cohort.trainer.rollout_batch import RolloutBatch
    from cohort.trainer.scoring import score_completions

    class Order(HostTraffic):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.embedding:
                self.calls.append("forward")
            return super().__torch_function__(func, types, args, kwargs)

    import numpy as np

    policy = load_policy(tiny_model_dir, "float32")
    completions = [[5, 6, 7, 8], [5, 6, 7], [9, 10], [11, 12, 13]]
    batch = RolloutBatch([0] * 4, [[1, 2, 3]] * 4, completions, [[]] * 4, [False] * 4, ["x"] * 4, np.zeros(4),
                         np.zeros((4, 0)), torch.zeros(4, 4))
    with Order() as order:
        out = score_completions(batch, [[0, 1], [2, 3]], {"old": (policy, torch.enable_grad)}, pad_id=0,
                                device=torch.device("cpu"), temperature=1.0, chunk_size=2)
    kinds = [c.split()[0] for c in order.calls]
    assert kinds == ["tensor"] * 10 + ["forward"] * 2  # before: 5 tensors, a forward, 5 tensors, a forward
    assert [len(r) for r in out["old"]] == [4, 3, 2, 3]


def test_the_critic_moves_every_micro_batch_before_its_first_forward(tmp_path, tiny_model_dir):
    # The critic's value pass (ppo) over 2 micro-batches of 2: every tensor `Trainer.pack` makes for both (on the host,
    # then moved) comes before the first forward (an embedding lookup), as in the log-prob pass above. Before, each
    # micro-batch was packed between two forwards: tensors, a forward, tensors, a forward.
    import numpy as np

    from cohort.config.resolve import load_config
    from cohort.trainer.rollout_batch import RolloutBatch
    from cohort.trainer.trainer import Trainer
    from tests.builders import tiny_run, write_doubling

    class Order(HostTraffic):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.nn.functional.embedding:
                self.calls.append("forward")
            return super().__torch_function__(func, types, args, kwargs)

    data = write_doubling(tmp_path / "train.jsonl", 8)
    cfg = load_config(None, tiny_run(tiny_model_dir, data, tmp_path / "run", "engine.name=hf", "algorithm.name=ppo",
                                     "train.prompts_per_step=1", "train.micro_batch_size=2", "rollout.max_completion_length=8",
                                     "rewards=[{name: exact_match}]"))
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    try:
        completions = [[5, 6, 7, 8], [5, 6, 7], [9, 10], [11, 12, 13]]
        batch = RolloutBatch([0] * 4, [[1, 2, 3]] * 4, completions, [[]] * 4, [False] * 4, ["x"] * 4, np.zeros(4),
                             np.zeros((4, 0)), torch.zeros(4, 4))
        with Order() as order:
            values = trainer.parts.critic.values(batch, [[0, 1], [2, 3]])
        kinds = [c.split()[0] for c in order.calls]
        assert kinds.count("forward") == 2 and "forward" not in kinds[: -2]  # the forwards last, nothing between them
        assert len(kinds) > 2  # (the packing made tensors: the order above says something)
        assert [len(v) for v in values] == [4, 3, 2, 3]
    finally:
        trainer.close()
