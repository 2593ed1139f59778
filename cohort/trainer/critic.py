"""PPO's critic: a value head on its own copy of a causal LM's body, and its update.

`ValueModel` reads the hidden state that predicts each completion token (the
same alignment as the log-probs: the value of the state before completion
token j sits at position prompt_len + j - 1) and maps it to a scalar with one
linear layer. The head starts at zero, so before the first update every value
is 0 and GAE reduces to the discounted reward-to-go.

`Critic` owns the value model, its AdamW optimizer and schedule (critic.learning_rate,
critic.warmup_steps; betas, weight decay, schedule and gradient clipping as
train.*). The driver loop calls `values` once per generation batch (no grad)
and `update` once per optimizer step on the same micro-batches as the policy,
minimising the clipped value loss of `cohort.algorithms.value_loss` (token
mean over the step's active tokens).

Left out: a critic loaded with a trained value head (critic.path gives the
body; the head is always new), and saving the critic with the final policy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from cohort.algorithms import aggregation_count, value_loss
from cohort.models.batching import pad_rows
from cohort.models.host_memory import release_host_memory
from cohort.models.pretrained import load_policy
from cohort.models.logprobs import decoder_and_head
from cohort.models.precision import Precision
from cohort.trainer.metric_sums import host_values
from cohort.trainer.optim import build_optimizer


class ValueModel(torch.nn.Module):
    def __init__(self, body: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden_size, 1, dtype=torch.float32)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_checkpoint(cls, model_dir, dtype) -> "ValueModel":
        lm = load_policy(model_dir, dtype)
        body, _ = decoder_and_head(lm)
        return cls(body, lm.config.hidden_size)

    def forward(self, input_ids, attention_mask, prompt_lengths, completion_mask) -> torch.Tensor:
        """(B, Tc) float32 values of the states before each completion token; 0 at padding."""
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
        tc = completion_mask.shape[1]
        positions = (prompt_lengths[:, None] + torch.arange(tc, device=input_ids.device)[None, :] - 1)  # (B, Tc)
        positions = positions.clamp(min=0, max=hidden.shape[1] - 1)  # padded columns point anywhere valid; masked below
        picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, Tc, H)
        values = self.head(picked.float()).squeeze(-1)  # (B, Tc)
        return values * completion_mask


class Critic:
    def __init__(self, model_dir, cfg, pack, *, precision: Precision, device: torch.device):
        """`pack(batch, indices) -> MicroBatch` is the trainer's, so both models see the same tokens;
        `precision` and `device` are the policy's (float32 masters when mixed, on the training side's device)."""
        self.cfg = cfg
        self.device = device
        self.precision = precision
        self.model = ValueModel.from_checkpoint(model_dir, self.precision.weights_dtype).to(device)
        if cfg.train.gradient_checkpointing:
            self.model.body.gradient_checkpointing_enable()
        self.model.train()
        own = cfg.train.model_copy(update={"learning_rate": cfg.critic.learning_rate, "warmup_steps": cfg.critic.warmup_steps})
        self.optimizer, self.lr_schedule = build_optimizer(self.model, own)
        self.pack = pack

    @torch.no_grad()
    def values(self, batch, micro_batches: list[list[int]]) -> list[torch.Tensor]:
        """Per completion, its (len,) values under the current critic."""
        out: list[torch.Tensor | None] = [None] * len(batch)
        packs = [self.pack(batch, idx).packed for idx in micro_batches]  # all moved before the first forward, as the update's
        for idx, pb in zip(micro_batches, packs):
            with self.precision.autocast():
                values = self.model(pb.input_ids, pb.attention_mask, pb.prompt_lengths, pb.completion_mask)
            for row, i in enumerate(idx):
                out[i] = values[row, : len(batch.completion_ids[i])].clone()
        return out

    def update(self, batch, micro_batches: list[list[int]]) -> dict[str, float]:
        """One optimizer step of the clipped value loss over the micro-batches (gradient accumulation)."""
        packed = [self.pack(batch, mb) for mb in micro_batches]
        num_items = sum(aggregation_count(p.mask, "token_mean") for p in packed)
        sums: dict[str, Any] = defaultdict(float)  # tensors on the device until the step ends (metric_sums.py)
        self.optimizer.zero_grad(set_to_none=True)
        for mb, mbi in zip(micro_batches, packed):
            pb, mask = mbi.packed, mbi.mask
            with self.precision.autocast():  # the backward runs outside it, as autocast asks
                values = self.model(pb.input_ids, pb.attention_mask, pb.prompt_lengths, pb.completion_mask).float()
            width = values.shape[1]
            old_values = pad_rows([batch.values[i] for i in mb], width)
            returns = batch.returns[mb][:, :width]
            loss, metrics = value_loss(values, old_values, returns, mask, cliprange_value=self.cfg.critic.cliprange_value,
                                       aggregation="token_mean", num_items=num_items)
            loss.backward()
            tokens = mask.sum()
            sums["critic/loss"] += loss.detach()
            for key, value in metrics.items():
                sums[key] += value.detach() * tokens if torch.is_tensor(value) else float(value) * tokens
            sums["tokens"] += tokens
            if self.cfg.train.release_host_memory:
                release_host_memory(self.device)  # (CPU) as the policy's update does after each micro-batch
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.train.max_grad_norm if self.cfg.train.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.optimizer.step()
        self.lr_schedule.step()
        sums = host_values({**sums, "grad_norm": grad_norm})
        grad_norm = sums.pop("grad_norm")
        tokens = max(sums.pop("tokens"), 1.0)
        out = {"critic/loss": sums.pop("critic/loss"), "critic/grad_norm": grad_norm,
               "critic/learning_rate": self.lr_schedule.get_last_lr()[0]}
        out.update({key: value / tokens for key, value in sums.items()})
        return out

    # The checkpoint module saves the critic (in `stateful_parts`, trainer/state.py) with state_dict/load_state_dict.
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "lr_schedule": self.lr_schedule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """From `state_dict()` (checkpoints before the rename hold the schedule under "scheduler")."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_schedule.load_state_dict(state["lr_schedule"] if "lr_schedule" in state else state["scheduler"])
