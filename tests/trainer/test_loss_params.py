"""The loss parameters are declared once (`LossParams`): `LossInputs` inherits them, `policy_loss` takes exactly
them, and the trainer's mapping from `cfg.algorithm` fills every one, with the config's defaults landing on the
declaration's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cohort.algorithms.losses import LOSS_PARAMETERS, LossInputs, LossParams, policy_loss
from cohort.config import AlgorithmConfig
from cohort.trainer.algorithms import loss_params


def test_the_inputs_carry_the_declared_parameters_and_nothing_else_declares_them():
    tensor_fields = {"logp", "old_logp", "advantages", "mask"}
    assert {f.name for f in dataclasses.fields(LossInputs)} == set(LOSS_PARAMETERS) | tensor_fields
    with pytest.raises(TypeError, match=r"unknown parameters \['eps'\]"):
        x = torch.zeros(1, 2)
        policy_loss("ppo_clip", x, x, torch.ones(1), torch.ones(1, 2), eps=0.1)


def test_the_trainer_fills_every_parameter_and_the_config_defaults_are_the_losses():
    from_config = loss_params(AlgorithmConfig())
    assert set(from_config) == set(LOSS_PARAMETERS)
    # every default agrees but cispo_cap: the loss's None means 1 + eps_high (MiniMax's form); the trainer passes
    # algorithm.epsilon_high (0.2) as the cap, as TRL does
    assert LossParams(**from_config) == dataclasses.replace(LossParams(), cispo_cap=0.2)
