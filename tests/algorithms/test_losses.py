"""Policy losses: hand-computed tokens, clipping boundaries, GSPO's gradient, metrics, dtypes."""

import math

import pytest
import torch

from cohort.algorithms import AGGREGATIONS, POLICY_LOSSES, aggregate_loss, policy_loss


def t64(values):
    return torch.tensor(values, dtype=torch.float64)


def one_token(log_ratio, advantage, name="ppo_clip", **kwargs):
    """Loss and d loss / d logp for a single active token with the given log-ratio."""
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss(name, logp, t64([[0.0]]), t64([advantage]), torch.ones(1, 1), **kwargs)
    loss.backward()
    return loss.item(), logp.grad.item(), {k: v.item() for k, v in metrics.items()}


def test_ppo_clip_high_side_by_hand():
    # r = e^0.5 = 1.6487, A = +1, eps_high = 0.2: min(r A, 1.2 A) = 1.2, loss -1.2, no gradient.
    loss, grad, metrics = one_token(0.5, 1.0)
    assert loss == pytest.approx(-1.2, abs=1e-12) and grad == 0.0
    assert metrics["clip_ratio/high"] == 1.0 and metrics["clip_ratio/low"] == 0.0
    # Same r, A = -1: max(-A r, -A 1.2) = max(1.6487, 1.2) = r: loss r, gradient d(r)/dlogp = r.
    loss, grad, metrics = one_token(0.5, -1.0)
    assert loss == pytest.approx(math.exp(0.5), abs=1e-12) and grad == pytest.approx(math.exp(0.5), abs=1e-12)
    assert metrics["clip_ratio/region"] == 0.0


def test_ppo_clip_low_side_by_hand():
    # r = 0.5, A = -1, eps_low = 0.2: max(0.5, 0.8) = 0.8, loss 0.8, no gradient, counted as low clip.
    loss, grad, metrics = one_token(math.log(0.5), -1.0)
    assert loss == pytest.approx(0.8, abs=1e-12) and grad == 0.0
    assert metrics["clip_ratio/low"] == 1.0 and metrics["clip_ratio/region"] == 1.0
    # r = 0.5, A = +1: max(-0.5, -0.8) = -0.5; gradient -r = -0.5; not counted.
    loss, grad, metrics = one_token(math.log(0.5), 1.0)
    assert loss == pytest.approx(-0.5, abs=1e-12) and grad == pytest.approx(-0.5, abs=1e-12)
    assert metrics["clip_ratio/low"] == 0.0


@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (0.2, 0.28), (3e-4, 4e-4)])
def test_clipping_engages_exactly_past_one_plus_minus_eps(eps_low, eps_high):
    tiny = 1e-9
    # Just inside 1 + eps_high with A > 0: gradient -r flows; just outside: gradient 0.
    _, grad, metrics = one_token(math.log1p(eps_high - tiny), 1.0, eps_low=eps_low, eps_high=eps_high)
    assert grad == pytest.approx(-(1 + eps_high), abs=1e-6) and metrics["clip_ratio/high"] == 0.0
    _, grad, metrics = one_token(math.log1p(eps_high + tiny), 1.0, eps_low=eps_low, eps_high=eps_high)
    assert grad == 0.0 and metrics["clip_ratio/high"] == 1.0
    # Just inside 1 - eps_low with A < 0: gradient +r flows; just outside: gradient 0.
    _, grad, metrics = one_token(math.log1p(-eps_low + tiny), -1.0, eps_low=eps_low, eps_high=eps_high)
    assert grad == pytest.approx(1 - eps_low, abs=1e-6) and metrics["clip_ratio/low"] == 0.0
    _, grad, metrics = one_token(math.log1p(-eps_low - tiny), -1.0, eps_low=eps_low, eps_high=eps_high)
    assert grad == 0.0 and metrics["clip_ratio/low"] == 1.0


def test_dual_clip_and_delta_by_hand():
    # A = -1, r = e^1 = 2.718: plain PPO loss is r. dual_clip c = 2: min(r, -A c) = 2, no gradient.
    loss, grad, metrics = one_token(1.0, -1.0, dual_clip=2.0)
    assert loss == pytest.approx(2.0, abs=1e-12) and grad == 0.0 and metrics["clip_ratio/dual"] == 1.0
    # Off by default: the loss is r.
    assert one_token(1.0, -1.0)[0] == pytest.approx(math.e, abs=1e-12)
    # delta = 1.5 caps the unclipped ratio: max(-A min(r, 1.5), -A 1.2) = 1.5, no gradient.
    loss, grad, metrics = one_token(1.0, -1.0, delta=1.5)
    assert loss == pytest.approx(1.5, abs=1e-12) and grad == 0.0 and metrics["clip_ratio/dual"] == 1.0
    # Neither touches positive advantages: r = e, A = +1 -> -1.2 as usual.
    assert one_token(1.0, 1.0, dual_clip=2.0, delta=1.5)[0] == pytest.approx(-1.2, abs=1e-12)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        one_token(0.0, 1.0, dual_clip=0.5)
    with pytest.raises(ValueError, match="delta must be > 1 \\+ eps_high"):
        one_token(0.0, 1.0, delta=1.1)


