"""Position weights, normalisation, chunking, and the metrics."""

import math

import pytest
import torch
import torch.nn.functional as F

from blockdraft.config import LossConfig
from blockdraft.train.loss import block_loss, chunked_terms, denominator, static_position_weights, streak_weights


def test_exp_decay_weights_and_gamma_default():
    w16 = static_position_weights(LossConfig(), 16, torch.device("cpu"))
    assert w16.shape == (15,)
    assert w16[0] == 1.0 and w16[7].item() == pytest.approx(math.exp(-7 / 7))
    w8 = static_position_weights(LossConfig(), 8, torch.device("cpu"))
    assert w8[4].item() == pytest.approx(math.exp(-4 / 4))
    w = static_position_weights(LossConfig(gamma=2.0), 16, torch.device("cpu"))
    assert w[2].item() == pytest.approx(math.exp(-1.0))
    assert (static_position_weights(LossConfig(weighting="uniform"), 8, torch.device("cpu")) == 1).all()


def test_streak_weights_are_prefix_products_with_floor():
    p = torch.tensor([[0.5, 0.5, 0.1, 0.9]])
    w = streak_weights(p, floor=0.05)
    assert w.tolist()[0] == pytest.approx([1.0, 0.5, 0.25, 0.05])


def test_loss_is_weighted_mean_over_real_labels():
    torch.manual_seed(0)
    n, a, k, h, v = 2, 3, 3, 8, 11
    hidden = torch.randn(n, a, k, h)
    weight = torch.randn(v, h)
    labels = torch.randint(0, v, (n, a, k))
    mask = torch.rand(n, a, k) > 0.3
    cfg = LossConfig(gamma=2.0, logits_chunk=64)
    stats = block_loss(hidden, weight, labels, mask, mask.any(-1), cfg)
    ce = F.cross_entropy((hidden @ weight.T).view(-1, v), labels.view(-1), reduction="none").view(n, a, k)
    w = static_position_weights(cfg, k + 1, torch.device("cpu")).expand(n, a, k) * mask
    expected = (ce * w).sum() / w.sum()
    assert (stats.weighted_loss / denominator(mask, cfg)).item() == pytest.approx(expected.item(), rel=1e-5)
    assert stats.counted.sum().item() == mask.sum().item()


def test_chunked_terms_equal_unchunked_values_and_grads():
    torch.manual_seed(0)
    h1 = torch.randn(50, 8, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    w = torch.randn(13, 8)
    y = torch.randint(0, 13, (50,))
    th = torch.randn(50, 8)
    ce1, kl1, _, _ = chunked_terms(h1, w, y, th, False, 2.0, chunk=7)
    ce2, kl2, _, _ = chunked_terms(h2, w, y, th, False, 2.0, chunk=1000)
    torch.testing.assert_close(ce1, ce2)
    torch.testing.assert_close(kl1, kl2)
    (ce1.sum() + kl1.sum()).backward()
    (ce2.sum() + kl2.sum()).backward()
    torch.testing.assert_close(h1.grad, h2.grad)


def test_kl_matches_its_definition():
    torch.manual_seed(1)
    h, th, w = torch.randn(5, 4), torch.randn(5, 4), torch.randn(9, 4)
    t = 2.0
    _, kl, _, _ = chunked_terms(h, w, torch.zeros(5, dtype=torch.long), th, False, t, chunk=64)
    p = F.softmax(th @ w.T / t, -1)
    q = F.log_softmax(h @ w.T / t, -1)
    expected = (p * (p.log() - q)).sum(-1) * t * t
    torch.testing.assert_close(kl, expected)


def test_metrics_acc_and_streak():
    v, h = 5, 5
    weight = torch.eye(v)
    labels = torch.tensor([[[1, 2, 3]]])
    hidden = torch.zeros(1, 1, 3, h)
    hidden[0, 0, 0, 1] = 10  # right
    hidden[0, 0, 1, 2] = 10  # right
    hidden[0, 0, 2, 0] = 10  # wrong
    mask = torch.ones(1, 1, 3, dtype=torch.bool)
    stats = block_loss(hidden, weight, labels, mask, mask.any(-1), LossConfig())
    assert stats.correct.tolist() == [1.0, 1.0, 0.0]
    assert stats.streak_sum.item() == 2.0 and stats.blocks.item() == 1.0
