"""Greedy speculative decoding with a DFlash drafter, several prompts at once (one prompt is the
single path), and the target-only baseline decoded alike: the measured acceptance length (tau).

One round: the drafter sees the context features of every committed token (its own K/V cache of
them) and drafts B-1 tokens after each row's anchor (its last committed token) in one pass; the
target verifies [anchor, drafts] in one pass with its KV cache; the longest prefix of drafts equal to
the target's argmax is accepted, plus the target's next token as the bonus. tau = accepted + 1.
Every emitted token is a target argmax at the row's true prefix, so the output equals target-only
greedy decoding.

Rows share one slot layout (evaluate/static.py): each round writes the same B slots for every row,
a row's rejected slots are marked invalid in `valid` and hidden from all later attention, and the
slots no row accepted are written again next round. Positions are per row, so a row's logits are
those of its own unpadded sequence. Why: the caches stay fixed-shape tensors (each step one CUDA
graph), rows never exchange or recompute tokens, and the bookkeeping is one bool tensor; the cost is
attention over masked slots. A row that finishes (EOS or max_new_tokens) stays in the batch, frozen,
so no shape changes; a short last batch is padded with copies of its last prompt.
Sweeps over prompts and modes live in `evaluate/runner.py`; targets with recurrent layers, whose state
no mask can hide a rejected token from, decode in `evaluate/recurrent.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.nn.utils.rnn import pad_sequence

from blockdraft.evaluate.static import DraftSlots, Graphs, SlotCache
from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.target import Target


@dataclass
class Generation:
    tokens: list[int]
    acceptance: list[int] = field(default_factory=list)  # tau of each round (speculative only)
    seconds: float = 0.0

    @property
    def tau(self) -> float:
        return sum(self.acceptance) / len(self.acceptance) if self.acceptance else 0.0


class Layout:
    """Rows decoded together: the target's (and the drafter's) caches in one slot layout, which
    slots hold each row's tokens (`valid` [n, S]) and at which position (`slot_pos` [n, S])."""

    def __init__(self, target: Target, drafter: DFlashDrafter | None, n: int, slots: int) -> None:
        device = target.embed_tokens.weight.device
        self.n, self.slots = n, slots
        self.cache = SlotCache(target.config, n, slots, target.embed_tokens.weight.dtype, device)
        self.draft = DraftSlots(drafter, n, slots, device) if drafter is not None else None
        self.valid = torch.zeros(n, slots, dtype=torch.bool, device=device)
        self.slot_pos = torch.zeros(n, slots, dtype=torch.long, device=device)
        self.slot_index = torch.arange(slots, device=device)
        self.bounds = torch.arange(slots + 1, device=device)  # a slot count as a [1] tensor: bounds[k : k + 1]
        self.length = 0  # slots in use: the next write starts here

    def target_step(self, target: Target, tap: bool):
        """The target's pass over queries written at slots `write_at` [q] (ids, positions: [n, q]):
        each query sees the valid slots up to its own. Returns logits [n, q, V] and taps."""

        def step(ids: torch.Tensor, positions: torch.Tensor, write_at: torch.Tensor):
            self.cache.write_at = write_at
            self.valid.index_fill_(1, write_at, True)
            self.slot_pos.index_copy_(1, write_at, positions)
            visible = self.valid[:, None, None, :] & (self.slot_index <= write_at[:, None])  # [n, 1, q, S]
            return target.step(ids, positions, self.cache, target.layer_masks(visible, positions, self.slot_pos), tap)

        return step

    def draft_step(self, target: Target, drafter: DFlashDrafter):
        """The drafter's pass over blocks [n, B] at `block_pos`, after storing the new context
        features `taps` [n, C, N*H] (positions `ctx_pos` [n, C]) at slots `ctx_at` [C]; it sees the
        valid context slots below `ctx_limit` [1]. Returns hidden states [n, B, H]."""

        def step(block_ids, block_pos, taps, ctx_pos, ctx_at, ctx_limit):
            self.draft.write_at = ctx_at
            sees = self.valid & (self.slot_index < ctx_limit)  # [n, S]: the row's committed tokens
            return draft_pass(target, drafter, self.draft, block_ids, block_pos, taps, ctx_pos, sees)

        return step

    def compact(self) -> None:
        """Move each row's valid slots to the front, in order, in both caches: the holes its rejected
        drafts left are dropped, and the shared length becomes the longest row's count."""
        used = self.valid[:, : self.length]
        count = int(used.sum(1).max())
        keep = torch.sort((~used).to(torch.int8), dim=1, stable=True).indices[:, :count]  # [n, count]
        for cache in (self.cache, self.draft) if self.draft is not None else (self.cache,):
            for buf in (cache.keys, cache.values):  # [layers, n, kv_heads, S, head_dim]
                layers, n, kv, _, hd = buf.shape
                buf[:, :, :, :count] = buf.gather(3, keep[None, :, None, :, None].expand(layers, n, kv, count, hd))
        self.slot_pos[:, :count] = self.slot_pos.gather(1, keep)
        self.valid[:, :count] = used.gather(1, keep)
        self.valid[:, count : self.length] = False
        self.length = count

    def prefill(self, target: Target, prompts: list[list[int]], tap: bool):
        """The prompts (a short batch filled up with copies of its last) right-padded (token 0, never
        seen) in one eager pass. Returns each row's last-token logits [n, V], the taps [n, P, N*H],
        their positions [n, P] and the lengths [n]."""
        device = self.valid.device
        prompts = prompts + [prompts[-1]] * (self.n - len(prompts))
        self.valid.zero_()
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        ids = pad_sequence([torch.tensor(p, dtype=torch.long) for p in prompts], batch_first=True).to(device)  # [n, P]
        width = ids.shape[1]
        positions = torch.arange(width, device=device).expand(self.n, width)
        logits, taps = self.target_step(target, tap)(ids, positions, self.slot_index[:width])
        self.valid[:, :width] = positions < lengths[:, None]
        self.length = width
        return logits[torch.arange(self.n, device=device), lengths - 1], taps, positions, lengths


