"""Greedy speculative decoding of several prompts at once (and the target-only baseline, batched alike).

Ragged acceptance is handled with one shared cache layout and a per-row slot mask, not per-row caches:
every round each active row appends the same B slots to the target's KV cache (and the same slots of
context features to the drafter's cache); after verification a row's rejected slots are marked invalid
and hidden from all later attention, and the slots no row accepted are cropped at once. Positions are
per row (each row's true absolute positions), so a row's logits are those of its own unpadded sequence.
Why this design: the caches stay rectangular tensors that HF and SDPA take as they are, rows never
exchange or recompute tokens, and the bookkeeping is one bool tensor. The alternative, cropping every
row to the minimum acceptance and re-feeding what the others had accepted, makes the inputs ragged
instead of the caches. The cost is attention over masked slots: a shorter prompt's padding, and at
most B - 1 rejected slots per row per round.
Finished rows (EOS or max_new_tokens) leave the batch, so the batch only shrinks.
Every emitted token is still a target argmax at the row's true prefix: decoding stays lossless.
"""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import DynamicCache

from blockdraft.evaluate.speculative import Generation, _sync
from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.target import Target


def attention_mask(valid: torch.Tensor, q_len: int) -> torch.Tensor:
    """valid: [n, L] bool, whether each cache slot (the queries' own last q_len slots included) holds a
    real token. Returns [n, 1, q_len, L]: query i sees the valid slots up to and including its own."""
    total = valid.shape[1]
    causal = torch.ones(q_len, total, dtype=torch.bool, device=valid.device).tril(total - q_len)
    return valid[:, None, None, :] & causal


class _Rows:
    """The active rows' state: caches, slot validity, anchor positions, outputs."""

    def __init__(self, n: int) -> None:
        self.index = list(range(n))  # prompt index of each active row
        self.cache = DynamicCache()
        self.draft_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.valid = torch.zeros(n, 0, dtype=torch.bool)
        self.slot_pos = torch.zeros(n, 0, dtype=torch.long)  # absolute position of each cache slot
        self.start = torch.zeros(n, dtype=torch.long)  # absolute position of each row's anchor
        self.out: list[list[int]] = [[] for _ in range(n)]
        self.acceptance: list[list[int]] = [[] for _ in range(n)]

    def keep(self, rows: list[int]) -> None:
        """Keep only these active rows (positions in the current batch), in every cache."""
        sel = torch.tensor(rows, device=self.valid.device)
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[sel], layer.values[sel]
        self.draft_cache = [(k[sel], v[sel]) for k, v in self.draft_cache]
        self.valid, self.start, self.slot_pos = self.valid[sel], self.start[sel], self.slot_pos[sel]
        self.index = [self.index[r] for r in rows]


def _prefill(target: Target, prompts: list[list[int]], rows: _Rows, tap: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts right-padded (with token 0, never seen) in one pass; each row's last-token logits [n, V]."""
    device = target.embed_tokens.weight.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    width = int(lengths.max())
    ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p, device=device)
    positions = torch.arange(width, device=device).expand(len(prompts), width)
    rows.valid = positions < lengths[:, None]
    rows.slot_pos = positions
    rows.start = lengths.clone()
    logits, taps = _forward(target, ids, positions, _mask(target, rows, positions), rows.cache, tap)
    return logits[torch.arange(len(prompts), device=device), lengths - 1], taps


def _mask(target: Target, rows: _Rows, q_pos: torch.Tensor):
    """The mask of a pass whose queries are the last q_pos.shape[1] slots (sliding windows included)."""
    return target.layer_masks(attention_mask(rows.valid, q_pos.shape[1]), q_pos, rows.slot_pos)


