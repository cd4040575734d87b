"""The per-update compute, shared by the training loop and `blockdraft bench`: forward and backward
over one update's micro-batches, and nothing else (no logging, no guard, no optimizer step).

Per micro-batch, all on the device and without a host synchronisation:
  target taps on the right-padded [n, T] batch (causal SDPA: no real token attends to padding, and
  the length buckets keep the padding small; the forward stops after the last tapped layer)
  -> the L real tokens packed end to end -> drafter (fusion, noise, V*B block queries, one flex
  BlockMask shared by all layers) -> fused lm_head + weighted loss / D -> backward.
Packing happens on the host in the prefetch thread (`prepare`), where the block count is known; a
micro-batch whose sequences hold more than `train.max_blocks_per_pass` blocks is split into several
passes (short sequences bring up to num_anchors blocks each, so the token budget does not bound memory).
When compiled, each pass is padded to its shape class (train/shapes.py) and `warm_up` runs every class
before update 1: the forward sees a bounded set of shapes and has compiled them all before training.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.profiler import record_function

from blockdraft.config import Config
from blockdraft.data.batching import BatchSampler, PlannedBatch
from blockdraft.data.cache import Samples
from blockdraft.data.prefetch import Batch, collate
from blockdraft.errors import UserError, first_line
from blockdraft.model.drafter import DFlashDrafter
from blockdraft.model.masks import dense_mask, flex_block_mask
from blockdraft.model.target import Target
from blockdraft.train.blocks import Blocks, Packed, anchor_generator, pack, row_blocks, sample_blocks, split_rows
from blockdraft.train.loss import MicroStats, add_stats, block_loss, denominator, stats_vector
from blockdraft.train.shapes import ShapeClasses

RECOMPILE_LIMIT = 64  # dynamo's default 8 would run a forward eager (flex attention unfused) past 8 shapes


@dataclass
class Pass:
    """One forward/backward of the drafter: some rows of a micro-batch."""

    input_ids: torch.Tensor  # [n, T] right-padded, for the target
    packed: Packed

    @staticmethod
    def placeholder(block_size: int, shapes: ShapeClasses | None) -> Pass:
        """A one-token pass with no label, on the host: it adds nothing to the update, but gives a rank
        with fewer passes the same number of forwards and backwards (hence collectives) as the others."""
        ids = torch.zeros(1, 1, dtype=torch.long)  # [1, 1]
        return Pass(ids, pack(ids, torch.zeros(1, 1, dtype=torch.bool), torch.tensor([1]), block_size, 1, None, shapes))


def flash_attention_installed() -> bool:
    """FlashAttention-4's CuTe kernels, which flex attention's FLASH backend imports (flash-attn-4)."""
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ImportError:  # no flash_attn at all
        return False


def flash_attention_problem(device: torch.device, head_dim: int, precision: str) -> str | None:
    """Why FlashAttention-4 cannot run the drafter's attention here, or None: it needs a Hopper or newer
    GPU, bf16 inputs, the flash-attn-4 package, importable (its CuTe DSL is a separate wheel that can be
    missing), and a head dim its kernels take on this GPU (FlashAttention-4's own rule: on SM100, 8-128
    or 256 only)."""
    major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0
    if major < 9:
        return f"it needs a Hopper or newer GPU (this device: {device})"
    if precision != "bf16":
        return f"its kernels take bf16 inputs, not {precision} (train.precision)"
    if not flash_attention_installed():
        return "it needs FlashAttention-4 (pip install flash-attn-4)"
    try:
        interface = importlib.import_module("flash_attn.cute.interface")
    except Exception as e:  # a broken install fails in many ways (a missing wheel, a DSL that cannot load)
        return f"flash_attn.cute does not import ({type(e).__name__}: {first_line(e)})"
    validate = getattr(interface, "_validate_head_dims", None)  # private: a release without it is not asked
    if validate is not None:
        try:
            validate(head_dim, head_dim, major, 8)  # 8: 16 bytes of bf16
        except AssertionError as e:
            return f"its kernels do not take the drafter's head dim {head_dim} on this GPU ({first_line(e)})"
    return None


def resolve_flex_backend(setting: str, device: torch.device, head_dim: int, precision: str) -> tuple[str, str | None]:
    """The drafter's flex-attention kernels for `train.flex_backend`, and a note when `auto` found
    FlashAttention-4 installed but unusable. `flash` is asked for: refused with one line, never ignored.
    `auto` takes flash where it can run (installing `blockdraft[flash]` is the opt-in), else triton."""
    if setting == "triton":
        return "triton", None
    problem = flash_attention_problem(device, head_dim, precision)
    if problem is None:
        return "flash", None
    if setting == "flash":
        raise UserError(f"train.flex_backend: flash: {problem}; use triton or auto")
    if not flash_attention_installed():  # auto without the extra: nothing to say
        return "triton", None
    return "triton", f"train.flex_backend auto: FlashAttention-4 is installed but unused: {problem}; using triton"


def figures_to_host(vector: torch.Tensor, grad_norm: torch.Tensor) -> tuple[list[float], float]:
    """An update's stats vector and gradient norm (`HotPath.accumulate`) on the host, in one copy: the
    update's one synchronisation."""
    if isinstance(grad_norm, DTensor):  # FSDP2: the norm of sharded gradients
        grad_norm = grad_norm.full_tensor()
    host = torch.cat([grad_norm.detach().float().reshape(1), vector]).cpu().tolist()
    return host[1:], host[0]