def test_on_policy_loss_value_is_minus_mean_advantage_but_gradient_is_not_zero():
    # ratio = 1 everywhere: per-token loss = -A, so with group-centred advantages and token_mean
    # over equal lengths the loss reads 0, while d loss / d logp_t = -A_i / N is not 0.
    torch.manual_seed(0)
    logp = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    advantages = t64([1.0, -1.0, 0.5, -0.5])
    loss, _ = policy_loss("ppo_clip", logp, logp.detach(), advantages, torch.ones(4, 3))
    loss.backward()
    assert abs(loss.item()) < 1e-15
    torch.testing.assert_close(logp.grad, (-advantages / 12).unsqueeze(1).expand(4, 3), rtol=0, atol=1e-15)


def test_gspo_by_hand():
    # Row: log-ratios [0.1, 0.3] -> sequence log-ratio 0.2, s = e^0.2 = 1.2214 on both tokens.
    # A = +1, eps_high = 0.3: not clipped; per-token loss -s; token_mean loss -s.
    # Gradient per token: -A * s / N with N = 2 tokens -> -s / 2 each.
    logp = torch.tensor([[0.1, 0.3]], dtype=torch.float64, requires_grad=True)
    loss, metrics = policy_loss("gspo", logp, torch.zeros(1, 2, dtype=torch.float64), t64([1.0]), torch.ones(1, 2),
                                eps_low=0.3, eps_high=0.3)
    loss.backward()
    s = math.exp(0.2)
    assert loss.item() == pytest.approx(-s, abs=1e-12)
    torch.testing.assert_close(logp.grad, t64([[-s / 2, -s / 2]]), rtol=0, atol=1e-12)
    assert metrics["ratio/mean"].item() == pytest.approx(s, abs=1e-12)
    # With the paper's eps 3e-4 / 4e-4 the whole row is clipped: s - 1 = 0.22 > 4e-4.
    loss, metrics = policy_loss("gspo", logp.detach(), torch.zeros(1, 2, dtype=torch.float64), t64([1.0]),
                                torch.ones(1, 2), eps_low=3e-4, eps_high=4e-4)
    assert loss.item() == pytest.approx(-(1 + 4e-4), abs=1e-12) and metrics["clip_ratio/high"].item() == 1.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS.names())
def test_gspo_gradient_matches_trl_sequence_level(aggregation):
    # TRL's importance_sampling_level="sequence": coef = exp(mean_t log-ratio) shared by the row's
    # tokens, gradient flowing through the mean. GSPO-token must give the same gradient.
    torch.manual_seed(2)
    logp = torch.randn(4, 5, dtype=torch.float64).mul(0.1).requires_grad_()
    old_logp = logp.detach() + 0.05 * torch.randn(4, 5, dtype=torch.float64)
    mask = torch.arange(5).unsqueeze(0) < torch.tensor([[5], [2], [4], [1]])
    advantages = t64([0.7, -1.2, 0.3, -0.4])
    loss, _ = policy_loss("gspo", logp, old_logp, advantages, mask, eps_low=10.0, eps_high=10.0,
                          aggregation=aggregation, max_length=5)
    (ours,) = torch.autograd.grad(loss, logp)
    m = mask.double()
    seq_log_ratio = ((logp - old_logp) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)
    per_token = -advantages.unsqueeze(1) * torch.exp(seq_log_ratio).expand(4, 5)
    (reference,) = torch.autograd.grad(aggregate_loss(per_token, mask, aggregation, max_length=5), logp)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-12)


def test_cispo_by_hand():
    # r = e^0.5, eps_high = 0.2: weight = min(r, 1.2) = 1.2 (stop-gradient); A = 2, logp = 0.5:
    # loss = -1.2 * 2 * 0.5 = -1.2; gradient wrt logp = -1.2 * 2 = -2.4 (clipping never blocks it).
    loss, grad, metrics = one_token(0.5, 2.0, name="cispo")
    assert loss == pytest.approx(-1.2, abs=1e-12) and grad == pytest.approx(-2.4, abs=1e-12)
    assert metrics["clip_ratio/high"] == 1.0
    # r = 0.5: no lower clip, weight 0.5; A = -1, logp = log .5: loss = -0.5 * -1 * log .5; gradient 0.5.
    loss, grad, metrics = one_token(math.log(0.5), -1.0, name="cispo")
    assert loss == pytest.approx(0.5 * math.log(0.5), abs=1e-12) and grad == pytest.approx(0.5, abs=1e-12)
    assert metrics["clip_ratio/low"] == 0.0


