"""What `blockdraft bench` measures: the training hot path on random weights and synthetic batches or
the user's own data (`bench.datasets`).

The same `HotPath`, sampler and prefetcher as `blockdraft train`, so its tokens/s, MFU split,
memory and checkpoint stall are what a real run of that shape would see.

Work is counted two ways, so trainers and settings compare at equal supervision: real tokens and
supervised blocks (blocks with at least one label), each per second at the median update
(`tokens_per_s`, `blocks_per_s`) and over the whole measured window, stalls included
(`tokens_per_s_wall`, `blocks_per_s_wall`); `blocks_per_1k_tokens` links them. A recompile shows as
`graphs_compiled` growing while measuring and as a slow update (over 2x the median) in `slow_steps`.
Each update is timed by `UpdateClock`: from the end of the update before, with no synchronisation the
trainer does not make itself, so an optimizer step's GPU time is paid in the next update's window.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from blockdraft.bench.datasets import UserData, bench_dataset
from blockdraft.config import Config
from blockdraft.data.cache import Samples
from blockdraft.data.cost import anchor_candidates, can_anchor, dataset_blocks, dataset_costs
from blockdraft.model.flops import Dims, DraftWork, drafter_flops, target_flops

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}  # dense bf16, no sparsity


def nominal_peak(device: torch.device, given: float | None) -> float | None:
    if given is not None or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def cuda_median_ms(fn: Callable[[], object], calls: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of `fn` on the current CUDA stream (events around each call), after `warmup`
    calls: the bench scripts' timing of one piece of an update."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_tflops(device: torch.device, n: int = 8192, reps: int = 20) -> float | None:
    """The measured bf16 matmul ceiling of this GPU, printed beside the nominal peak."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def build_models(cfg: Config, hf_cfg, device: torch.device, tokenizer: Any | None = None):
    """Random-weight target and a drafter per the config, their dtype and mask token chosen as training
    chooses them (`tokenizer`: the target folder's, if any); returns (target, drafter)."""
    from transformers import AutoModelForCausalLM

    from blockdraft.model.drafter import DFlashDrafter, drafter_config
    from blockdraft.model.target import Target, require_room_for_weights, resolve_mask_token, target_dtype

    d = cfg.drafter
    layer_ids = d.tap_layers(hf_cfg.num_hidden_layers)
    mask_id, _ = resolve_mask_token(tokenizer, hf_cfg.vocab_size, bool(getattr(hf_cfg, "tie_word_embeddings", False)),
                                    d.mask_token_id)
    dtype = target_dtype(cfg.target.dtype, device)
    require_room_for_weights(hf_cfg, dtype, device, "the target",
                             "choose a smaller --target-shape (tiny fits anywhere) or a GPU with more memory")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, attn_implementation="sdpa")
    model.requires_grad_(False).eval()
    target = Target(model, layer_ids)
    dcfg = drafter_config(hf_cfg, d.num_layers, d.block_size, layer_ids, mask_id, d.intermediate_size)
    return target, DFlashDrafter(dcfg).to(device)


