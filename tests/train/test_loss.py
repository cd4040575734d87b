"""Position weights, normalisation, chunking, and the metrics."""

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from blockdraft.config import LossConfig
from blockdraft.train.loss import (
    MicroStats,
    StepSums,
    block_loss,
    denominator,
    fused_linear_loss,
    static_position_weights,
    stats_vector,
    streak_weights,
    summarize,
)


def test_exp_decay_weights_and_gamma_default():
    exp = LossConfig(weighting="exp_decay")
    w16 = static_position_weights(exp, 16, torch.device("cpu"))
    assert w16.shape == (15,)
    assert w16[0] == 1.0 and w16[7].item() == pytest.approx(math.exp(-7 / 7))
    w8 = static_position_weights(exp, 8, torch.device("cpu"))
    assert w8[4].item() == pytest.approx(math.exp(-4 / 4))
    w = static_position_weights(LossConfig(weighting="exp_decay", gamma=2.0), 16, torch.device("cpu"))
    assert w[2].item() == pytest.approx(math.exp(-1.0))
    assert (static_position_weights(LossConfig(weighting="uniform"), 8, torch.device("cpu")) == 1).all()


def test_streak_weights_are_prefix_products_with_floor():
    p = torch.tensor([[0.5, 0.5, 0.1, 0.9]])
    w = streak_weights(p, floor=0.05)
    assert w.tolist()[0] == pytest.approx([1.0, 0.5, 0.25, 0.05])


def test_loss_is_weighted_mean_over_real_labels():
    torch.manual_seed(0)
    blocks, k, h, v = 6, 3, 8, 11
    hidden = torch.randn(blocks, k, h)
    weight = torch.randn(v, h)
    labels = torch.randint(0, v, (blocks, k))
    mask = torch.rand(blocks, k) > 0.3
    cfg = LossConfig(weighting="exp_decay", gamma=2.0, logits_chunk=64)
    stats = block_loss(hidden, weight, labels, mask, cfg)
    ce = F.cross_entropy((hidden @ weight.T).view(-1, v), labels.view(-1), reduction="none").view(blocks, k)
    w = static_position_weights(cfg, k + 1, torch.device("cpu")).expand(blocks, k) * mask
    expected = (ce * w).sum() / w.sum()
    assert (stats.weighted_loss / denominator(mask, cfg)).item() == pytest.approx(expected.item(), rel=1e-5)
    assert stats.counted.sum().item() == mask.sum().item()


def reference_loss(hidden, weight, labels, row_w, target_hidden, kl_weight, t, softcap=None):
    """The plain autograd formula the fused function must reproduce."""
    logits = hidden @ weight.T
    ce = F.cross_entropy(logits, labels, reduction="none")
    t_logits = target_hidden @ weight.T
    if softcap:
        t_logits = softcap * torch.tanh(t_logits / softcap)
    p = F.softmax(t_logits / t, -1)
    kl = (p * (p.log() - F.log_softmax(logits / t, -1))).sum(-1) * t * t
    return (row_w * (ce + kl_weight * kl)).sum(), ce, kl