def test_sapo_by_hand():
    # On-policy r = 1: gate = 4/tau * sigmoid(0) = 2/tau, loss = -A * 2/tau;
    # gradient = -A * 4/tau * sigmoid'(0) * tau * r = -A (the plain policy gradient).
    loss, grad, _ = one_token(0.0, 1.0, name="sapo")
    assert loss == pytest.approx(-2.0, abs=1e-12) and grad == pytest.approx(-1.0, abs=1e-12)
    loss, grad, _ = one_token(0.0, -1.0, name="sapo")  # tau_neg = 1.05
    assert loss == pytest.approx(2.0 / 1.05, abs=1e-12) and grad == pytest.approx(1.0, abs=1e-12)
    # r = e^0.5 = 1.6487, A = 1, tau = 1: gate = 4 sigmoid(0.6487) = 2.6268..., loss = -gate;
    # gradient = -4 sigmoid'(0.6487) * r (smaller than the unclipped -r: the soft trust region).
    r = math.exp(0.5)
    sig = 1 / (1 + math.exp(-(r - 1)))
    loss, grad, metrics = one_token(0.5, 1.0, name="sapo")
    assert loss == pytest.approx(-4 * sig, abs=1e-12)
    assert grad == pytest.approx(-4 * sig * (1 - sig) * r, abs=1e-12)
    assert metrics["clip_ratio/region"] == 0.0