def synchronize(device: torch.device) -> None:
    """Wait for all of the device's streams (nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class UpdateClock:
    """An update's time as a training run spends it: from the end of the update before (its optimizer
    step launched, not waited for) to the end of this one, adding no synchronisation the trainer does not
    make itself. The GPU still running an update's optimizer step is paid for in the next window, so
    every trainer pays for its step, the windows add up to the wall clock, and work the trainer overlaps
    with the step (its host side, the next update's first kernels) is not counted twice. Started after a
    full synchronisation; `lap` at each update's end."""

    def __init__(self, device: torch.device) -> None:
        synchronize(device)
        self.last = time.perf_counter()

    def lap(self) -> float:
        """Seconds since the previous lap (or the start)."""
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed


def draft_work(packed) -> DraftWork:
    """The drafter's useful work in one (host-side) pass: real tokens and blocks, not the shape-class
    filler; the context each block sees is taken at its expectation, the mean candidate position of
    its sequence (anchors are uniform over them)."""
    n = packed.doc_blocks.shape[0]  # the sequences, and the filler's (no candidates, no blocks)
    cand = packed.candidates.double()
    counts = torch.zeros(n, dtype=torch.float64).index_add_(0, packed.doc, cand)
    pos_sum = torch.zeros(n, dtype=torch.float64).index_add_(0, packed.doc, cand * packed.pos.double())
    blocks = packed.doc_blocks.double()
    seen = float((blocks * pos_sum / counts.clamp(min=1)).sum())
    return DraftWork(packed.real_tokens, int(blocks.sum()), seen, 0)


def run_profile(hot, optimizer, cfg: Config, profile: str, args, hf_cfg, peak: float | None, world,
                data: UserData | None = None) -> dict[str, Any]:
    """One length profile's measured updates (`data`: the prepared `--data` files, for the data profile)."""
    from blockdraft.data.batching import BatchSampler
    from blockdraft.data.prefetch import Prefetcher
    from blockdraft.train.distributed import sum_over_ranks
    from blockdraft.train.hotpath import RunPlan, clipped, graphs_compiled
    from blockdraft.train.loss import StepSums

    device = hot.device
    dataset = bench_dataset(profile, args, hf_cfg.vocab_size, cfg.train.grad_accum, data)
    candidates = anchor_candidates(dataset, cfg.drafter.block_size)  # one scan, for the costs and the warm-up
    costs = dataset_costs(dataset, hf_cfg, cfg, hot.target.layer_ids, candidates)  # cut as training cuts them
    sampler = BatchSampler(dataset.lengths, cfg.data, seed=cfg.train.seed, rank=world.rank, world_size=world.size,
                           grad_accum=cfg.train.grad_accum, costs=costs)

    t_dims, d_dims = Dims.of(hf_cfg), Dims.of(hot.drafter.config)
    taps, layers_run = len(hot.drafter.target_layer_ids), hot.target.layer_ids[-1] + 1
    rows: list[dict[str, float]] = []
    kept: list = []
    synchronize(device)
    t0, before = time.perf_counter(), graphs_compiled()
    # a dataset smaller than the window is cycled, as training cycles its epochs
    epochs = math.ceil((args.warmup + args.steps) * cfg.train.grad_accum / max(1, sampler.batches_per_epoch))
    # block classes fitted to the plan, and the graphs of its every pass shape, as `blockdraft train` has them
    plan = RunPlan.of(dataset, sampler, dataset_blocks(dataset, cfg, candidates), epochs)
    hot.fit_shapes(plan)
    warm_passes = hot.warm_up(hot.warmup_batches(dataset, plan))
    synchronize(device)
    warm = {"warmup_passes": warm_passes, "warmup_s": time.perf_counter() - t0,
            "warmup_graphs_compiled": graphs_compiled() - before}
    with Prefetcher(dataset, sampler, depth=cfg.data.prefetch_depth, pin_memory=device.type == "cuda",
                    prepare=hot.prepare) as prefetcher:
        clock = UpdateClock(device)
        for k in range(1, args.warmup + args.steps + 1):
            if k == args.warmup + 1:
                graphs_before = graphs_compiled()
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
            micro = [prefetcher.next() for _ in range(cfg.train.grad_accum)]
            wait = time.perf_counter() - t0
            work = [draft_work(p.packed) for mb in micro for p in mb.passes]
            blocks_run = sum(p.packed.padded_blocks for mb in micro for p in mb.passes)  # filler included
            blocks_sampled = sum(p.packed.num_blocks for mb in micro for p in mb.passes)
            lengths = [int(n) for mb in micro for n in mb.lengths.tolist()]
            padded = sum(mb.padded_tokens for mb in micro)
            micro = [hot.to_device(mb) for mb in micro]
            host, norm = hot.update_figures(micro, k, world.rank, 0.0)  # before the step, as in training
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            all_tokens, all_padded = sum_over_ranks([sum(lengths), padded], device)  # as in training
            step_time = clock.lap()
            if k <= args.warmup:
                continue
            sums = StepSums.decode(host)
            labels = sum(sums.counted) / world.size  # summed over ranks: the mean per GPU
            fl_t = target_flops(lengths, t_dims, layers_run)
            fl_d = sum(drafter_flops(w, d_dims, hot.drafter.config.num_hidden_layers, taps, hot.drafter.block_size,
                                     hf_cfg.vocab_size) for w in work)
            fl_d += 2 * 2 * labels * d_dims.hidden * hf_cfg.vocab_size  # lm_head: forward + input gradient
            rows.append({"update": k, "step_time": step_time, "wait": wait, "tokens": all_tokens,
                         "padded": all_padded, "blocks": sums.blocks, "graphs": graphs_compiled(),
                         "passes": len(work), "blocks_run": blocks_run, "blocks_sampled": blocks_sampled,
                         "flops_target": fl_t, "flops_drafter": fl_d, "loss": sums.loss, "grad_norm": norm})
            if len(kept) < 4:
                kept.append(micro)
        mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
        target_time = time_target(hot, kept)
    result = summarize_rows(rows, target_time, peak, world.size, graphs_before)
    result.update(warm, profile=profile, peak_mem_gb=mem, micro_batches_per_step=cfg.train.grad_accum,
                  passes_per_step=statistics.mean(r["passes"] for r in rows), dataset_samples=len(dataset),
                  epochs=epochs, grad_norm_median=statistics.median(r["grad_norm"] for r in rows),
                  # the updates that timed the clip's pass over the gradients (below the cap it is skipped)
                  clipped_share=sum(clipped(r["grad_norm"], cfg.optim.grad_clip) for r in rows) / len(rows))
    if args.profile:
        from blockdraft.bench.profile import write_profile

        write_profile(hot, optimizer, kept[0], args.profile, profile)
    if not args.no_check:
        result["check"] = check_fast_against_plain(hot, cfg, dataset)
    return result


def time_target(hot, kept: list) -> float:
    """Median seconds of the target forward alone over one step's micro-batches."""
    times = []
    for micro in kept:
        synchronize(hot.device)
        t0 = time.perf_counter()
        with torch.autocast(hot.device.type, dtype=torch.bfloat16, enabled=hot.use_bf16):
            for mb in micro:
                for part in mb.passes:
                    hot.target.features(part.input_ids)
        synchronize(hot.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def summarize_rows(
    rows: list[dict[str, float]], target_time: float, peak: float | None, world_size: int = 1, graphs_before: int = 0,
) -> dict:
    """Tokens and blocks count every rank's; FLOPs (hence TFLOP/s and MFU) are this rank's, i.e. per GPU.
    Per-second rates at the median update use the median tokens per update; blocks follow the tokens
    at the window's blocks per token, so blocks_per_s = tokens_per_s * blocks_per_1k_tokens / 1000."""
    step = statistics.median(r["step_time"] for r in rows)
    tokens = statistics.median(r["tokens"] for r in rows)
    wall = sum(r["step_time"] for r in rows)
    total_tokens, total_blocks = sum(r["tokens"] for r in rows), sum(r["blocks"] for r in rows)
    per_1k = 1000 * total_blocks / max(total_tokens, 1)
    graphs = [graphs_before] + [r["graphs"] for r in rows]
    new = [after - before for before, after in zip(graphs[:-1], graphs[1:], strict=True)]  # compiled in each update
    slow = [{"update": r["update"], "time_s": round(r["step_time"], 3), "over_median": round(r["step_time"] / step, 2),
             "graphs_compiled": n} for r, n in zip(rows, new, strict=True) if r["step_time"] > 2 * step]
    fl_t = statistics.median(r["flops_target"] for r in rows)
    fl_d = statistics.median(r["flops_drafter"] for r in rows)
    tflops = (fl_t + fl_d) / step / 1e12
    # the window's model FLOPs over its time: the rate that compares trainers whose updates differ in size
    tflops_wall = sum(r["flops_target"] + r["flops_drafter"] for r in rows) / wall / 1e12
    out = {
        "steps": len(rows),
        "tokens_per_s": tokens / step,
        "tokens_per_s_per_gpu": tokens / step / world_size,
        "tokens_per_s_wall": total_tokens / wall,
        "rate_wall_over_median": total_tokens / wall / (tokens / step),
        # stalls alone: 1.0 when the window took what its updates take at the median update time (tokens
        # per update vary under cost-balanced batching, so the rate ratio above can exceed 1 without stalls)
        "time_wall_over_median": wall / (len(rows) * step),
        "blocks_per_s": tokens / step * per_1k / 1000,
        "blocks_per_s_wall": total_blocks / wall,
        "blocks_per_1k_tokens": per_1k,
        "blocks": total_blocks,
        "tokens": total_tokens,
        "wall_s": wall,
        "slow_steps": len(slow),
        "slow_step_list": slow[:50],
        "graphs_compiled": graphs[-1] - graphs_before,
        "graphs_compiled_total": graphs[-1],
        "last_compile_update": max((r["update"] for r, n in zip(rows, new, strict=True) if n), default=None),
        "step_time_s": step,
        "tokens_per_step": tokens,
        "pad_frac": 1 - total_tokens / sum(r["padded"] for r in rows),
        # blocks the drafter ran that carry no label: padding up to the passes' block classes (this rank's;
        # None for a trainer that does not say)
        "filler_block_frac": 1 - sum(r["blocks_sampled"] for r in rows) / sum(r["blocks_run"] for r in rows)
        if all(r.get("blocks_run") for r in rows) else None,
        "tflops": tflops,
        "tflops_wall": tflops_wall,
        "target_time_share": target_time / step,
        "data_wait_share": sum(r["wait"] for r in rows) / wall,
        "loss_first_last": [rows[0]["loss"], rows[-1]["loss"]],
        "loss_finite": all(math.isfinite(r["loss"]) for r in rows),  # else the rates time a broken update
        "mfu": None, "mfu_wall": None, "mfu_target": None, "mfu_drafter": None,
    }
    if peak:
        out["mfu"] = tflops / peak
        out["mfu_wall"] = tflops_wall / peak
        out["mfu_target"] = fl_t / max(target_time, 1e-9) / 1e12 / peak
        # the rest of the update is charged to the drafter: its optimizer step and any idle time too
        out["mfu_drafter"] = fl_d / max(step - target_time, 1e-9) / 1e12 / peak
    return out


def first_anchored(dataset: Samples, block_size: int, width: int) -> int | None:
    """The first sample with an anchor candidate among its first `width` tokens: the check needs a block
    to draft (a real dataset may open with a sample whose answer is shorter than a block)."""
    for i in range(len(dataset)):
        mask = np.asarray(dataset.sample(i)[1][:width])
        if can_anchor(mask, np.arange(len(mask)), len(mask), block_size).any():
            return i
    return None


def check_fast_against_plain(hot, cfg: Config, dataset: Samples, max_tokens: int = 1024) -> dict[str, Any]:
    """One small update (a sequence of at most `max_tokens` tokens, 64 anchors) through the fast path and the
    plain path (fp32 drafter, dense SDPA mask, eager): losses and gradient norms must agree to bf16
    tolerance. Small, because the plain path's dense attention materialises its scores."""
    from blockdraft.data.prefetch import Batch
    from blockdraft.train.hotpath import HotPath, figures_to_host
    from blockdraft.train.loss import StepSums

    small = cfg.model_copy(update={"train": cfg.train.model_copy(update={"num_anchors": 64})})
    pick = first_anchored(dataset, cfg.drafter.block_size, max_tokens)
    if pick is None:
        return {"ok": None, "reason": f"no sample has a block to draft in its first {max_tokens} tokens"}
    ids, mask = dataset.sample(pick)  # copied as int64: a cached dataset's samples are read-only int32 views
    ids = torch.tensor(ids[:max_tokens], dtype=torch.int64)[None]
    mask = torch.tensor(mask[:max_tokens], dtype=torch.bool)[None]
    width = ids.shape[1]
    results = []
    for path in (HotPath(hot.target, hot.drafter, small, hot.device, module=hot.module),  # DDP or FSDP2's wrapper
                 HotPath(hot.target, hot.drafter, small, hot.device, fast=False, module=hot.module)):
        batch = Batch(ids, mask, torch.tensor([width]), [pick], 0, 0, 0, 0.0, width, width)
        vector, norm = figures_to_host(*path.accumulate([path.to_device(path.prepare(batch))], 1, 0, 0.0))
        results.append((StepSums.decode(vector).loss, norm))
        hot.drafter.zero_grad(set_to_none=True)
    (loss_f, norm_f), (loss_p, norm_p) = results
    loss_rel = abs(loss_f - loss_p) / max(abs(loss_p), 1e-12)
    norm_rel = abs(norm_f - norm_p) / max(abs(norm_p), 1e-12)
    return {"ok": loss_rel < 1e-2 and norm_rel < 5e-2, "loss_fast": loss_f, "loss_plain": loss_p,
            "loss_rel_diff": loss_rel, "grad_norm_rel_diff": norm_rel, "sample": pick, "tokens": width}


def checkpoint_stall(hot, optimizer: torch.optim.Optimizer) -> dict[str, float | None]:
    """What a save holds the loop for, against its floor: one device-to-host copy of the same bytes.

    The staging is the trainer's own (`dcp.async_save` through `host_stager`). As in training, on a GPU
    the pinned buffers are reserved before the first save (`reserve_s`, off the loop); `first_s` and
    `steady_s` are the loop's holds at the first and a later save; `d2h_s` is one contiguous copy of
    the state's bytes into pinned memory (median of 3)."""
    from blockdraft.train import distributed
    from blockdraft.train.checkpoint import host_stager

    state = distributed.state_dicts(hot.drafter, optimizer)
    stager = host_stager()
    t0 = time.perf_counter()
    if stager.cache_staged_state_dict:
        stager.stage(state)
    reserve_s = time.perf_counter() - t0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        staged = stager.stage(state)
        times.append(time.perf_counter() - t0)
    out: dict[str, float | None] = {"reserve_s": reserve_s, "first_s": times[0],
                                    "steady_s": statistics.median(times[1:]), "d2h_s": None, "first_over_d2h": None}
    if hot.device.type == "cuda":
        from blockdraft.train.checkpoint import tensors_in

        local = [t.to_local() if isinstance(t, DTensor) else t for _, t in tensors_in(staged)]  # this rank's shard
        nbytes = sum(t.numel() * t.element_size() for t in local)
        del stager, staged
        src = torch.empty(nbytes, dtype=torch.uint8, device=hot.device)
        dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        copies = []
        for _ in range(3):
            synchronize(hot.device)
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            synchronize(hot.device)
            copies.append(time.perf_counter() - t0)
        out["d2h_s"] = statistics.median(copies)
        out["first_over_d2h"] = times[0] / out["d2h_s"]
        out["gb"] = nbytes / 1e9
    return out

