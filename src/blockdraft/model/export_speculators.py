"""The speculators format (vLLM project's `speculators` 0.9): what `vllm serve DIR` serves bare.

config.json is the one speculators 0.9 writes for a DFlash drafter (`speculators_config`, checked
against speculators 0.9.0's DFlashSpeculatorConfig and DFlashDraftModel.save_pretrained).
aux_hidden_state_layer_ids are our target_layer_ids + 1 (speculators counts the embedding output as
0; vLLM maps them back with -1). sliding_window_non_causal must be true: vLLM turns false into a global
causal override for every draft layer, and our layers are all bidirectional.
model.safetensors: the same unprefixed names as the dflash format (layers.N..., fc, hidden_norm,
norm); speculators omits embed_tokens and lm_head for a full-vocabulary drafter (taken from the
verifier), and so do we.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from blockdraft.errors import UserError
from blockdraft.model.export import config_from_dict, top_level_rope_theta, write_export
from blockdraft.model.locate import locate_model

SPECULATORS_VERSION = "0.9.0"  # the format written; what its config class and vLLM's reader accept
# our drafter config keys that are not the transformer layer's (speculators' converter drops the same)
_NOT_LAYER_KEYS = {"architectures", "auto_map", "block_size", "dflash_config", "num_target_layers", "dtype"}


def verifier_of(checkpoint: Path, verifier: str | None) -> tuple[str, list[str]]:
    """The target as the export names it (`verifier` or the run's target.path) and its architectures,
    read from its config.json when it can be found locally (else [])."""
    name = verifier
    if name is None:
        try:
            name = json.loads((checkpoint / "trainer.json").read_text())["config"]["target"]["path"]
        except (OSError, KeyError, TypeError, json.JSONDecodeError):
            raise UserError(f"{checkpoint}: no target recorded; pass --verifier ID_OR_PATH") from None
    archs: list[str] = []
    with contextlib.suppress(UserError, OSError, json.JSONDecodeError):
        archs = json.loads((locate_model(name) / "config.json").read_text()).get("architectures") or []
    return str(name), list(archs)


def speculators_config(drafter_config: dict, verifier: str, verifier_archs: list[str], dtype: torch.dtype) -> dict:
    """config.json for the speculators format, from a drafter config (the dflash format's dict)."""
    dflash = drafter_config["dflash_config"]
    block_size = int(drafter_config["block_size"])
    layer = config_from_dict({k: v for k, v in drafter_config.items() if k not in _NOT_LAYER_KEYS})
    layer_dict = layer.to_diff_dict()
    layer_dict.pop("transformers_version", None)
    layer_dict["model_type"] = "qwen3"
    for key in ("num_hidden_layers", "layer_types", "hidden_size", "vocab_size", "head_dim"):
        layer_dict[key] = getattr(layer, key)  # explicit, whatever the diff against defaults drops
    return {
        "architectures": ["DFlashDraftModel"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": block_size - 1,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_archs},
        },
        "transformer_layer_config": top_level_rope_theta(layer_dict),
        "draft_vocab_size": int(layer.vocab_size),
        "block_size": block_size,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [int(i) + 1 for i in dflash["target_layer_ids"]],
        "mask_token_id": int(dflash["mask_token_id"]),
        "sample_from_anchor": False,
        "sliding_window_non_causal": True,
        "tie_word_embeddings": False,
        "dtype": str(dtype).removeprefix("torch."),
    }


def unsaid(drafter_config: dict) -> str | None:
    """What this drafter needs that the speculators format has no field for, as one warning line; None
    when nothing is lost (the dflash format records all of it)."""
    scale = float(drafter_config["dflash_config"].get("input_embedding_scale", 1.0))
    if scale == 1.0:
        return None
    return (f"the speculators format has no field for input_embedding_scale ({scale:g}: the target scales its "
            "embeddings, as Gemma does), so an engine reading this folder cannot learn it; the dflash format "
            "records it (docs/serving.md)")


def save_speculators(
    state: dict[str, torch.Tensor], drafter_config: dict, out_dir: Path, dtype: torch.dtype,
    verifier: str, verifier_archs: list[str],
) -> Path:
    """Write config.json + model.safetensors (mode 0644) in the speculators format."""
    return write_export(out_dir, speculators_config(drafter_config, verifier, verifier_archs, dtype), state, dtype)
