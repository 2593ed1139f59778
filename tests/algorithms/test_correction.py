"""Rollout (train/inference mismatch) importance weights."""

import math

import pytest
import torch

from cohort.algorithms import rollout_correction


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


# One row of three active tokens plus one padded token; trainer/rollout ratios 3, 0.5, 1.5.
TRAINER = t64([[math.log(3.0), math.log(0.5), math.log(1.5), 7.0]])
ROLLOUT = torch.zeros(1, 4, dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0]])


@pytest.mark.parametrize(
    "level, mode, expected, frac_masked",
    [
        ("token", "truncate", [2.0, 0.5, 1.5, 0.0], 0.0),  # min(r, 2)
        ("token", "mask", [0.0, 0.5, 1.5, 0.0], 1 / 3),  # r above 2 dropped
        # sequence ratio = 3 * 0.5 * 1.5 = 2.25 for every token of the row
        ("sequence", "truncate", [2.0, 2.0, 2.0, 0.0], 0.0),
        ("sequence", "mask", [0.0, 0.0, 0.0, 0.0], 1.0),
    ],
)
def test_weights_by_hand(level, mode, expected, frac_masked):
    weights, metrics = rollout_correction(TRAINER, ROLLOUT, MASK, level=level, mode=mode, cap=2.0)
    torch.testing.assert_close(weights, t64([expected]), rtol=0, atol=1e-12)
    assert metrics["mismatch/frac_masked"].item() == pytest.approx(frac_masked, abs=1e-12)


def test_metrics_by_hand():
    # mismatch/kl = mean over active tokens of r - 1 - log r, for r = 3, 0.5, 1.5.
    kl = sum(r - 1 - math.log(r) for r in (3.0, 0.5, 1.5)) / 3
    _, metrics = rollout_correction(TRAINER, ROLLOUT, MASK, level="token", mode="truncate")
    assert metrics["mismatch/kl"].item() == pytest.approx(kl, abs=1e-12)
    assert metrics["mismatch/ratio_max"].item() == pytest.approx(3.0, abs=1e-12)  # padded e^7 ignored
    assert metrics["mismatch/ratio_mean"].item() == pytest.approx(5.0 / 3, abs=1e-12)
    assert metrics["mismatch/frac_capped"].item() == pytest.approx(1 / 3, abs=1e-12)
    _, metrics = rollout_correction(TRAINER, ROLLOUT, MASK, level="sequence", mode="truncate")
    assert metrics["mismatch/ratio_max"].item() == pytest.approx(2.25, abs=1e-12)
    assert metrics["mismatch/kl"].item() == pytest.approx(kl, abs=1e-12)  # the KL is always per token


def test_weights_are_detached_and_one_when_engines_agree():
    trainer = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    for level in ("token", "sequence"):
        weights, metrics = rollout_correction(trainer, trainer.detach().clone(), mask, level=level, mode="mask")
        assert not weights.requires_grad and weights.dtype == torch.float64
        assert (weights == 1).all() and metrics["mismatch/kl"].item() == 0.0


def test_huge_sequence_log_ratio_does_not_overflow():
    trainer = torch.full((1, 100), 1.0, dtype=torch.float64)  # row log-ratio sum 100 -> clamped to 20
    weights, metrics = rollout_correction(trainer, torch.zeros(1, 100, dtype=torch.float64), torch.ones(1, 100),
                                          level="sequence", mode="truncate", cap=2.0)
    assert (weights == 2.0).all() and math.isfinite(metrics["mismatch/ratio_max"].item())


def test_bad_options_raise():
    with pytest.raises(ValueError, match="valid: token, sequence"):
        rollout_correction(TRAINER, ROLLOUT, MASK, level="geometric")
    with pytest.raises(ValueError, match="valid: truncate, mask"):
        rollout_correction(TRAINER, ROLLOUT, MASK, mode="clip")
    with pytest.raises(ValueError, match="cap must be > 0"):
        rollout_correction(TRAINER, ROLLOUT, MASK, cap=0.0)
