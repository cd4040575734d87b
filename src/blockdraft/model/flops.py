"""Model FLOPs of one update, from real (unpadded) lengths.

Conventions (the usual ones for MFU): a matmul of [m x k] by [k x n] is 2mkn; causal attention counts
the query-key pairs it computes: query i sees min(i + 1, w) keys in a layer with a sliding window of w,
i + 1 without one; a mixture-of-experts MLP counts the weights a token runs through: its
`num_experts_per_tok` routed experts, the shared experts and the router, not the experts it skips.
Training costs 3x the forward for trained layers (forward, input gradient, weight gradient), 2x for the
fc fusion (its input, the target's taps, needs no gradient) and 2x for the frozen lm_head (forward,
input gradient). The frozen target runs forward only, up to its last tap; it is counted layer by layer,
since a target's layers differ (dense and sparse MLPs: Qwen3-MoE, DeepSeek; sliding and full attention:
Gemma 2 and 3). The drafter is dense with full attention in every layer. Every attention layer counts as
q, k, v, o projections of head_dim: latent attention (DeepSeek-V2/V3) and linear attention (Qwen3-Next)
are not modelled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from blockdraft.model.windows import sliding_windows


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # the dense MLP's width (the config's intermediate_size, which the drafter takes)
    mlp_per_layer: tuple[int, ...] = ()  # per layer, the MLP weights one token runs through; () when all are dense
    window_per_layer: tuple[int | None, ...] = ()  # per layer, its sliding window (None: full); () when all are full

    @classmethod
    def of(cls, cfg) -> Dims:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, cfg.intermediate_size,
                   _mlp_weights(cfg), sliding_windows(cfg))

    @property
    def attention_params(self) -> int:
        """Weights of one layer's attention matmuls: q, k, v, o."""
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Weights of one dense decoder layer's matmuls: the attention and the MLP (the drafter's layer)."""
        return self.attention_params + _swiglu(self.hidden, self.intermediate)

    def mlp_weights(self, layers: int) -> tuple[int, ...]:
        """The MLP weights a token runs through in each of the first `layers` layers."""
        dense = (_swiglu(self.hidden, self.intermediate),) * layers
        return self.mlp_per_layer[:layers] if self.mlp_per_layer else dense


def _swiglu(hidden: int, width: int) -> int:
    """Weights of a SwiGLU MLP (gate, up, down) of this width."""
    return 3 * hidden * width


def _mlp_weights(cfg) -> tuple[int, ...]:
    """Per layer, the MLP weights one token runs through; () for a dense model. The expert count is
    num_local_experts (Mixtral, PhiMoE, GPT-OSS), num_experts (Qwen2/3-MoE, OLMoE) or n_routed_experts
    (DeepSeek, GLM-4.5); each expert is moe_intermediate_size wide, else intermediate_size (Mixtral, OLMoE).
    A layer is dense, intermediate_size wide, by mlp_layer_types, mlp_only_layers and decoder_sparse_step
    (Qwen), or first_k_dense_replace (DeepSeek). Qwen2-MoE's shared-expert gate (hidden x 1) is left out.
    Families that name these otherwise (Llama 4, Jamba, ERNIE-4.5-MoE, GraniteMoeShared) are not read."""
    experts = next((getattr(cfg, k) for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if getattr(cfg, k, None)), 0)
    if not experts or not getattr(cfg, "num_experts_per_tok", None):
        return ()
    h = cfg.hidden_size
    width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    shared = getattr(cfg, "shared_expert_intermediate_size", None) or (getattr(cfg, "n_shared_experts", 0) or 0) * width
    sparse = _swiglu(h, cfg.num_experts_per_tok * width + shared) + h * experts  # routed and shared experts, router
    dense = _swiglu(h, cfg.intermediate_size)
    types = getattr(cfg, "mlp_layer_types", None)
    only = set(getattr(cfg, "mlp_only_layers", None) or ())
    step, first = getattr(cfg, "decoder_sparse_step", None) or 1, getattr(cfg, "first_k_dense_replace", None) or 0

    def is_sparse(i: int) -> bool:
        if types:
            return types[i] != "dense"
        return i not in only and (i + 1) % step == 0 and i >= first

    return tuple(sparse if is_sparse(i) else dense for i in range(cfg.num_hidden_layers))


def _attended(n: int, window: int | None) -> int:
    """Query-key pairs of causal attention over n tokens: query i sees min(i + 1, window) keys."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def target_flops(lengths: list[int], dims: Dims, layers_run: int) -> float:
    """Forward of the frozen target over sequences of these real lengths, its first `layers_run` layers."""
    width = dims.heads * dims.head_dim
    weights = layers_run * dims.attention_params + sum(dims.mlp_weights(layers_run))
    windows = Counter(dims.window_per_layer[:layers_run] if dims.window_per_layer else (None,) * layers_run)
    pairs = sum(layers * _attended(n, w) for w, layers in windows.items() for n in lengths)
    return float(2 * weights * sum(lengths) + 4 * width * pairs)


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
