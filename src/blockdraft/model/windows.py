"""Which of a target's decoder layers attend through a sliding window, and how far: one rule for the
decoding mask (`Target.layer_masks`) and the FLOPs count (`flops.Dims`)."""

from __future__ import annotations

from typing import Any


def sliding_windows(cfg: Any) -> tuple[int | None, ...]:
    """Per layer, its sliding window or None; () when every layer attends in full. With layer_types
    (Gemma 2 and 3, Qwen2/3) the "sliding_attention" layers slide; without (Mistral, Mixtral, Phi-3),
    every layer slides when sliding_window is set, as their HF models do."""
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return ()
    types = getattr(cfg, "layer_types", None) or ["sliding_attention"] * cfg.num_hidden_layers
    return tuple(window if t == "sliding_attention" else None for t in types)