def draft_pass(target: Target, drafter: DFlashDrafter, cache: DraftSlots, block_ids: torch.Tensor,
               block_pos: torch.Tensor, taps: torch.Tensor, ctx_pos: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
    """The drafter's pass over blocks [n, B] (at `block_pos`) after storing the new context features
    `taps` [n, C, N*H] (positions `ctx_pos` [n, C]) in `cache` at its `write_at`; each row sees its
    context slots where `sees` [n, S] is true, and its whole block. Returns hidden states [n, B, H]."""
    dtype = next(drafter.parameters()).dtype
    sees = torch.cat([sees, sees.new_ones(block_ids.shape)], dim=1)[:, None, None, :]  # [n, 1, 1, S + B]
    return drafter(target.embed_tokens(block_ids).to(dtype), block_pos, drafter.fuse(taps.to(dtype)), ctx_pos,
                   mask=sees, cache=cache)


def device_clock(device: torch.device) -> float:
    """The time now, once the device has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def next_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """logits: [L, V] -> one token per row, [L]: argmax at temperature 0, a sample from softmax(logits / T)
    above (why sampled decoding stays lossless: evaluate/ddtree.py)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def finished(out: list[int], max_new_tokens: int, eos_id: int | None) -> bool:
    """Whether a row's output has its `max_new_tokens` or holds EOS."""
    return len(out) >= max_new_tokens or (eos_id is not None and eos_id in out)


def trim_to_eos(out: list[int], max_new_tokens: int, eos_id: int | None) -> list[int]:
    if eos_id is not None and eos_id in out:
        out = out[: out.index(eos_id) + 1]
    return out[:max_new_tokens]


class Decoder:
    """What every decoder allocates once: the slot layout of `n` rows, its captured steps and, with a
    drafter, its drafting step."""

    def __init__(self, target: Target, drafter: DFlashDrafter | None, n: int, slots: int, cuda_graphs: bool) -> None:
        self.target, self.drafter, self.n = target, drafter, n
        self.device = target.embed_tokens.weight.device
        self.layout = Layout(target, drafter, n, slots)
        self.graphs = Graphs(self.device, enabled=cuda_graphs)
        if drafter is not None:
            self.draft = self.layout.draft_step(target, drafter)
            self.masks = torch.full((n, drafter.block_size - 1), drafter.mask_token_id, device=self.device)

    def clock(self) -> float:
        return device_clock(self.device)

    def draft_logits(self, anchors: torch.Tensor, block_pos: torch.Tensor, taps: torch.Tensor, ctx_pos: torch.Tensor,
                     ctx_at: torch.Tensor, first: bool) -> torch.Tensor:
        """The drafter's logits [n, B-1, V] for the blocks [anchor, MASK...] (anchors [n]) at `block_pos`
        [n, B], after the context features `taps` at slots `ctx_at`, seeing the slots below layout.length."""
        layout, lm_head = self.layout, self.target.lm_head
        inputs = dict(block_ids=torch.cat([anchors[:, None], self.masks], dim=1), block_pos=block_pos, taps=taps,
                      ctx_pos=ctx_pos, ctx_at=ctx_at, ctx_limit=layout.bounds[layout.length : layout.length + 1])
        # the prompt's context (any length) runs eagerly; every later round has one shape
        hidden = self.draft(**inputs) if first else self.graphs("draft", self.draft, **inputs)
        return lm_head(hidden[:, 1:].to(lm_head.weight.dtype))


class SpeculativeDecoder(Decoder):
    """Greedy speculative decoding of up to `n` prompts at once, its state allocated once (and its
    steps captured once) for prompts of up to `max_prompt` tokens and `max_new_tokens` each."""

    def __init__(self, target: Target, drafter: DFlashDrafter, n: int, max_prompt: int, max_new_tokens: int,
                 cuda_graphs: bool = False, headroom_rounds: int = 16) -> None:
        block = drafter.block_size
        # a row holds at most its prompt and max_new_tokens + B - 1 committed tokens; in a batch a round
        # may also keep slots some rows rejected: room for `headroom_rounds` such rounds, then `compact`
        slots = max_prompt + max_new_tokens + 2 * block + (headroom_rounds * block if n > 1 else 0)
        super().__init__(target, drafter, n, slots, cuda_graphs)
        self.verify = self.layout.target_step(target, tap=True)

    @torch.no_grad()
    def decode(self, prompts: list[list[int]], max_new_tokens: int, eos_id: int | None) -> list[Generation]:
        """One Generation per prompt, each given an equal share of the batch's wall time."""
        target, layout, n, device = self.target, self.layout, self.n, self.device
        block = self.drafter.block_size
        offsets = torch.arange(block, device=device)
        real = len(prompts)
        t0 = self.clock()

        logits, taps, ctx_pos, start = layout.prefill(target, prompts, tap=True)
        anchors = logits.argmax(-1)  # [n]
        out = [[tok] for tok in anchors.tolist()]
        acceptance: list[list[int]] = [[] for _ in range(n)]
        alive = [r < real and not finished(out[r], max_new_tokens, eos_id) for r in range(n)]
        moving = torch.tensor(alive, device=device)
        ctx_at, first = layout.slot_index[: layout.length], True
        while any(alive):
            block_pos = start[:, None] + offsets
            draft = self.draft_logits(anchors, block_pos, taps, ctx_pos, ctx_at, first).argmax(-1)  # [n, B-1]
            block_ids = torch.cat([anchors[:, None], draft], dim=1)
            if layout.length + block > layout.slots:  # both caches hold every committed token here
                layout.compact()
            write_at = offsets + layout.length
            logits, taps = self.graphs("verify", self.verify, ids=block_ids, positions=block_pos, write_at=write_at)
            verified = logits.argmax(-1)  # [n, B]: the target's token after each prefix of the block
            accepted_t = (draft == verified[:, :-1]).to(torch.int64).cumprod(1).sum(1)  # [n]
            layout.valid[:, layout.length : layout.length + block] = (offsets <= accepted_t[:, None]) & moving[:, None]
            host = torch.cat([accepted_t, draft.flatten(), verified.flatten()]).tolist()  # the round's one sync
            accepted, drafts, targets = host[:n], host[n : n * block], host[n * block :]
            for r in (r for r in range(n) if alive[r]):
                a = accepted[r]
                out[r] += drafts[r * (block - 1) : r * (block - 1) + a] + [targets[r * block + a]]
                acceptance[r].append(a + 1)
            kept = max(a for a, live in zip(accepted, alive, strict=True) if live) + 1
            ctx_pos, ctx_at, first = block_pos, write_at, False
            layout.length += kept
            anchors = verified.gather(1, accepted_t[:, None])[:, 0]
            start = start + (accepted_t + 1) * moving
            now = [live and not finished(out[r], max_new_tokens, eos_id) for r, live in enumerate(alive)]
            if now != alive:
                alive, moving = now, torch.tensor(now, device=device)
        share = (self.clock() - t0) / real
        return [Generation(trim_to_eos(out[r], max_new_tokens, eos_id), acceptance[r], share) for r in range(real)]


class TargetDecoder(Decoder):
    """Target-only decoding of up to `n` prompts at once (greedy or sampled): the baseline, its steps
    captured as the speculative ones are, so a speedup compares like with like."""

    def __init__(self, target: Target, n: int, max_prompt: int, max_new_tokens: int,
                 cuda_graphs: bool = False) -> None:
        super().__init__(target, None, n, max_prompt + max_new_tokens + 1, cuda_graphs)
        self.step = self.layout.target_step(target, tap=False)

    @torch.no_grad()
    def decode(self, prompts: list[list[int]], max_new_tokens: int, eos_id: int | None, temperature: float = 0.0,
               generator: torch.Generator | None = None) -> list[Generation]:
        layout, n, real = self.layout, self.n, len(prompts)
        t0 = self.clock()
        logits, _, _, pos = layout.prefill(self.target, prompts, tap=False)
        tokens = next_tokens(logits, temperature, generator)  # [n]
        out: list[list[int]] = [[] for _ in range(n)]
        alive = [r < real for r in range(n)]
        while True:
            for r, tok in enumerate(tokens.tolist()):
                if alive[r]:
                    out[r].append(tok)
                    alive[r] = not finished(out[r], max_new_tokens, eos_id)
            if not any(alive):
                break
            write_at = layout.slot_index[layout.length : layout.length + 1]
            logits, _ = self.graphs("target", self.step, ids=tokens[:, None], positions=pos[:, None], write_at=write_at)
            tokens = next_tokens(logits[:, -1], temperature, generator)
            layout.length += 1
            pos = pos + 1
        share = (self.clock() - t0) / real
        return [Generation(trim_to_eos(out[r], max_new_tokens, eos_id), seconds=share) for r in range(real)]


def speculative_greedy(
    target: Target, drafter: DFlashDrafter, prompt: list[int], max_new_tokens: int, eos_id: int | None
) -> Generation:
    """One prompt, eagerly: the single path as tests and the parity bench call it."""
    decoder = SpeculativeDecoder(target, drafter, 1, len(prompt), max_new_tokens)
    return decoder.decode([prompt], max_new_tokens, eos_id)[0]
