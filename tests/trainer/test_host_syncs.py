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
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from cohort.models.batching import pack_right_padded
from cohort.models.loading import load_policy
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
        kwargs = kwargs or {}
        if not sys._getframe(1).f_code.co_filename.startswith(COHORT):  # cohort's own calls only
            pass
        elif func in HOST_READS:
            self.calls.append(getattr(func, "__name__", str(func)))
        elif func is torch.Tensor.__getitem__ and _has_bool_index(args[1]):
            self.calls.append("boolean-mask index")
        return func(*args, **kwargs)


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
