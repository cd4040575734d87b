"""The frozen target: a local Hugging Face causal LM whose hidden states feed the drafter.

Only the tapped layers' outputs are kept (forward hooks), and when no target logits are needed the
forward runs only up to the last tapped layer: for a 36-layer target tapped at 33, three layers and
the lm_head are never computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from blockdraft.device import require_room
from blockdraft.errors import UserError, first_line
from blockdraft.model.locate import locate_model
from blockdraft.model.tokenizer import load_tokenizer
from blockdraft.model.windows import sliding_windows

MASK_TOKEN_NAMES = ("<|MASK|>", "<|mask|>", "<mask>", "[MASK]")


def target_dtype(name: str, device: torch.device) -> torch.dtype:
    """The target's weights: `auto` is bf16 on a GPU and fp32 on CPU, for every verb that loads or builds one."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _spare_special_tokens(tokenizer) -> list[tuple[int, str]]:
    """Special tokens no text, chat template or generation needs: candidates for the mask token.
    bos/eos/pad/unk and every token the chat template writes are excluded; names that say "unused",
    "reserved", "empty" or "mask" come first, then the highest id (special tokens added last are
    the least used)."""
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = getattr(tokenizer, "chat_template", None) or ""
    spare = [(i, t.content) for i, t in tokenizer.added_tokens_decoder.items()
             if t.special and i not in reserved and t.content not in template]
    hints = ("unused", "reserved", "empty", "mask")
    return sorted(spare, key=lambda it: (not any(h in it[1].lower() for h in hints), -it[0]))


def resolve_mask_token(tokenizer: Any | None, vocab_rows: int, tied_head: bool,
                       configured: int | None) -> tuple[int, str | None]:
    """The drafter's mask token: a real row of the target's embedding table (DFLASH.md), decided
    before any data is tokenised or weights are loaded. Returns (id, note): the note says what was
    chosen when the config did not say, for the log and the console. Without a tokenizer (a bench
    shape: random weights and random ids) any row marks the positions to draft: the last one."""
    if configured is not None and 0 <= configured < vocab_rows:
        return configured, None
    spare = [] if tokenizer is None else [(i, n) for i, n in _spare_special_tokens(tokenizer) if i < vocab_rows]
    if configured is not None:
        hint = (f"leave drafter.mask_token_id unset to use the tokenizer's mask token or a spare special token "
                f"(this one has e.g. id {spare[0][0]} {spare[0][1]!r})" if spare else
                "leave drafter.mask_token_id unset, or choose an id below the table size")
        raise UserError(
            f"drafter.mask_token_id={configured} is outside the target's embedding table ({vocab_rows} rows: "
            f"ids 0..{vocab_rows - 1}); an id from another model's recipe does not carry over; {hint}"
        )
    if tokenizer is None:
        return vocab_rows - 1, None
    token_id = tokenizer.mask_token_id
    if token_id is None:
        vocab = tokenizer.get_vocab()
        token_id = next((vocab[name] for name in MASK_TOKEN_NAMES if name in vocab), None)
    if token_id is not None and 0 <= token_id < vocab_rows:
        return token_id, None
    if spare:
        i, name = spare[0]
        return i, (f"the target has no mask token; the drafter uses id {i} {name!r}, a special token that no "
                   "text or chat template writes (its embedding row only marks the positions to draft); "
                   "set drafter.mask_token_id to choose another")
    if tied_head:
        advice = ("its head is tied to the embeddings, so adding a row changes the target's output; set "
                  "drafter.mask_token_id to a token that never occurs in your data")
    else:
        advice = ("add one and save the target: tok.add_special_tokens({'mask_token': '<|MASK|>'}); "
                  "model.resize_token_embeddings(len(tok)); or set drafter.mask_token_id to an unused row")
    raise UserError(f"the target's tokenizer has no mask token and no spare special token; {advice}")