def clipped(norm: float, cap: float) -> bool:
    """Whether an update's clip factor is below 1, so that `HotPath.clip` scales its gradients (unless the
    guard drops them): the step record's `clipped`."""
    return norm > cap


def graphs_compiled() -> int:
    """Graphs torch.compile has made so far in this process (0 when nothing is compiled): growth after
    warm-up is a recompile, a stall of seconds to minutes."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass
class RunPlan:
    """The micro-batches of a run's first epochs, every rank's, in the sampler's order: what the block
    classes are fitted to (`HotPath.fit_shapes`) and the warm-up picks from (`warmup_picks`)."""

    slots: list[tuple[int, int, np.ndarray]]  # (epoch, bucket, sample ids)
    rows: list[tuple[list[int], list[int]]]  # per slot: (row lengths, row blocks)

    @classmethod
    def of(cls, dataset: Samples, sampler: BatchSampler, blocks: np.ndarray, epochs: int) -> RunPlan:
        """`blocks`: the samples' blocks (`data.cost.dataset_blocks`)."""
        slots = [(e, b, ids) for e in range(epochs) for b, ids in sampler.global_plan(e)]
        return cls(slots, [(dataset.lengths[ids].tolist(), blocks[ids].astype(int).tolist()) for _, _, ids in slots])


def pass_blocks(row_blocks: list[int], max_blocks: int) -> list[int]:
    """The block count of each pass a micro-batch with these rows' blocks is split into (`prepare`)."""
    return [sum(row_blocks[r] for r in rows) for rows in split_rows(row_blocks, max_blocks)]


def warmup_picks(micro_batches: list[tuple[list[int], list[int]]], shapes: ShapeClasses, max_blocks: int) -> list[int]:
    """micro_batches: the plan's (row lengths, row blocks) -> which of them to run before update 1 so that
    every graph the plan needs is compiled: for each block class its passes take, the first micro-batch
    with it, the most frequent class first (its graph has known sizes; unless `train.static_graphs`,
    dynamo compiles the later classes into one graph with symbolic sizes); then the micro-batches with
    the most rows and with the longest lone row (the target's batch shapes), if not picked already."""
    first: dict[int, int] = {}
    seen: dict[int, int] = {}
    for i, (_, blocks) in enumerate(micro_batches):
        for count in pass_blocks(blocks, max_blocks):
            c = shapes.blocks(count)
            first.setdefault(c, i)
            seen[c] = seen.get(c, 0) + 1
    picks = [first[c] for c in sorted(first, key=lambda c: (-seen[c], c))]
    if micro_batches:
        picks.append(max(range(len(micro_batches)), key=lambda i: len(micro_batches[i][0])))  # the most rows
    lone = [i for i, (lengths, _) in enumerate(micro_batches) if len(lengths) == 1]
    if lone:
        picks.append(max(lone, key=lambda i: micro_batches[i][0][0]))  # the longest lone row
    return list(dict.fromkeys(picks))  # each once, in order


