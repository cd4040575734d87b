"""The modeling file an export carries, so `AutoModel.from_pretrained(DIR, trust_remote_code=True)`
(z-lab's documented loading path) builds this drafter instead of a plain Qwen3 with random weights.

Copied into the export as `modeling_dflash.py` beside `blockdraft_drafter.py` (a verbatim copy of
blockdraft/model/drafter.py), so the folder needs torch and transformers only, not blockdraft.
`forward` takes z-lab's arguments: raw concatenated target taps, the block's embeddings, and the
positions of the context then the block.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel, Qwen3Config

try:
    from .blockdraft_drafter import DFlashDrafter
except ImportError:  # imported from the blockdraft package itself
    from blockdraft.model.drafter import DFlashDrafter


class DFlashDraftModel(PreTrainedModel):
    config_class = Qwen3Config
    base_model_prefix = "drafter"

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__(config)
        drafter = DFlashDrafter(config)
        self.fc, self.hidden_norm, self.norm = drafter.fc, drafter.hidden_norm, drafter.norm
        self.layers, self.rotary_emb = drafter.layers, drafter.rotary_emb
        self._drafter = [drafter]  # a list: the modules above are registered once, under their serving names
        self.block_size = drafter.block_size
        self.mask_token_id = drafter.mask_token_id
        self.target_layer_ids = drafter.target_layer_ids
        self.post_init()

    def forward(
        self, position_ids: torch.Tensor, noise_embedding: torch.Tensor, target_hidden: torch.Tensor, **_unused
    ) -> torch.Tensor:
        """noise_embedding: [n, B, H] block embeddings (anchor, then mask tokens); target_hidden: [n, T, N*H]
        the target's taps of the context; position_ids: [n, T+B]. Returns hidden states [n, B, H]."""
        t = target_hidden.shape[1]
        drafter = self._drafter[0]
        ctx = drafter.fuse(target_hidden)
        return drafter(noise_embedding, position_ids[:, t:], ctx, position_ids[:, :t])
