"""The frozen target: a local Hugging Face causal LM whose hidden states feed the drafter.

Only the tapped layers' outputs are kept (forward hooks), and when no target logits are needed the
forward runs only up to the last tapped layer: for a 36-layer target tapped at 33, three layers and
the lm_head are never computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from blockdraft.data.tokenize import load_tokenizer
from blockdraft.errors import UserError
from blockdraft.model.locate import locate_model

MASK_TOKEN_NAMES = ("<|MASK|>", "<|mask|>", "<mask>", "[MASK]")


def _dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def find_mask_token_id(tokenizer, vocab_rows: int, configured: int | None) -> int:
    """The mask token must be a real row of the target's embedding table (DFLASH.md)."""
    if configured is not None:
        token_id = configured
    elif tokenizer.mask_token_id is not None:
        token_id = tokenizer.mask_token_id
    else:
        vocab = tokenizer.get_vocab()
        token_id = next((vocab[name] for name in MASK_TOKEN_NAMES if name in vocab), None)
    if token_id is None:
        raise UserError(
            "the target's tokenizer has no mask token; add one and resize the embeddings: "
            "tok.add_special_tokens({'mask_token': '<|MASK|>'}); model.resize_token_embeddings(len(tok)); "
            "save both, or set drafter.mask_token_id to an unused row of the embedding table"
        )
    if not 0 <= token_id < vocab_rows:
        raise UserError(
            f"mask token id {token_id} is outside the target's embedding table ({vocab_rows} rows); "
            "resize the embeddings (model.resize_token_embeddings(len(tokenizer))) and save the target"
        )
    return token_id


class Target(nn.Module):
    """Wraps a frozen HF causal LM: tapped features for training, full forward for decoding."""

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        super().__init__()
        self.model = model
        self.layer_ids = sorted(layer_ids)
        self._compiled_forwards: dict[int, object] = {}
        n_layers = len(self.decoder_layers)
        if not self.layer_ids or self.layer_ids[-1] >= n_layers:
            raise UserError(f"target_layer_ids {layer_ids} out of range for a {n_layers}-layer target")

    @property
    def config(self):
        return self.model.config

    @property
    def backbone(self) -> nn.Module:
        return self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.backbone.layers

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def compile_features(self) -> None:
        """torch.compile the forward of each layer up to the last tap, for `features` only (decoding,
        with its KV cache, stays eager). The hooks stay outside the compiled code."""
        layers = self.decoder_layers
        self._compiled_forwards = {i: torch.compile(layers[i].forward) for i in range(self.layer_ids[-1] + 1)}

    @contextlib.contextmanager
    def _tapping(self, stop_early: bool, compiled: bool = False) -> Iterator[list[torch.Tensor]]:
        """Hooks that keep the tapped layers' outputs; optionally run only up to the last tap."""
        captured: list[torch.Tensor] = []
        backbone = self.backbone
        full = backbone.layers

        def keep(_module, _inputs, output):
            captured.append(output[0] if isinstance(output, tuple) else output)

        handles = [full[i].register_forward_hook(keep) for i in self.layer_ids]
        swapped = list(self._compiled_forwards.items()) if compiled else []
        for i, forward in swapped:
            full[i].forward = forward  # an instance attribute shadows the class's forward
        if stop_early:
            backbone.layers = full[: self.layer_ids[-1] + 1]
        try:
            yield captured
        finally:
            backbone.layers = full
            for i, _ in swapped:
                del full[i].forward
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def features(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, final_hidden: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids: [n, T] right-padded (causal attention never lets a real token see padding).
        Returns taps [n, T, N*H] and, if final_hidden, the final normed hidden state [n, T, H]
        (for target logits, computed by the caller in chunks)."""
        with self._tapping(stop_early=not final_hidden, compiled=True) as captured:
            out = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        taps = torch.cat(captured, dim=-1)
        return taps, (out.last_hidden_state if final_hidden else None)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoding forward with a KV cache: returns logits [n, L, V] and taps [n, L, N*H]."""
        with self._tapping(stop_early=False) as captured:
            out = self.model(input_ids=input_ids, position_ids=position_ids, past_key_values=cache, use_cache=True)
        return out.logits, torch.cat(captured, dim=-1)


def load_target(path: str | Path, layer_ids: list[int] | None, device: torch.device, dtype: str = "auto"):
    """Load model + tokenizer from a local folder; returns (Target | None, tokenizer, hf_config).

    With layer_ids None, only the tokenizer and config are loaded (for data work) and Target is None.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    path = locate_model(path)
    if not path.is_dir():
        raise UserError(f"target folder not found: {path}")
    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json: not a Hugging Face model folder")
    try:
        hf_config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{path}: cannot read config.json: {str(exc).splitlines()[0]}") from None
    architectures = getattr(hf_config, "architectures", None) or []
    if architectures and not any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in architectures):
        raise UserError(f"{path} is a {architectures[0]}, not a causal LM (…ForCausalLM)")
    tokenizer = load_tokenizer(str(path))
    if layer_ids is None:
        return None, tokenizer, hf_config
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=_dtype(dtype, device), attn_implementation="sdpa"
        )
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot load as a causal LM: {str(exc).splitlines()[0]}") from None
    model.requires_grad_(False).eval().to(device)
    return Target(model, layer_ids), tokenizer, hf_config

