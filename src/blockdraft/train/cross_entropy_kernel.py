"""Cross-entropy terms of one chunk of lm_head logits in two passes over them (Triton, CUDA).

The fused lm_head loss (`train/loss.py`) needs, per row of bf16 logits x [r, V] and its label y:
  ce    = logsumexp(x) - x_y                       (fp32 math)
  pred  = argmax(x)                                (first index among equal maxima, as torch.argmax)
  d ce / d x = softmax(x) - onehot(y)              (in the logits' dtype)
Pass 1 reads each row once (online max and sum of exp, argmax, the label's logit); pass 2 reads it
again and writes the gradient over the logits, which nothing reads afterwards: three trips through
memory and no second [r, V] buffer. On a [4096 x 151936] chunk the compiled PyTorch formula took 1.9x as
long (benchmarks/2026-12-06-h100-cross-entropy-kernel.md). `loss._ce_terms` is the same math in
PyTorch, used on the CPU and as the reference. The kernels' names begin with `cross_entropy_`, which is
how `bench --profile` tells them from TorchInductor's (`bench/profile.kernel_kind`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

STATS_BLOCK, STATS_WARPS = 2048, 8  # columns per step of a row's loop in pass 1
GRAD_BLOCK, GRAD_WARPS = 2048, 8  # columns per program in pass 2


@triton.jit
def cross_entropy_row_stats(logits_ptr, labels_ptr, lse_ptr, ce_ptr, pred_ptr, row_stride, V, BLOCK: tl.constexpr):
    """One program per row: lse, ce and argmax from one read of the row."""
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: max seen so far
    run_sum = tl.zeros([BLOCK], tl.float32)  # per lane: sum of exp(x - run_max)
    run_arg = tl.zeros([BLOCK], tl.int32)  # per lane: first column holding run_max
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # a lane with no value yet adds 0
        run_sum = run_sum * tl.exp(run_max - shift) + tl.exp(x - shift)
        run_arg = tl.where(x > run_max, cols, run_arg)
        run_max = new_max
    top = tl.max(run_max, 0)
    lse = top + tl.log(tl.sum(run_sum * tl.exp(run_max - top), 0))
    pred = tl.min(tl.where(run_max == top, run_arg, V), 0)
    label = tl.load(labels_ptr + row)
    tl.store(lse_ptr + row, lse)
    tl.store(ce_ptr + row, lse - tl.load(base + label).to(tl.float32))
    tl.store(pred_ptr + row, pred)


@triton.jit
def cross_entropy_softmax_minus_onehot(logits_ptr, labels_ptr, lse_ptr, row_stride, V, BLOCK: tl.constexpr):
    """One program per (row, column block): x <- exp(x - lse) - [col == label], in place."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ptr = logits_ptr + row * row_stride + cols
    x = tl.load(ptr, mask=cols < V, other=0.0).to(tl.float32)
    grad = tl.exp(x - tl.load(lse_ptr + row)) - tl.where(cols == tl.load(labels_ptr + row), 1.0, 0.0)
    tl.store(ptr, grad.to(logits_ptr.dtype.element_ty), mask=cols < V)


def cross_entropy_terms(
    logits: torch.Tensor, labels: torch.Tensor, need_grad: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """logits [r, V] (consumed: they become the gradient), labels [r] -> ce [r] fp32, argmax [r] int64,
    and d ce / d logits [r, V] in the logits' dtype (the logits' own storage), or None."""
    rows, vocab = logits.shape
    if logits.stride(1) != 1:
        raise ValueError("cross_entropy_terms needs rows of contiguous logits")
    lse = torch.empty(rows, device=logits.device, dtype=torch.float32)
    ce = torch.empty_like(lse)
    pred = torch.empty(rows, device=logits.device, dtype=torch.int32)
    cross_entropy_row_stats[(rows,)](logits, labels, lse, ce, pred, logits.stride(0), vocab, BLOCK=STATS_BLOCK,
                                     num_warps=STATS_WARPS)
    if not need_grad:
        return ce, pred.long(), None
    cross_entropy_softmax_minus_onehot[(rows, triton.cdiv(vocab, GRAD_BLOCK))](
        logits, labels, lse, logits.stride(0), vocab, BLOCK=GRAD_BLOCK, num_warps=GRAD_WARPS)
    return ce, pred.long(), logits