SLOT_LAYERS = {"full_attention", "sliding_attention"}  # what the slot caches and layer_masks serve
# layers whose state every token updates: decoded on the model's own cache (evaluate/recurrent.py)
RECURRENT_LAYERS = {"linear_attention", "conv", "mamba", "hybrid", "hybrid_sliding"}
MLP_LAYERS = {"moe", "dense", "sparse"}  # names some configs give their MLP-only layers: no cache


def recurrent_layer_types(text_config: Any) -> list[str]:
    """The target's layer types that keep a recurrent state (none for a plain transformer)."""
    return sorted(set(getattr(text_config, "layer_types", None) or []) & RECURRENT_LAYERS)


def require_decodable(text_config: Any, what: str, tree: bool = False, sampled: bool = False) -> None:
    """Refuse, in one line naming `what` asked for decoding, what blockdraft's decoders do not do: layers
    of another attention kind (chunked, sparse), whose masks the slot layout does not build and which no
    test has run on the model's own cache; with recurrent layers, DDTree or sampled decoding."""
    types = set(getattr(text_config, "layer_types", None) or [])
    others = sorted(types - SLOT_LAYERS - RECURRENT_LAYERS - MLP_LAYERS)
    if others:
        raise UserError(f"{what}: this target has {', '.join(others)} layers, which blockdraft's speculative "
                        "decoding does not run; measure tau with vLLM or SGLang (docs/serving.md)")
    recurrent = recurrent_layer_types(text_config)
    if recurrent and (tree or sampled):
        asked = " and ".join(name for name, on in (("DDTree", tree), ("sampled decoding", sampled)) if on)
        raise UserError(f"{what}: this target has {', '.join(recurrent)} layers, which blockdraft decodes greedily "
                        f"on the single path only, without {asked}; measure those with vLLM or SGLang "
                        "(docs/serving.md)")


class Target(nn.Module):
    """Wraps a frozen HF causal LM: tapped features for training, full forward for decoding."""

    def __init__(self, model: nn.Module, layer_ids: list[int]) -> None:
        super().__init__()
        self.model = model
        self.layer_ids = sorted(layer_ids)
        self._compiled_forwards: dict[int, object] = {}
        # the cap of the final logits, cap * tanh(logits / cap) (Gemma 2); None when uncapped
        text_config = model.config.get_text_config()
        self.logit_softcap: float | None = getattr(text_config, "final_logit_softcapping", None) or None
        # the decoding mask's window, and whether only the layers typed "sliding_attention" take it (Gemma)
        # or every layer does (Mistral, Phi-3)
        windows = sliding_windows(text_config)
        self.sliding_window: int | None = next((w for w in windows if w), None)
        self.window_by_layer_type = bool(getattr(text_config, "layer_types", None))
        # decoded on the model's own cache, its states saved and put back (evaluate/recurrent.py), not in slots
        self.recurrent = bool(recurrent_layer_types(text_config))
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

    @property
    def embedding_scale(self) -> float:
        """What the embedding module multiplies its rows by (Gemma: sqrt(H)); 1 for most models."""
        scale = getattr(self.embed_tokens, "scalar_embed_scale", getattr(self.embed_tokens, "embed_scale", 1.0))
        return float(scale.item() if isinstance(scale, torch.Tensor) else scale)

    def layer_masks(
        self, visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """An explicit attention mask for the target, sliding windows included.
        visible: bool [n, 1, Q, K]; q_pos: [n, Q] and k_pos: [n, K] absolute positions of the queries
        and of the cache slots. HF takes a 4D mask as is, so a sliding window is applied here, hiding keys
        `sliding_window` or more back: in one mask per layer type where the layers' types differ (Gemma 3),
        in the one mask where every layer slides (Mistral)."""
        if self.sliding_window is None:
            return visible
        near = (q_pos[:, None, :, None] - k_pos[:, None, None, :]) < self.sliding_window
        if self.window_by_layer_type:
            return {"full_attention": visible, "sliding_attention": visible & near}
        return visible & near

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
    def features(self, input_ids: torch.Tensor, final_hidden: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids: [n, T] right-padded (causal attention never lets a real token see padding).
        Returns taps [n, T, N*H] and, if final_hidden, the final normed hidden state [n, T, H]
        (for target logits, computed by the caller in chunks)."""
        with self._tapping(stop_early=not final_hidden, compiled=True) as captured:
            out = self.backbone(input_ids=input_ids, use_cache=False)
        taps = torch.cat(captured, dim=-1)
        return taps, (out.last_hidden_state if final_hidden else None)

    @torch.no_grad()
    def step(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache, mask=None, tap: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decoding forward with a KV cache and an optional explicit mask (see `layer_masks`):
        returns logits [n, L, V] and, if `tap`, taps [n, L, N*H]."""
        with self._tapping(stop_early=False) if tap else contextlib.nullcontext([]) as captured:
            out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                             past_key_values=cache, use_cache=True)
        return out.logits, torch.cat(captured, dim=-1) if tap else None


class TargetFolder(NamedTuple):
    """A checked local model folder, its config and its tokenizer: what data work needs, before the weights."""

    path: Path
    config: Any  # the Hugging Face config (a multimodal one keeps the decoder's inside)
    tokenizer: Any


def open_target(path: str | Path) -> TargetFolder:
    """Check a local causal-LM folder and read its config and tokenizer (not its weights), so a bad
    dataset or prompt set fails before a large model loads."""
    from transformers import AutoConfig

    path = locate_model(path)  # a folder, or a user error
    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json: not a Hugging Face model folder")
    try:
        hf_config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{path}: cannot read config.json: {first_line(exc)}") from None
    architectures = getattr(hf_config, "architectures", None) or []
    if architectures and not any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in architectures):
        raise UserError(f"{path} is a {architectures[0]}, not a causal LM (…ForCausalLM)")
    return TargetFolder(path, hf_config, load_tokenizer(str(path)))


