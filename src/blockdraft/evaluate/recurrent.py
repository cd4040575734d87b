"""Greedy speculative decoding, and its target-only baseline, for targets with recurrent layers
(linear attention, Mamba, short convolutions): one prompt at a time, eagerly, on the model's own cache.

A recurrent layer keeps one state per sequence, and every token it reads goes into it. A draft token
the target rejects has gone in too, and no attention mask can hide it afterwards, as the slot layout
hides a rejected token's keys (evaluate/speculative.py). So a round saves the cache before verifying
[anchor, drafts], and when a draft is rejected puts it back and runs the accepted tokens again. Saving
clones only the recurrent states, a fixed size per layer; attention keys and values are kept by
reference, since an update replaces them instead of writing into them. Outputs and tau are those of the
slot decoders; the speedup pays that second pass, which serving engines avoid by keeping a state per
draft position (vLLM, SGLang).
"""

from __future__ import annotations

import copy

import torch
from transformers.cache_utils import DynamicCache

from blockdraft.evaluate.speculative import Generation, device_clock, draft_pass, finished, trim_to_eos
from blockdraft.evaluate.static import DraftSlots
from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.target import Target


def save_layers(cache: DynamicCache) -> list:
    """A copy of `cache.layers` that running the target on `cache` leaves as it is: each layer copied
    shallowly, the tensors in its dicts (conv and recurrent states, which updates write in place) cloned.
    `cache.layers[:] = saved` puts the cache back."""
    saved = []
    for layer in cache.layers:
        twin = copy.copy(layer)
        for name, value in vars(layer).items():
            if isinstance(value, dict):
                setattr(twin, name, {k: v.clone() if torch.is_tensor(v) else v for k, v in value.items()})
        saved.append(twin)
    return saved


def _positions(start: int, count: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, start + count, device=device)[None]  # [1, count]


class RecurrentTargetDecoder:
    """Greedy target-only decoding, one token a step on the model's own cache: the baseline."""

    def __init__(self, target: Target) -> None:
        self.target, self.device = target, target.embed_tokens.weight.device

    @torch.no_grad()
    def decode(self, prompts: list[list[int]], max_new_tokens: int, eos_id: int | None) -> list[Generation]:
        return [self._one(p, max_new_tokens, eos_id) for p in prompts]

    def _one(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Generation:
        target, device = self.target, self.device
        t0 = device_clock(device)
        cache = DynamicCache(config=target.config)
        ids = torch.tensor([prompt], device=device)  # [1, P]
        logits, _ = target.step(ids, _positions(0, len(prompt), device), cache, tap=False)
        out: list[int] = []
        while True:
            token = logits[:, -1].argmax(-1)  # [1]
            out.append(int(token))
            if finished(out, max_new_tokens, eos_id):
                break
            position = _positions(len(prompt) + len(out) - 1, 1, device)
            logits, _ = target.step(token[:, None], position, cache, tap=False)
        return Generation(trim_to_eos(out, max_new_tokens, eos_id), seconds=device_clock(device) - t0)


class RecurrentSpeculativeDecoder:
    """Greedy speculative decoding on the model's own cache, saved before each verification and put
    back when a draft is rejected. The drafter keeps its context K/V in slots (one per position) for
    prompts of up to `max_prompt` tokens and `max_new_tokens` each."""

    def __init__(self, target: Target, drafter: DFlashDrafter, max_prompt: int, max_new_tokens: int) -> None:
        self.target, self.drafter = target, drafter
        self.device = device = target.embed_tokens.weight.device
        block = drafter.block_size
        slots = max_prompt + max_new_tokens + block
        self.draft_cache = DraftSlots(drafter, 1, slots, device)
        self.slot_index = torch.arange(slots, device=device)
        self.masks = torch.full((1, block - 1), drafter.mask_token_id, device=device)

    def draft(self, anchor: torch.Tensor, block_pos: torch.Tensor, taps: torch.Tensor,
              ctx_pos: torch.Tensor) -> torch.Tensor:
        """The drafts [1, B-1] after `anchor` [1] at `block_pos` [1, B], once the features `taps` [1, C, N*H]
        of the newly committed tokens (at `ctx_pos` [1, C]) are stored: the drafter sees every committed
        token, the positions below the anchor's."""
        self.draft_cache.write_at = ctx_pos[0]  # a position's features live in the slot of that number
        sees = self.slot_index[None] < block_pos[:, :1]  # [1, S]
        block_ids = torch.cat([anchor[:, None], self.masks], dim=1)
        hidden = draft_pass(self.target, self.drafter, self.draft_cache, block_ids, block_pos, taps, ctx_pos, sees)
        lm_head = self.target.lm_head
        return lm_head(hidden[:, 1:].to(lm_head.weight.dtype)).argmax(-1)

    @torch.no_grad()
    def decode(self, prompts: list[list[int]], max_new_tokens: int, eos_id: int | None) -> list[Generation]:
        return [self._one(p, max_new_tokens, eos_id) for p in prompts]

    def _one(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Generation:
        target, device, block = self.target, self.device, self.drafter.block_size
        t0 = device_clock(device)
        cache = DynamicCache(config=target.config)
        ctx_pos = _positions(0, len(prompt), device)  # [1, P]
        logits, taps = target.step(torch.tensor([prompt], device=device), ctx_pos, cache, tap=True)
        anchor = logits[:, -1].argmax(-1)  # [1]
        out, acceptance = [int(anchor)], []
        while not finished(out, max_new_tokens, eos_id):
            block_pos = _positions(len(prompt) + len(out) - 1, block, device)  # the anchor's, then the drafts'
            drafts = self.draft(anchor, block_pos, taps, ctx_pos)  # [1, B-1]
            block_ids = torch.cat([anchor[:, None], drafts], dim=1)  # [1, B]
            before = save_layers(cache)
            logits, taps = target.step(block_ids, block_pos, cache, tap=True)
            verified = logits.argmax(-1)  # [1, B]: the target's token after each prefix of the block
            accepted = int((drafts == verified[:, :-1]).to(torch.int64).cumprod(1).sum())
            if accepted < block - 1:  # the state took in rejected drafts: back to before, then the kept tokens
                cache.layers[:] = before
                target.step(block_ids[:, : accepted + 1], block_pos[:, : accepted + 1], cache, tap=False)
            out += drafts[0, :accepted].tolist() + [int(verified[0, accepted])]
            acceptance.append(accepted + 1)
            taps, ctx_pos = taps[:, : accepted + 1], block_pos[:, : accepted + 1]
            anchor = verified[:, accepted]
        return Generation(trim_to_eos(out, max_new_tokens, eos_id), acceptance, device_clock(device) - t0)
