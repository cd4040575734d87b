"""Model FLOPs of one update, from real (unpadded) lengths.

Conventions (the usual ones for MFU): a matmul of [m x k] by [k x n] is 2mkn; causal attention counts
the half it computes; training costs 3x the forward for trained layers (forward, input gradient,
weight gradient), 2x for the fc fusion (its input, the target's taps, needs no gradient) and 2x for
the frozen lm_head (forward, input gradient). The frozen target runs forward only, up to its last tap.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @classmethod
    def of(cls, cfg) -> Dims:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, cfg.intermediate_size)

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's matmuls: q, k, v, o and the SwiGLU MLP."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return 2 * q + kv + 3 * self.hidden * self.intermediate


def target_flops(lengths: list[int], dims: Dims, layers_run: int) -> float:
    """Forward of the frozen target over sequences of these real lengths, `layers_run` layers."""
    width = dims.heads * dims.head_dim
    per_layer = sum(2 * dims.layer_params * n + 2 * width * n * (n + 1) for n in lengths)
    return float(per_layer * layers_run)


@dataclass(frozen=True)
class DraftWork:
    """What one micro-batch asks of the drafter."""

    context_tokens: int  # L
    blocks: int  # V
    context_seen: float  # sum over blocks of the context positions visible to it (its anchor position)
    labels: int  # R, rows reaching the lm_head


def drafter_flops(work: DraftWork, dims: Dims, layers: int, taps: int, block_size: int, vocab: int) -> float:
    """Forward + backward of the drafter (and the lm_head loss) for one micro-batch."""
    h, q = dims.hidden, work.blocks * block_size
    fc = 2 * work.context_tokens * taps * h * h
    context_kv = 2 * work.context_tokens * 2 * h * dims.kv_heads * dims.head_dim
    attention = 4 * dims.heads * dims.head_dim * block_size * (work.context_seen + q)
    layer = 2 * dims.layer_params * q + context_kv + attention
    lm_head = 2 * work.labels * h * vocab
    return float(2 * fc + 3 * layers * layer + 2 * lm_head)