@pytest.mark.parametrize("chunk, softcap", [(7, None), (1000, None), (7, 1.5)])
def test_fused_loss_equals_autograd_reference_values_and_grads(chunk, softcap):
    torch.manual_seed(0)
    h1 = torch.randn(50, 8, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    w = torch.randn(13, 8)
    y = torch.randint(0, 13, (50,))
    row_w = torch.rand(50)
    th = torch.randn(50, 8)
    cfg = LossConfig(kl_weight=0.5, kl_temperature=2.0).model_copy(update={"logits_chunk": chunk})
    rows, terms = fused_linear_loss(h1, w, y, cfg, th, softcap)
    total = (row_w * rows).sum()
    expected, ce, kl = reference_loss(h2, w, y, row_w, th, 0.5, 2.0, softcap)
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(terms.ce, ce.detach())
    torch.testing.assert_close(terms.kl, kl.detach())
    (3.0 * total).backward()
    (3.0 * expected).backward()
    torch.testing.assert_close(h1.grad, h2.grad)


def test_bf16_lm_head_gradient_matches_fp32_autograd():
    """The GPU's dtypes (bf16 lm_head and hidden rows): the input gradient and ce follow the fp32
    autograd formula to bf16 precision (CUDA's kernel: tests/train/test_cross_entropy_kernel.py)."""
    assert_bf16_loss_follows_fp32_autograd()


def assert_bf16_loss_follows_fp32_autograd() -> None:
    """`fused_linear_loss` on a bf16 lm_head, chunks of 16 rows, against fp32 autograd: ce and the input
    gradient to bf16 precision."""
    torch.manual_seed(4)
    h = (torch.randn(40, 16) * 2).requires_grad_(True)
    w = torch.randn(300, 16).to(torch.bfloat16)
    y = torch.randint(0, 300, (40,))
    rows, terms = fused_linear_loss(h, w, y, LossConfig().model_copy(update={"logits_chunk": 16}))
    rows.sum().backward()
    h_ref = h.detach().to(torch.bfloat16).float().requires_grad_(True)
    logits = (h_ref.to(torch.bfloat16) @ w.T).float()
    F.cross_entropy(logits, y, reduction="sum").backward()
    torch.testing.assert_close(terms.ce, F.cross_entropy(logits, y, reduction="none").detach(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=2e-2, atol=2e-2)


def test_target_labels_are_the_targets_argmax():
    torch.manual_seed(2)
    h, th, w = torch.randn(6, 4), torch.randn(6, 4), torch.randn(9, 4)
    cfg = LossConfig(labels="target")
    _, terms = fused_linear_loss(h, w, torch.zeros(6, dtype=torch.long), cfg, th)
    assert terms.labels.tolist() == (th @ w.T).argmax(-1).tolist()
    torch.testing.assert_close(terms.ce, F.cross_entropy(h @ w.T, terms.labels, reduction="none"))


def test_streak_weighting_uses_detached_prefix_probabilities():
    torch.manual_seed(3)
    blocks, k, hd, v = 4, 3, 6, 7
    hidden = torch.randn(blocks, k, hd, requires_grad=True)
    weight = torch.randn(v, hd)
    labels = torch.randint(0, v, (blocks, k))
    mask = torch.ones(blocks, k, dtype=torch.bool)
    cfg = LossConfig(weighting="streak", streak_floor=0.05)
    stats = block_loss(hidden, weight, labels, mask, cfg)
    stats.weighted_loss.backward()
    h2 = hidden.detach().clone().requires_grad_(True)
    ce = F.cross_entropy((h2 @ weight.T).view(-1, v), labels.view(-1), reduction="none").view(blocks, k)
    w = streak_weights(torch.exp(-ce.detach()), 0.05)
    (w * ce).sum().backward()
    torch.testing.assert_close(hidden.grad, h2.grad)


def test_metrics_acc_and_streak():
    v, h = 5, 5
    weight = torch.eye(v)
    labels = torch.tensor([[1, 2, 3]])
    hidden = torch.zeros(1, 3, h)
    hidden[0, 0, 1] = 10  # right
    hidden[0, 1, 2] = 10  # right
    hidden[0, 2, 0] = 10  # wrong
    mask = torch.ones(1, 3, dtype=torch.bool)
    stats = block_loss(hidden, weight, labels, mask, LossConfig())
    assert stats.correct.tolist() == [1.0, 1.0, 0.0]
    assert stats.streak_sum.item() == 2.0 and stats.blocks.item() == 1.0


class HostWaits(TorchDispatchMode):
    """Counts the ops that make the host wait for a CUDA device, by name: nonzero, a tensor read to a
    Python number, and indexing by a boolean mask (a nonzero inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        masks = name in ("aten.index", "aten.index_put_", "aten.index_put") and any(
            i is not None and i.dtype == torch.bool for i in args[1])
        if masks or name in ("aten.nonzero", "aten._local_scalar_dense"):
            self.ops["boolean index" if masks else name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cfg, kl", [(LossConfig(), False), (LossConfig(weighting="streak"), False),
                                     (LossConfig(kl_weight=0.5), True)])
def test_the_loss_makes_the_host_wait_once_a_pass(cfg, kl):
    """Only the labelled rows' count is read on the host (their one nonzero), so on a GPU the host does
    not leave it idle again before the backward (the values are checked against plain formulas above)."""
    torch.manual_seed(4)
    blocks, k, hd, v = 5, 3, 6, 9
    hidden = torch.randn(blocks, k, hd, requires_grad=True)
    weight, labels = torch.randn(v, hd), torch.randint(0, v, (blocks, k))
    mask = torch.rand(blocks, k) > 0.4
    target_hidden = torch.randn(blocks, k, hd) if kl else None
    with HostWaits() as waits:
        stats = block_loss(hidden, weight, labels, mask, cfg, target_hidden)
        stats.weighted_loss.backward()
    assert waits.ops == Counter({"aten.nonzero": 1})
    assert stats.counted.sum().item() == mask.sum().item()
    assert hidden.grad[~mask].abs().sum() == 0 and hidden.grad[mask].abs().sum() > 0


def test_the_stats_vector_decodes_by_name_to_the_sums_it_was_built_from():
    """The one layout: what the trainer and `blockdraft bench` read is what the step summed."""
    stats = MicroStats(weighted_loss=torch.tensor(6.0), weight_sum=torch.tensor(3.0), kl_sum=torch.tensor(1.5),
                       correct=torch.tensor([4.0, 2.0, 1.0]), counted=torch.tensor([5.0, 5.0, 4.0]),
                       streak_sum=torch.tensor(9.0), blocks=torch.tensor(5.0))
    sums = StepSums.decode(stats_vector(stats).tolist())
    assert sums == StepSums(6.0, 3.0, 1.5, 9.0, 5.0, [4.0, 2.0, 1.0], [5.0, 5.0, 4.0])
    assert sums.loss == 2.0
    metrics = summarize(stats_vector(stats).tolist(), 0.5)
    assert metrics["loss"] == 2.0 and metrics["kl"] == 0.5 and metrics["streak"] == 9.0 / 5.0
    assert metrics["loss_tokens"] == 14 and metrics["anchors"] == 5 and metrics["acc"] == 7.0 / 14.0
