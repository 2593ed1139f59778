"""The optimizer and learning-rate schedule of a trained model (the policy, and PPO's critic with its own rates).

AdamW over the parameters that require grad (`train.learning_rate`, `adam_beta1/2`,
`weight_decay`), and a LambdaLR schedule: linear warmup over `train.warmup_steps`,
then constant, linear or cosine decay to `train.max_steps` (`train.lr_scheduler`).

Left out: other optimizers, parameter groups (no weight decay on norms/biases).
"""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, train_cfg) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=train_cfg.learning_rate, betas=(train_cfg.adam_beta1, train_cfg.adam_beta2),
                                  weight_decay=train_cfg.weight_decay)
    warmup, total, kind = train_cfg.warmup_steps, train_cfg.max_steps, train_cfg.lr_scheduler

    def factor(step: int) -> float:  # step = number of optimizer steps taken so far
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def zero_missing_grads(model: torch.nn.Module) -> None:
    """A zero gradient for every trainable parameter that has none: after an update whose every backward was skipped
    (each micro-batch's gradient was exactly zero), the optimizer steps each parameter as it would after a zero
    backward (AdamW's moments decay and its weight decay applies) instead of passing over parameters without one."""
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