def weight_bytes(hf_config: Any, dtype: torch.dtype) -> int | None:
    """The bytes of a causal LM's weights for this config in this dtype, counted on the meta device (no
    memory, a fraction of a second for an 8B config); None where transformers cannot build it from the
    config alone (loading then says why)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    except (ValueError, KeyError, TypeError, ImportError):
        return None
    return sum(p.numel() * p.element_size() for p in model.parameters())


def require_room_for_weights(hf_config: Any, dtype: torch.dtype, device: torch.device, name: str,
                             remedy: str = "free memory, or use a machine with more") -> None:
    """Refuse in one line a model (`name`) whose weights exceed the free memory of the device they are for.
    The host's memory is not checked for a GPU: `from_pretrained` reads safetensors files memory-mapped,
    so a host with less free memory than the weights may still load them."""
    need = weight_bytes(hf_config, dtype)
    if need is not None:
        require_room(need, device, f"{name}'s weights in {str(dtype).removeprefix('torch.')}", remedy)


def load_target(folder: str | Path | TargetFolder, layer_ids: list[int], device: torch.device,
                dtype: str = "auto") -> tuple[Target, Any, Any]:
    """The frozen target tapped at layer_ids, from a folder (`open_target`'s, or a path to open);
    returns (Target, tokenizer, hf_config)."""
    from transformers import AutoModelForCausalLM

    if not isinstance(folder, TargetFolder):
        folder = open_target(folder)
    weights_dtype = target_dtype(dtype, device)
    require_room_for_weights(folder.config, weights_dtype, device, folder.path.name)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder.path), dtype=weights_dtype, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise UserError(f"{folder.path}: cannot load as a causal LM: {first_line(exc)}") from None
    model.requires_grad_(False).eval().to(device)
    return Target(model, layer_ids), folder.tokenizer, folder.config