def test_metrics_by_hand():
    # Four active tokens (one padded): ratios e^.5 (A +1: high clip), 0.5 (A -1: low clip),
    # 1 (A +1), e^.5 (A -1: not clipped). low = 1/4, high = 1/4, region = 2/4.
    # ratio/mean = (2 e^.5 + 1.5) / 4, ratio/max = e^.5 (the padded 100 is ignored).
    # approx_kl = mean of r - 1 - log r = (2 (e^.5 - 1.5) + (0.5 - 1 - log .5) + 0) / 4.
    logp = t64([[0.5, math.log(0.5), 0.0], [0.5, 100.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    advantages = t64([[1.0, -1.0, 1.0], [-1.0, 1.0, 1.0]])
    _, metrics = policy_loss("ppo_clip", logp, torch.zeros(2, 3, dtype=torch.float64), advantages, mask)
    e = math.exp(0.5)
    expected = {
        "clip_ratio/low": 0.25, "clip_ratio/high": 0.25, "clip_ratio/region": 0.5, "clip_ratio/dual": 0.0,
        "ratio/mean": (2 * e + 1.5) / 4, "ratio/max": e,
        "approx_kl": (2 * (e - 1.5) + (0.5 - 1 - math.log(0.5))) / 4,
    }
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key].item() == pytest.approx(value, abs=1e-12), key
        assert not metrics[key].requires_grad and metrics[key].dim() == 0


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_sequence_advantages_equal_broadcast_token_advantages(name):
    torch.manual_seed(3)
    logp = torch.randn(3, 4, dtype=torch.float64)
    old_logp = logp + 0.2 * torch.randn(3, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float64)
    advantages = t64([0.5, -1.0, 2.0])
    loss_seq, _ = policy_loss(name, logp, old_logp, advantages, mask)
    loss_tok, _ = policy_loss(name, logp, old_logp, advantages.unsqueeze(1).expand(3, 4), mask)
    torch.testing.assert_close(loss_seq, loss_tok, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_entry_takes_the_same_call_and_keeps_dtype(name, dtype):
    logp = torch.zeros(2, 3, dtype=dtype, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, metrics = policy_loss(name, logp, logp.detach() - 0.1, torch.tensor([1.0, -1.0], dtype=dtype), mask,
                                eps_low=0.2, eps_high=0.28, aggregation="seq_mean_token_mean")
    assert loss.dtype == dtype and all(v.dtype == dtype for v in metrics.values())
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[~mask] == 0).all()  # padded positions get no gradient


def test_bad_inputs_raise():
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="valid names: ppo_clip, gspo, seq_sum_clip, cispo, sapo, luspo, vespo"):
        policy_loss("grpo", logp, logp, torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"advantages must be \(B,\) or \(B, T\)"):
        policy_loss("ppo_clip", logp, logp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="share a"):
        policy_loss("ppo_clip", logp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))


# gmpo is left out: its per-token loss is a share of one sequence loss (ratio and advantage are the row's), so a
# token's weight scales that share, not the token's advantage (tests/algorithms/test_gmpo.py)
@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES.names() if n != "gmpo"])
def test_token_weights_scale_the_per_token_loss(name):
    # Weights w multiply the per-token loss before aggregation. For w >= 0 every entry's per-token
    # loss is positively homogeneous in A, so weighting equals scaling the advantages by w.
    torch.manual_seed(4)
    logp = torch.randn(3, 4, dtype=torch.float64).mul(0.1).requires_grad_()
    old_logp = logp.detach() + 0.1 * torch.randn(3, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    advantages = torch.randn(3, 4, dtype=torch.float64)
    weights = t64([[2.0, 0.5, 0.0, 9.0], [1.0, 1.0, 1.5, 0.3], [0.0, 2.0, 1.0, 1.0]])
    weighted, _ = policy_loss(name, logp, old_logp, advantages, mask, token_weights=weights, dual_clip=3.0)
    scaled, _ = policy_loss(name, logp, old_logp, advantages * weights, mask, dual_clip=3.0)
    torch.testing.assert_close(weighted, scaled, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(weighted, logp)[0], torch.autograd.grad(scaled, logp)[0],
                               rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="token_weights must be"):
        policy_loss(name, logp, old_logp, advantages, mask, token_weights=weights[:, :2])


def test_seq_sum_clip_by_hand():
    # One row, two active tokens and a pad; log-ratios [0.1, -0.3] sum to -0.2: s = e^-0.2 = 0.818731.
    # A = +1, clip range [0.8, 1.2]: s is inside, sequence loss -A s = -0.818731; each token carries half of it,
    # so with seq_mean_token_sum the loss is -0.818731, and d loss / d logp_t = -A s on both tokens, 0 on the pad.
    def run(log_ratios, advantage):
        logp = torch.tensor([log_ratios + [0.0]], dtype=torch.float64, requires_grad=True)
        mask = t64([[1.0, 1.0, 0.0]])
        loss, metrics = policy_loss("seq_sum_clip", logp, torch.zeros(1, 3, dtype=torch.float64), t64([advantage]), mask,
                                    aggregation="seq_mean_token_sum")
        loss.backward()
        return loss.item(), logp.grad[0].tolist(), metrics

    s = math.exp(-0.2)
    loss, grad, metrics = run([0.1, -0.3], 1.0)
    assert loss == pytest.approx(-s, abs=1e-12)
    assert grad == pytest.approx([-s, -s, 0.0], abs=1e-12)
    assert metrics["ratio/mean"].item() == pytest.approx(s, abs=1e-12)
    # log-ratios [0.2, 0.1]: s = e^0.3 = 1.349859 > 1.2 with A = +1: clipped, loss -1.2, no gradient.
    loss, grad, metrics = run([0.2, 0.1], 1.0)
    assert loss == pytest.approx(-1.2, abs=1e-12) and grad == [0.0, 0.0, 0.0]
    assert metrics["clip_ratio/high"].item() == 1.0
    # Same s with A = -1: max(-A s, -A 1.2) = s = 1.349859, gradient -A s = +s per token.
    loss, grad, _ = run([0.2, 0.1], -1.0)
    assert loss == pytest.approx(math.exp(0.3), abs=1e-12)
    assert grad == pytest.approx([math.exp(0.3), math.exp(0.3), 0.0], abs=1e-12)


def test_seq_sum_clip_equals_trl_rloo_loss():
    # TRL's RLOO: s_i = exp(sum_t (logp - old_logp)), loss = mean_i -min(s_i A_i, clip(s_i) A_i).
    torch.manual_seed(5)
    logp = (0.1 * torch.randn(4, 5, dtype=torch.float64)).requires_grad_()
    old_logp = logp.detach() + 0.08 * torch.randn(4, 5, dtype=torch.float64)
    mask = t64([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    advantages = t64([0.7, -1.2, 0.4, -0.3])
    ours, _ = policy_loss("seq_sum_clip", logp, old_logp, advantages, mask, eps_low=0.05, eps_high=0.05,
                          aggregation="seq_mean_token_sum")
    s = torch.exp(((logp - old_logp) * mask).sum(-1))
    trl = (-torch.minimum(s * advantages, s.clamp(0.95, 1.05) * advantages)).mean()
    clipped = ((s > 1.05) & (advantages > 0)) | ((s < 0.95) & (advantages < 0))
    assert clipped.any() and not clipped.all()  # both branches are exercised
    torch.testing.assert_close(ours, trl, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(ours, logp)[0], torch.autograd.grad(trl, logp)[0], rtol=0, atol=1e-12)
