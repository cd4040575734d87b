"""The Triton cross-entropy kernel against the PyTorch formula it replaces on CUDA.

Without a GPU the kernel runs in Triton's interpreter, in a child process: `triton.jit` reads
TRITON_INTERPRET when triton.language is first imported, which this process has done already (flex
attention imports it). The interpreter rounds its bf16 stores toward zero, so gradients are compared
to one bf16 step (2^-8 near 1) instead of half of one."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from blockdraft.train.loss import _ce_terms

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

CHILD = """
import sys, torch
from blockdraft.train.cross_entropy_kernel import cross_entropy_terms
logits, labels, need_grad = torch.load(sys.argv[1])
ptr = logits.data_ptr()
ce, pred, grad = cross_entropy_terms(logits, labels, need_grad)
torch.save((ce, pred, grad, logits, grad is not None and grad.data_ptr() == ptr), sys.argv[2])
"""


def kernel(logits: torch.Tensor, labels: torch.Tensor, need_grad: bool, tmp_path) -> tuple:
    """(ce, pred, grad, the logits tensor afterwards, whether grad is the logits' storage), on CPU."""
    if torch.cuda.is_available():
        from blockdraft.train.cross_entropy_kernel import cross_entropy_terms

        x = logits.cuda()
        ce, pred, grad = cross_entropy_terms(x, labels.cuda(), need_grad)
        same = grad is not None and grad.data_ptr() == x.data_ptr()
        return ce.cpu(), pred.cpu(), None if grad is None else grad.cpu(), x.cpu(), same
    args, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save((logits, labels, need_grad), args)
    subprocess.run([sys.executable, "-c", CHILD, str(args), str(out)], check=True,
                   env={**os.environ, "TRITON_INTERPRET": "1"})
    return torch.load(out)


@pytest.mark.parametrize("rows, vocab", [(5, 3000), (3, 4099), (4, 700)])
def test_kernel_gives_the_formulas_ce_argmax_and_gradient_over_the_logits(rows, vocab, tmp_path):
    """Vocabularies below, at and across the kernel's column block, the last one partial; a row whose
    maximum appears several times takes the first, as torch.argmax does; the gradient takes the
    logits' place."""
    torch.manual_seed(0)
    logits = (torch.randn(rows, vocab) * 3).to(torch.bfloat16)
    ties = [col for col in (17, 17 + 1024, 17 + 2048, vocab - 5) if col < vocab]  # in one lane and across
    logits[1, ties] = 40.0
    labels = torch.randint(0, vocab, (rows,))
    ce_ref, pred_ref, _ = _ce_terms(logits, labels, need_grad=True)
    grad_ref = torch.softmax(logits.float(), -1) - F.one_hot(labels, vocab).float()

    ce, pred, grad, after, in_place = kernel(logits, labels, True, tmp_path)

    torch.testing.assert_close(ce, ce_ref, rtol=1e-5, atol=1e-5)
    assert pred.tolist() == pred_ref.tolist() and pred[1].item() == 17
    assert grad.dtype == torch.bfloat16 and in_place and torch.equal(after, grad)
    torch.testing.assert_close(grad.float(), grad_ref, rtol=0, atol=2**-8)


def test_kernel_leaves_the_logits_when_no_gradient_is_asked(tmp_path):
    torch.manual_seed(1)
    logits = torch.randn(3, 500).to(torch.bfloat16)
    labels = torch.tensor([0, 499, 250])
    ce, pred, grad, after, _ = kernel(logits, labels, False, tmp_path)
    assert grad is None and torch.equal(after, logits)
    torch.testing.assert_close(ce, F.cross_entropy(logits.float(), labels, reduction="none"))
    assert pred.tolist() == logits.float().argmax(-1).tolist()


def test_the_fused_loss_on_the_kernels_terms_follows_fp32_autograd(monkeypatch, tmp_path):
    """What CUDA runs: `fused_linear_loss` with its chunks' terms from the kernel (bf16 lm_head, chunks
    of 16 rows) gives fp32 autograd's ce and input gradient to bf16 precision."""
    import blockdraft.train.loss as loss_module
    from tests.train.test_loss import assert_bf16_loss_follows_fp32_autograd

    monkeypatch.setattr(loss_module, "_ce_terms", lambda x, y, need: kernel(x, y, need, tmp_path)[:3])
    assert_bf16_loss_follows_fp32_autograd()