class DraftForward(nn.Module):
    """The drafter's training forward as one module call (fusion, noise, layers), so that DDP and
    FSDP2 wrap a single forward."""

    def __init__(self, drafter: DFlashDrafter) -> None:
        super().__init__()
        self.drafter = drafter

    def forward(
        self,
        taps: torch.Tensor,
        noise: torch.Tensor | None,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        ctx_positions: torch.Tensor,
        mask: torch.Tensor | object,
    ) -> torch.Tensor:
        """taps: [1, L, N*H]; noise: [1, L, H] or None; block_embeds: [1, V*B, H]; block_positions:
        [1, V*B]; ctx_positions: [1, L]. Returns the drafter's final hidden states [1, V*B, H]."""
        if not torch.is_autocast_enabled(taps.device.type):  # the plain path: a bf16 target, an fp32 drafter
            dtype = self.drafter.fc.weight.dtype
            taps, block_embeds = taps.to(dtype), block_embeds.to(dtype)
        ctx = self.drafter.fuse(taps)  # [1, L, H]
        if noise is not None:
            ctx = ctx + noise.to(ctx.dtype)
        return self.drafter(block_embeds, block_positions, ctx, ctx_positions, mask)


class HotPath:
    """Holds the frozen target, the drafter and the choices of the fast path for one device.

    Distributed: when torch.distributed is initialised, D and the step's stats are summed over
    ranks, and the loss is scaled by the world size because DDP and FSDP2 average gradients.
    `module` is the caller's `DraftForward(drafter)`, already wrapped (DDP, fully_shard), and
    `defer_sync` the wrapper's context that skips the gradient reduction for all but the last
    micro-batch of an update; without them, the drafter runs unwrapped.
    """

    def __init__(
        self,
        target: Target,
        drafter: DFlashDrafter,
        cfg: Config,
        device: torch.device,
        fast: bool | None = None,
        module: nn.Module | None = None,
        defer_sync: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        """fast (default: on CUDA) = bf16 autocast, flex attention, torch.compile per `train.compile`;
        fast=False is the plain path (fp32, dense SDPA mask, eager): the reference the bench checks against."""
        self.target = target
        self.drafter = drafter
        self.cfg = cfg
        self.device = device
        fast = device.type == "cuda" if fast is None else fast
        self.use_bf16 = fast and cfg.train.precision == "bf16" and device.type == "cuda"
        self.attention = "flex" if fast else "sdpa"
        self.compile = fast and (cfg.train.compile is True or (cfg.train.compile == "auto" and device.type == "cuda"))
        dense_cap = cfg.train.num_anchors  # about one sequence per pass: a dense mask costs (V*B) x (L + V*B)
        self.max_blocks = cfg.train.max_blocks_per_pass or (1536 if self.attention == "flex" else dense_cap)
        classes = cfg.train.shape_classes
        self.shapes = ShapeClasses.for_budget(cfg.drafter.block_size, cfg.data.tokens_per_batch,
                                              cfg.train.block_class_ratio) \
            if classes is True or (classes == "auto" and self.compile) else None
        # noise given as a tensor at every update of a run that has any: None at the end of a decaying
        # schedule would be another graph, compiled late
        self.noisy = cfg.noise.std > 0 or cfg.noise.final_std > 0
        # the mask_mod's captured tensors at one size for the whole run: the ladder's class for the most
        # blocks a pass holds, which no fitted class exceeds
        self.capture = self.shapes.ladder(self.max_blocks) if self.shapes is not None and self.attention == "flex" \
            else None
        if self.compile:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            target.compile_features()
        drafter.checkpoint_layers = cfg.train.activation_checkpointing
        # resolved on the plain path too: flash asked for is refused there as on the fast path
        backend, note = resolve_flex_backend(cfg.train.flex_backend, device, drafter.config.head_dim,
                                             cfg.train.precision)
        self.flex_backend = backend if self.attention == "flex" else None  # kernels that run: the logs' field
        self.flex_note = note if self.attention == "flex" else None
        if self.flex_backend is not None:
            drafter.use_flex_backend(self.flex_backend.upper())
        # the frozen target's forward on a stream of its own: it reads no drafter weight, so the next
        # update's can run while the GPU still runs this update's optimizer step
        self.target_stream = torch.cuda.Stream(device) if fast and cfg.train.target_stream and device.type == "cuda" \
            else None
        self.module = module if module is not None else DraftForward(drafter)
        self.defer_sync = defer_sync
        self._forward: nn.Module | None = None  # compiled at the first call, when the fast path asks for it

    def forward_module(self) -> nn.Module:
        if self._forward is None:
            static = self.cfg.train.static_graphs and self.shapes is not None  # one graph per class
            self._forward = torch.compile(self.module, dynamic=False if static else None) if self.compile \
                else self.module
        return self._forward

    # ---- batches -----------------------------------------------------------------------------------
    def prepare(self, batch: Batch) -> Batch:
        """Host side, in the prefetch thread: the micro-batch's passes, packed."""
        b, anchors, density = self.cfg.drafter.block_size, self.cfg.train.num_anchors, self.cfg.train.anchors_per_token
        counts = row_blocks(batch.loss_mask, batch.lengths, b, anchors, density).tolist()
        batch.passes = []
        for rows in split_rows(counts, self.max_blocks):
            index = torch.tensor(rows)
            lengths = batch.lengths[index]
            width = int(lengths.max())
            ids, mask = batch.input_ids[index, :width], batch.loss_mask[index, :width]
            ids = ids.pin_memory() if torch.cuda.is_available() else ids
            batch.passes.append(Pass(ids, pack(ids, mask, lengths, b, anchors, density, self.shapes)))
        return batch

    def to_device(self, batch: Batch) -> Batch:
        """Pinned host tensors -> device without waiting (the copy overlaps the previous step's tail)."""
        batch.passes = [self.pass_to_device(p) for p in batch.passes]
        return batch

    def pass_to_device(self, part: Pass) -> Pass:
        """The target's tokens are copied on the stream that reads them (`target_features`), so that
        nothing the main stream still runs holds them back."""
        with self.on_target_stream():
            ids = part.input_ids.to(self.device, non_blocking=True)
        return Pass(ids, part.packed.to(self.device))

    def on_target_stream(self) -> AbstractContextManager:
        """The target stream as the current one, or nothing where there is none (CPU, setting off)."""
        return torch.cuda.stream(self.target_stream) if self.target_stream is not None else contextlib.nullcontext()

    def target_features(self, input_ids: torch.Tensor, final_hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target's taps [n, T, N*H] (and final hidden states), computed on the target stream; the
        current stream waits for them before it reads them."""
        with self.on_target_stream():
            taps, final = self.target.features(input_ids, final_hidden=final_hidden)
        if self.target_stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.target_stream)
            for t in (taps, final):
                if t is not None:  # made on the target stream, freed after the current one's use
                    t.record_stream(current)
        return taps, final

    # ---- compute -----------------------------------------------------------------------------------
    def micro_stats(self, part: Pass, blocks: Blocks, noise_std: float, gen: torch.Generator) -> MicroStats:
        """Forward of one pass: the loss terms and metrics (backward is the caller's)."""
        loss_cfg = self.cfg.loss
        packed = part.packed
        need_final = loss_cfg.kl_weight > 0 or loss_cfg.labels == "target"
        v, b = blocks.tokens.shape
        length = packed.input_ids.shape[0]
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16):
            with record_function("target"):  # ranges for `blockdraft bench --profile` (bench/profile.py)
                taps, final = self.target_features(part.input_ids, need_final)  # [n, T, N*H]
            taps = taps.flatten(0, 1)[packed.token_index][None]  # [1, L', N*H]: batch padding dropped
            noise = None
            if noise_std > 0 or self.noisy:
                h, real = self.drafter.config.hidden_size, packed.real_tokens
                noise = noise_std * torch.randn((1, real, h), generator=gen, device=self.device)  # [1, L, H]
                noise = torch.cat([noise, noise.new_zeros(1, length - real, h)], dim=1)  # [1, L', H]
            embeds = self.target.embed_tokens(blocks.tokens.view(1, v * b))  # [1, V'*B, H]
            with record_function("mask"):
                if self.attention == "flex":
                    mask = flex_block_mask(blocks.anchors, blocks.doc, packed.doc, b, self.capture)
                else:
                    mask = dense_mask(blocks.anchors, blocks.doc, packed.doc, b)
            with record_function("drafter"):
                hidden = self.forward_module()(taps, noise, embeds, blocks.positions.view(1, v * b),
                                               packed.pos[None], mask)
            hidden = hidden.view(v, b, -1)[:, 1:]  # [V', B-1, H]: block position 0 has no label
            target_hidden = None
            if need_final:
                final = final.flatten(0, 1)[packed.token_index]  # [L, H]
                before = blocks.anchors[:, None] + torch.arange(b - 1, device=self.device)  # predicts the next
                target_hidden = final[before.clamp(max=length - 1)]  # [V', B-1, H]
            with record_function("loss"):
                return block_loss(hidden, self.target.lm_head.weight, blocks.labels, blocks.label_mask, loss_cfg,
                                  target_hidden, self.target.logit_softcap)

    @property
    def warms_up(self) -> bool:
        """Whether `warm_up` does anything: only compiled passes with shape classes have graphs to meet."""
        return self.compile and self.shapes is not None

    def fit_shapes(self, plan: RunPlan) -> None:
        """Block classes placed where the plan's passes are (`ShapeClasses.fitted`). Call it before the
        first micro-batch is packed (`prepare`), so that every pass of the run takes a fitted class."""
        if self.shapes is not None:
            counts = [v for _, blocks in plan.rows for v in pass_blocks(blocks, self.max_blocks)]
            self.shapes = self.shapes.fitted(counts)

    def warmup_batches(self, dataset: Samples, plan: RunPlan) -> list[Batch]:
        """The plan's micro-batches that `warmup_picks` chooses, collated."""
        if not self.warms_up:
            return []
        out = []
        for i in warmup_picks(plan.rows, self.shapes, self.max_blocks):
            e, b, ids = plan.slots[i]
            lengths = dataset.lengths[ids]
            planned = PlannedBatch(e, i, b, ids, int(lengths.sum()), int(lengths.max()) * len(ids), 0.0)
            out.append(collate(dataset, planned, 1, pin=False))
        return out

    def warm_up(self, batches: list[Batch]) -> int:
        """Run before update 1 the micro-batches `warmup_picks` chose from the run's plan, so the graphs of
        every pass shape the run will show are compiled before training: a shape first met after hours
        would stall the run for a minute. Their gradients are dropped and they draw from no RNG stream of
        the run, so the updates are what they would have been. Every rank runs the same micro-batches, so
        DDP's reductions match. Returns the passes run (0 when nothing is compiled)."""
        if not self.warms_up:
            return 0
        cfg, runs = self.cfg, 0
        for batch in batches:
            batch = self.to_device(self.prepare(batch))
            for i, part in enumerate(batch.passes):
                g = anchor_generator(cfg.train.seed, 0, -1, i, self.device)  # no update's key
                blocks = sample_blocks(part.packed, cfg.drafter.block_size, cfg.train.num_anchors,
                                       self.drafter.mask_token_id, g)
                self.micro_stats(part, blocks, 0.0, g).weighted_loss.backward()
                runs += 1
        for p in self.drafter.parameters():
            p.grad = None
        return runs

    def accumulate(
        self, micro_batches: list[Batch], step: int, rank: int, noise_std: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of update `step` over its micro-batches; gradients are left in the
        drafter's .grad, unclipped (`update_figures` clips them once the norm is on the host). Returns (the step's
        stats vector summed over ranks, the gradients' norm: a DTensor under FSDP2)."""
        cfg = self.cfg
        # (micro-batch index in the update over all ranks, pass index): 2 ranks x 1 draw what 1 x 2 draws
        keys = [(rank * len(micro_batches) + j, p) for j, mb in enumerate(micro_batches) for p in range(len(mb.passes))]
        passes = [p for mb in micro_batches for p in mb.passes]
        if dist.is_initialized():  # every rank must run as many passes: each forward holds collectives
            most = torch.tensor([len(passes)], device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            keys += [(-1 - rank, i) for i in range(int(most) - len(passes))]  # placeholders: no labels
            filler = self.pass_to_device(Pass.placeholder(cfg.drafter.block_size, self.shapes))
            passes += [filler] * (int(most) - len(passes))
        blocks, gens = [], []
        for part, (micro, index) in zip(passes, keys, strict=True):
            g = anchor_generator(cfg.train.seed, step, micro, index, self.device)
            blocks.append(sample_blocks(part.packed, cfg.drafter.block_size, cfg.train.num_anchors,
                                        self.drafter.mask_token_id, g))
            gens.append(g)
        denom = sum(denominator(bl.label_mask, cfg.loss) for bl in blocks)
        if dist.is_initialized():
            dist.all_reduce(denom)
        scale = (dist.get_world_size() if dist.is_initialized() else 1) / denom.clamp(min=1e-6)
        total: MicroStats | None = None
        last = len(passes) - 1
        for i, (part, bl, g) in enumerate(zip(passes, blocks, gens, strict=True)):
            with self.defer_sync() if i < last else contextlib.nullcontext():
                stats = self.micro_stats(part, bl, noise_std, g)
                (stats.weighted_loss * scale).backward()
            total = add_stats(total, stats)
        with record_function("clip"):
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in self.drafter.parameters() if p.grad is not None])
        vector = stats_vector(total)
        if dist.is_initialized():
            dist.all_reduce(vector)
        return vector, grad_norm

    def update_figures(
        self, micro_batches: list[Batch], step: int, rank: int, noise_std: float
    ) -> tuple[list[float], float]:
        """`accumulate`, its figures on the host (the update's one wait), then `clip`: the gradients an
        optimizer step takes. Returns (the step's stats vector, the gradient norm before clipping)."""
        vector, grad_norm = self.accumulate(micro_batches, step, rank, noise_std)
        host, norm = figures_to_host(vector, grad_norm)
        self.clip(grad_norm, norm)
        return host, norm

    def clip(self, grad_norm: torch.Tensor, norm: float) -> None:
        """Scale the drafter's gradients by min(1, optim.grad_clip / (norm + 1e-6)), as clip_grad_norm_
        does; grad_norm is `accumulate`'s and norm its host copy. Below the cap the factor is exactly 1,
        so the read and write of every fp32 gradient is skipped: 3.1 ms of a Qwen3-8B-shaped update on an
        H100 (benchmarks/2026-12-06-h100-clip-on-the-host-and-peer.md)."""
        cap = self.cfg.optim.grad_clip
        if norm < 0.999 * cap:  # the margin covers the device's fp32 rounding of the factor
            return
        with record_function("clip"):
            torch.nn.utils.clip_grads_with_norm_(self.drafter.parameters(), cap, grad_norm)