def _forward(target: Target, ids, positions, mask, cache, tap: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One target pass with an explicit 4D mask (HF takes it as is). Returns logits and the taps
    (an empty tensor unless `tap`: the target-only baseline pays for no hooks)."""
    with target._tapping(stop_early=False) if tap else contextlib.nullcontext([]) as captured:
        out = target.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True
        )
    return out.logits, torch.cat(captured, dim=-1) if captured else out.logits.new_empty(0)


def _finish(rows: _Rows, max_new_tokens: int, eos_id: int | None) -> list[int]:
    """Trim finished outputs; the positions (in the batch) of the rows still decoding."""
    alive = []
    for r, i in enumerate(rows.index):
        out = rows.out[i]
        if eos_id is not None and eos_id in out:
            del out[out.index(eos_id) + 1 :]
        elif len(out) < max_new_tokens:
            alive.append(r)
        del out[max_new_tokens:]
    return alive


@torch.no_grad()
def speculative_greedy_batch(
    target: Target, drafter: DFlashDrafter, prompts: list[list[int]], max_new_tokens: int, eos_id: int | None
) -> list[Generation]:
    """Speculative greedy decoding of `prompts` together; one Generation per prompt, each given an
    equal share of the wall time so that sums over prompts stay the batch's time."""
    device = target.embed_tokens.weight.device
    dtype = next(drafter.parameters()).dtype
    block = drafter.block_size
    embed, lm_head = target.embed_tokens, target.lm_head
    offsets = torch.arange(block, device=device)
    _sync(device)
    t0 = time.perf_counter()

    rows = _Rows(len(prompts))
    logits, new_ctx = _prefill(target, prompts, rows, tap=True)
    anchors = logits.argmax(-1)
    for i, tok in enumerate(anchors.tolist()):
        rows.out[i].append(tok)
    ctx_positions = torch.arange(rows.valid.shape[1], device=device).expand_as(rows.valid)
    alive = _finish(rows, max_new_tokens, eos_id)
    while alive:
        if len(alive) < len(rows.index):
            rows.keep(alive)
            anchors, new_ctx, ctx_positions = anchors[alive], new_ctx[alive], ctx_positions[alive]
        n = len(alive)
        block_ids = torch.full((n, block), drafter.mask_token_id, device=device)
        block_ids[:, 0] = anchors
        positions = rows.start[:, None] + offsets
        sees = torch.cat([rows.valid, torch.ones(n, block, dtype=torch.bool, device=device)], dim=1)
        hidden = drafter(
            embed(block_ids).to(dtype), positions, drafter.fuse(new_ctx.to(dtype)), ctx_positions,
            mask=sees[:, None, None, :], cache=rows.draft_cache,
        )
        draft = lm_head(hidden[:, 1:].to(lm_head.weight.dtype)).argmax(-1)  # [n, B-1]
        block_ids[:, 1:] = draft
        rows.valid = torch.cat([rows.valid, torch.ones(n, block, dtype=torch.bool, device=device)], dim=1)
        rows.slot_pos = torch.cat([rows.slot_pos, positions], dim=1)
        logits, taps = _forward(target, block_ids, positions, _mask(target, rows, positions), rows.cache, True)
        verified = logits.argmax(-1)  # [n, B]
        accepted = (draft == verified[:, :-1]).to(torch.int64).cumprod(1).sum(1)  # [n]
        rows.valid[:, -block:] = offsets <= accepted[:, None]  # the anchor and the accepted drafts
        kept = int(accepted.max()) + 1
        if kept < block:  # slots no row accepted
            rows.cache.crop(-(block - kept))
            rows.valid = rows.valid[:, : rows.valid.shape[1] - block + kept]
            rows.slot_pos = rows.slot_pos[:, : rows.valid.shape[1]]
        for r, (a, row_draft, row_verified) in enumerate(zip(accepted.tolist(), draft.tolist(), verified.tolist(),
                                                             strict=True)):
            i = rows.index[r]
            rows.out[i] += row_draft[:a] + [row_verified[a]]
            rows.acceptance[i].append(a + 1)
        anchors = verified.gather(1, accepted[:, None])[:, 0]
        new_ctx, ctx_positions = taps[:, :kept], positions[:, :kept]
        rows.start = rows.start + accepted + 1
        alive = _finish(rows, max_new_tokens, eos_id)
    _sync(device)
    share = (time.perf_counter() - t0) / len(prompts)
    return [Generation(out, acc, share) for out, acc in zip(rows.out, rows.acceptance, strict=True)]


@torch.no_grad()
def target_greedy_batch(
    target: Target, prompts: list[list[int]], max_new_tokens: int, eos_id: int | None
) -> list[Generation]:
    """Target-only greedy decoding of `prompts` together: the baseline for batched speculative decoding."""
    device = target.embed_tokens.weight.device
    _sync(device)
    t0 = time.perf_counter()
    rows = _Rows(len(prompts))
    logits, _ = _prefill(target, prompts, rows, tap=False)
    tokens = logits.argmax(-1)
    for i, tok in enumerate(tokens.tolist()):
        rows.out[i].append(tok)
    alive = _finish(rows, max_new_tokens, eos_id)
    while alive:
        if len(alive) < len(rows.index):
            rows.keep(alive)
            tokens = tokens[alive]
        rows.valid = torch.cat([rows.valid, torch.ones(len(alive), 1, dtype=torch.bool, device=device)], dim=1)
        rows.slot_pos = torch.cat([rows.slot_pos, rows.start[:, None]], dim=1)
        mask = _mask(target, rows, rows.start[:, None])
        logits, _ = _forward(target, tokens[:, None], rows.start[:, None], mask, rows.cache, tap=False)
        tokens = logits[:, -1].argmax(-1)
        for r, tok in enumerate(tokens.tolist()):
            rows.out[rows.index[r]].append(tok)
        rows.start = rows.start + 1
        alive = _finish(rows, max_new_tokens, eos_id)
    _sync(device)
    share = (time.perf_counter() - t0) / len(prompts)
    return [Generation(out, seconds=share) for out in rows.out]
