"""The DFlash drafter: a small non-causal Qwen3-style transformer that drafts a block of B tokens
in one pass, conditioned on hidden states tapped from the frozen target.

Shapes used throughout:
  n  sequences, T context length, A anchors (blocks) per sequence, B block size, Q = A*B,
  H  hidden size (= the target's), N taps, nh query heads, nkv key/value heads, hd head dim.

The drafter owns no embedding table and no lm_head: it borrows the target's (frozen, not saved).
Parameter names match the serving format (fc, hidden_norm, layers.i.self_attn.q_proj, ..., norm).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.utils.checkpoint import checkpoint
from transformers import Qwen3Config
from transformers.modeling_rope_utils import dynamic_rope_update
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half


@functools.cache
def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """One compiled flex_attention for every eager caller (a new wrapper per call would recompile)."""
    return torch.compile(flex_attention)


def flex_attention_fn(compiled: bool) -> Callable[..., torch.Tensor]:
    """flex_attention only becomes a fused kernel under torch.compile (eager it materialises scores:
    on CPU, for tests only). Inside a compiled graph the plain op is traced: dynamo would warn on the
    cache wrapper."""
    if compiled and not torch.compiler.is_compiling():
        return compiled_flex_attention()
    return flex_attention


def flex_kernel_options(mask: BlockMask, q_len: int, kv_len: int, backend: str = "TRITON") -> dict[str, object]:
    """FLASH: FlashAttention-4's kernels. TRITON: whole tiles of the mask on both sides (shape classes pad
    every compiled pass so) let the kernels skip their bounds checks. Inductor proves that only for static
    sizes; after the first block class dynamo compiles the drafter with symbolic ones, whose kernels would
    otherwise check every load."""
    if backend == "FLASH":
        return {"BACKEND": "FLASH"}
    q_tile, kv_tile = mask.BLOCK_SIZE
    return {"IS_DIVISIBLE": True} if q_len % q_tile == 0 and kv_len % kv_tile == 0 else {}


class Float32RotaryEmbedding(Qwen3RotaryEmbedding):
    """transformers' cos/sin tables (its frequencies, scaling and dynamic updates) with the angles formed by
    broadcasting, not its float32 matmul: under `set_float32_matmul_precision('high')` that matmul may run
    in TF32, which rounds positions above 2,048 (transformers#48428); it is also what prompts Inductor's
    TF32 hint on the GPU."""

    @torch.no_grad()
    @dynamic_rope_update
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: gives the tables' dtype; position_ids: [n, L] -> cos, sin: [n, L, hd]."""
        freqs = position_ids[..., None].float() * self.inv_freq.float()  # [n, L, hd/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [n, L, hd]
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [n, heads, L, hd]; cos/sin: [n, L, hd]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class DraftAttention(nn.Module):
    """Queries from block tokens; keys/values from [context features | block tokens] (KV injection)."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=cfg.attention_bias)
        self.q_norm = Qwen3RMSNorm(self.hd, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.hd, eps=cfg.rms_norm_eps)
        self.flex_backend = "TRITON"  # flex attention's kernels (DFlashDrafter.use_flex_backend)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [n, L, H] fused context features or block tokens -> K, V: [n, nkv, L, hd] (k_norm and
        RoPE applied)."""
        n, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(n, t, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(n, t, self.nkv, self.hd).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        ctx_kv: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | object | None,
    ) -> torch.Tensor:
        """x: [n, Q, H] block tokens; ctx_kv: K, V [n, nkv, T, hd]; mask: dense [n,1,Q,T+Q],
        a flex BlockMask, or None (everything visible: inference)."""
        n, q_len, _ = x.shape
        cos, sin = rope
        q = self.q_norm(self.q_proj(x).view(n, q_len, self.nh, self.hd)).transpose(1, 2)  # [n, nh, Q, hd]
        q = apply_rope(q, cos, sin)
        k, v = self.kv(x, cos, sin)  # [n, nkv, Q, hd]
        k = torch.cat([ctx_kv[0], k], dim=2)  # [n, nkv, T+Q, hd]
        v = torch.cat([ctx_kv[1], v], dim=2)
        if mask is None or isinstance(mask, torch.Tensor):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.nh != self.nkv)
        else:
            options = flex_kernel_options(mask, q_len, k.shape[2], self.flex_backend)
            out = flex_attention_fn(q.is_cuda)(q, k, v, block_mask=mask, enable_gqa=self.nh != self.nkv,
                                               kernel_options=options)
        return self.o_proj(out.transpose(1, 2).reshape(n, q_len, self.nh * self.hd))


class DraftLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = Qwen3MLP(cfg)  # SwiGLU (the config's hidden_act, silu)

    def forward(self, x, rope, ctx_kv, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, ctx_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """cfg is the drafter's Qwen3Config (see `drafter_config`): num_hidden_layers = drafter layers,
    plus block_size, num_target_layers and dflash_config {mask_token_id, target_layer_ids}."""

    def __init__(self, cfg: Qwen3Config) -> None:
        super().__init__()
        self.config = cfg
        self.block_size: int = cfg.block_size
        self.target_layer_ids: list[int] = list(cfg.dflash_config["target_layer_ids"])
        self.mask_token_id: int = cfg.dflash_config["mask_token_id"]
        h = cfg.hidden_size
        self.fc = nn.Linear(len(self.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = Qwen3RMSNorm(h, eps=cfg.rms_norm_eps)
        self.rotary_emb = Float32RotaryEmbedding(cfg)
        self.checkpoint_layers = False  # activation checkpointing, for long contexts
        self.reset_parameters()

    def use_flex_backend(self, backend: str) -> None:
        """TRITON (torch's kernels) or FLASH (FlashAttention-4's: flash-attn-4 installed, Hopper or newer)."""
        for layer in self.layers:
            layer.self_attn.flex_backend = backend

    def reset_parameters(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, Qwen3RMSNorm):
                nn.init.ones_(module.weight)

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """taps: [n, T, N*H] concatenated target hidden states -> context features [n, T, H]."""
        return self.hidden_norm(self.fc(taps))

    def forward(
        self,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        ctx: torch.Tensor,
        ctx_positions: torch.Tensor,
        mask: torch.Tensor | object | None = None,
        cache: object | None = None,
    ) -> torch.Tensor:
        """block_embeds: [n, Q, H] embeddings of the block tokens (anchor, then mask tokens);
        block_positions: [n, Q]; ctx: [n, T, H] fused context features; ctx_positions: [n, T].
        Training passes all context and a mask. Decoding passes only the NEW context features and
        a `cache` of context K/V (evaluate/static.py: DraftSlots) whose `write(i, k, v)` stores them
        and returns every slot's, [n, nkv, S, hd]; the mask [n, 1, Q, S+Q] then says which hold context.
        Returns final hidden states [n, Q, H] (apply the target's lm_head for logits)."""
        x = block_embeds
        rope_q = self.rotary_emb(x, block_positions)  # cos, sin: [n, Q, hd]
        rope_ctx = self.rotary_emb(x, ctx_positions)  # cos, sin: [n, T, hd]
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, *rope_ctx)  # [n, nkv, T, hd]
            if cache is not None:
                k, v = cache.write(i, k, v)  # [n, nkv, S, hd]
            if self.checkpoint_layers and torch.is_grad_enabled():
                x = checkpoint(layer, x, rope_q, (k, v), mask, use_reentrant=False)
            else:
                x = layer(x, rope_q, (k, v), mask)
        return self.norm(x)


@torch.no_grad()
def init_from_target(drafter: DFlashDrafter, target_layers: nn.ModuleList, target_norm: nn.Module) -> None:
    """Copy the target's last decoder layers (and final norm) into the drafter: same shapes, same
    parameter names, so the drafter starts with the target's language ability instead of noise."""
    first = len(target_layers) - len(drafter.layers)
    for i, layer in enumerate(drafter.layers):
        src = target_layers[first + i].state_dict()
        layer.load_state_dict({k: v.to(torch.float32) for k, v in src.items()}, strict=True)
    drafter.norm.load_state_dict({k: v.to(torch.float32) for k, v in target_norm.state_dict().items()})


def drafter_config(
    target_cfg: Qwen3Config | object,
    num_layers: int,
    block_size: int,
    target_layer_ids: list[int],
    mask_token_id: int,
    intermediate_size: int | None = None,
    embedding_scale: float = 1.0,
) -> Qwen3Config:
    """A fresh Qwen3Config for the drafter, taking only the fields it shares with the target.

    Built field by field (not copied wholesale) so nothing of the target's depth leaks in: serving
    code validates e.g. that `layer_types` has exactly one entry per drafter layer.
    """
    t = target_cfg
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    rope = getattr(t, "rope_parameters", None)
    if rope and "full_attention" in rope:  # per layer type (Gemma 3): the drafter's layers are all full
        rope = rope["full_attention"]
    if rope:  # the drafter rotates whole heads, whatever share of each head the target rotates (Phi-3, GLM)
        rope = {k: v for k, v in rope.items() if k != "partial_rotary_factor"}
    cfg = Qwen3Config(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=intermediate_size or t.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=getattr(t, "rms_norm_eps", 1e-6),
        rope_parameters=dict(rope) if rope else None,
        attention_bias=False,
        tie_word_embeddings=False,
        layer_types=["full_attention"] * num_layers,
        architectures=["DFlashDraftModel"],
    )
    cfg.block_size = block_size
    cfg.num_target_layers = t.num_hidden_layers
    cfg.dflash_config = {
        "mask_token_id": mask_token_id,
        "target_layer_ids": list(target_layer_ids),
        # the target's embedding module scales its rows (Gemma: sqrt(H)); readers that take the raw table
        # (z-lab's reference) multiply by this to feed the drafter what it trained on
        "input_embedding_scale": float(embedding_scale),
        # each tap is a decoder layer's own output, before the model's final norm (what vLLM reads; a
        # tap on the last layer read after the norm, as hidden_states[-1] is, is another input)
        "target_hidden_states": "decoder_layer_output",
    }
    return cfg
