"""`blockdraft bench [--target-shape qwen3-8b | --target DIR] [--lengths full,mix,data] [--data FILE ...]
[key=value ...]`.

Runs the training hot path (the same `HotPath`, sampler and prefetcher as `blockdraft train`) on a
target with random weights and synthetic batches, or the user's own training files (`--data`, read
and tokenised as training reads them: their lengths and answer masks), and reports tokens/s in real
(unpadded) tokens and supervised blocks/s, both at the median update and over the whole window (stalls
included), the graphs compiled and the slow updates while measuring, step time, MFU split into target
forward and drafter, peak memory, data-wait share, checkpoint stall, and the loss of the fast path
against the plain path on the same batch. On a GPU it measures 100 updates a profile by default, after
12 of warm-up.

Under torchrun (one process per GPU) the drafter is wrapped as in training (`train.parallel`, DDP by
default), each rank draws its own batches, and tokens/s counts every rank's real tokens: the
scaling table of benchmarks/2026-11-29-h200x2-multi-gpu.md compares this figure per GPU with the one-GPU run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockdraft.errors import UserError, check_at_least

if TYPE_CHECKING:
    from blockdraft.bench.datasets import UserData
    from blockdraft.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    from blockdraft.bench.shapes import SHAPES
    from blockdraft.bench.synthetic import MIX_MEDIAN, MIX_SIGMA
    from blockdraft.device import DEVICES

    p.add_argument("--target-shape", default="qwen3-8b", help=f"one of {', '.join(SHAPES)}")
    p.add_argument("--target", default=None,
                   help="a local model folder: its config (random weights), and its tokenizer for --data")
    p.add_argument("--lengths", default=None,
                   help="length profiles: full (all seq-len), mix (chat-like), data (the --data files); "
                        "default full,mix, or data alone with --data")
    p.add_argument("--data", nargs="+", default=None, metavar="FILE",
                   help="your training files or folders (JSONL/JSON/Parquet, as blockdraft train reads them), "
                        "tokenised with the --target folder's tokenizer: the data profile measures their real "
                        "lengths and answer masks (put dotted overrides before --data, or end the files with --)")
    p.add_argument("--seq-len", type=int, default=3072)
    p.add_argument("--micro-batch", type=int, default=2, help="token budget = micro-batch x seq-len per micro-batch")
    p.add_argument("--mix-median", type=float, default=MIX_MEDIAN, help="median sample length of the mix profile")
    p.add_argument("--mix-sigma", type=float, default=MIX_SIGMA, help="log-normal sigma of the mix profile's lengths")
    p.add_argument("--steps", type=int, default=None,
                   help="measured updates per profile (default 100 on a GPU, 20 on CPU)")
    p.add_argument("--warmup", type=int, default=None,
                   help="updates before measuring, where compilation happens (default 12 on a GPU, 6 on CPU)")
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--peak-tflops", type=float, default=None, help="for MFU; default from the GPU name")
    p.add_argument("--no-check", action="store_true", help="skip the fast-vs-plain loss check")
    p.add_argument("--profile", default=None, help="write a torch profiler table and trace of 2 steps here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. drafter.num_layers=3")


def bench_config(args: argparse.Namespace) -> Config:
    from blockdraft.config import build_config

    shape = {"max_len": args.seq_len, "tokens_per_batch": args.micro_batch * args.seq_len}
    # the data section a copy of `shape`: build_config writes the overrides into `raw`
    raw = {"target": {"path": args.target or f"<random {args.target_shape}>"}, "data": dict(shape),
           "train": {"device": args.device}}
    cfg = build_config(raw, args.overrides)
    if {k: getattr(cfg.data, k) for k in shape} != shape:
        raise UserError("set the sample length with --seq-len and the micro-batch with --micro-batch, not "
                        "with data.max_len or data.tokens_per_batch: rates, MFU and a peer's rows are of that shape")
    return cfg


def render(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    from blockdraft.telemetry.console import or_dash

    console = Console()
    env = report["env"]
    gpus = f"{env['world_size']} x " if env["world_size"] > 1 else ""
    console.print(f"[bold]blockdraft bench[/] {env['target']} on {gpus}{env['device_name']}: drafter {env['drafter']}, "
                  f"torch {env['torch']}; nominal peak {env['peak_tflops'] or '-'} TFLOP/s, "
                  f"measured bf16 matmul {or_dash(env['matmul_tflops'], '.0f')} TFLOP/s")
    if "data" in env:
        console.print(data_line(env["data"]))
    table = Table(caption="medians over the measured steps; wall = the whole window, stalls included; slow steps "
                          "(over 2x the median) and graphs compiled while measuring show recompiles")
    for col in ("lengths", "updates", "tokens/s (real)", "wall", "per GPU", "blocks/s", "blocks/1k tok", "slow steps",
                "graphs compiled", "step s", "tokens/step",
                "pad", "filler blocks", "TFLOP/s", "MFU", "MFU wall",
                "MFU target", "MFU drafter", "target share", "data wait", "peak GB", "fast vs plain"):
        table.add_column(col, justify="right")
    for r in report["profiles"]:
        check = r.get("check") or {}
        verdict = "-" if not check else ("ok" if check.get("ok") else "FAIL" if check.get("ok") is False else "n/a")
        if "loss_rel_diff" in check:
            verdict += f" ({check['loss_rel_diff']:.1e})"
        table.add_row(r["profile"], str(r["steps"]), f"{r['tokens_per_s']:,.0f}", f"{r['tokens_per_s_wall']:,.0f}",
                      f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['blocks_per_s']:,.0f}",
                      f"{r['blocks_per_1k_tokens']:.0f}", str(r["slow_steps"]), str(r["graphs_compiled"]),
                      f"{r['step_time_s']:.3f}",
                      f"{r['tokens_per_step']:,.0f}", f"{r['pad_frac']:.1%}", or_dash(r["filler_block_frac"], ".1%"),
                      f"{r['tflops']:.0f}",
                      or_dash(r["mfu"], ".1%"), or_dash(r["mfu_wall"], ".1%"), or_dash(r["mfu_target"], ".1%"),
                      or_dash(r["mfu_drafter"], ".1%"),
                      f"{r['target_time_share']:.0%}", f"{r['data_wait_share']:.1%}", or_dash(r["peak_mem_gb"], ".1f"),
                      verdict)
    console.print(table)
    stall = report["checkpoint_stall"]
    floor = f"; one device-to-host copy of the same bytes {stall['d2h_s']:.2f}s" if stall["d2h_s"] else ""
    console.print(f"checkpoint stall (staging drafter + AdamW state): first save {stall['first_s']:.2f}s, "
                  f"then {stall['steady_s']:.2f}s (pinned buffers reserved off the loop in "
                  f"{stall['reserve_s']:.2f}s){floor}")


def data_line(data: dict[str, Any]) -> str:
    """What the data profile measured: the files, the samples kept and skipped, the length mix, the cache."""
    lengths = data["lengths"]
    skipped = ", ".join(f"{n:,} {reason}" for reason, n in data["skipped"].items())
    return (f"data: {data['samples_used']:,} samples of {', '.join(data['files'])} "
            f"({data['samples_skipped']:,} skipped{': ' + skipped if skipped else ''}; "
            f"{data['truncated']:,} truncated to data.max_len), lengths median {lengths['p50']:,}, "
            f"p90 {lengths['p90']:,}, max {lengths['max']:,} tokens; cache {data['cache_path']}")


def run(args: argparse.Namespace) -> int:
    report = measure(args)
    if report is None:
        return 0
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        render(report)
    broken = [p["profile"] for p in report["profiles"] if not p["loss_finite"]]
    if broken:
        print(f"blockdraft bench: the loss was not finite in {', '.join(broken)}: those rates time a broken update",
              file=sys.stderr)
    return 1 if broken else 0


def measure(args: argparse.Namespace, stall: bool = True, data: UserData | None = None) -> dict[str, Any] | None:
    """The report as a dict (None on ranks other than the main one): bench/peer_nemo.py --ours calls
    this in the same process as its peer measurement, so their ratios come from one GPU call, with
    `stall=False`: no ratio reads the checkpoint stall, and a mix call has no seconds to spare inside a
    10-minute command; and with the `--data` files it has prepared already (`data`), not read again."""
    import torch

    from blockdraft.bench.datasets import bench_profiles, prepare_user_data
    from blockdraft.bench.measure import build_models, checkpoint_stall, matmul_tflops, nominal_peak, run_profile
    from blockdraft.bench.shapes import target_config, target_tokenizer
    from blockdraft.device import pick_device
    from blockdraft.train import distributed
    from blockdraft.train.fp8 import require_fp8, to_fp8_linears
    from blockdraft.train.hotpath import DraftForward, HotPath
    from blockdraft.train.optimizer import build_optimizer

    profiles = bench_profiles(args)
    cfg = bench_config(args)
    picked = pick_device(cfg.train.device)
    gpu = picked.type == "cuda"
    args.steps = args.steps if args.steps is not None else (100 if gpu else 20)
    args.warmup = args.warmup if args.warmup is not None else (12 if gpu else 6)
    check_at_least(args, 1, "steps", "micro_batch", "mix_median")
    check_at_least(args, 0, "warmup", "mix_sigma")
    if cfg.train.fp8_linears:
        require_fp8(picked)
    if args.profile:  # before minutes of measuring, not after
        try:
            Path(args.profile).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"--profile {args.profile}: cannot make the folder ({e.strerror})") from None
    world, device = distributed.init(picked, cfg.train.dist_timeout_s)
    hf_cfg = target_config(args.target_shape, args.target)
    tokenizer = target_tokenizer(args.target)
    if data is None and args.data:
        with distributed.main_rank_first(world.is_main):
            data = prepare_user_data(args, cfg, tokenizer, hf_cfg.vocab_size)
    torch.manual_seed(cfg.train.seed)
    target, drafter = build_models(cfg, hf_cfg, device, tokenizer)
    if cfg.train.fp8_linears:  # the fast and the plain path of the check alike
        to_fp8_linears(drafter)
    module, defer = distributed.wrap(DraftForward(drafter), cfg.train.parallel, world, device)
    hot = HotPath(target, drafter, cfg, device, module=module, defer_sync=defer)
    peak = nominal_peak(device, args.peak_tflops)
    env = {
        "target": args.target or args.target_shape,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "drafter": f"{cfg.drafter.num_layers} layers, B={cfg.drafter.block_size}, taps {drafter.target_layer_ids}, "
                   f"{cfg.train.num_anchors} anchors" + (", FP8 linears" if cfg.train.fp8_linears else ""),
        "seq_len": args.seq_len, "micro_batch": args.micro_batch, "torch": torch.__version__,
        "peak_tflops": peak, "matmul_tflops": matmul_tflops(device), "fast_path": hot.attention == "flex",
        "flex_backend": hot.flex_backend, "flex_backend_note": hot.flex_note, "fp8_linears": cfg.train.fp8_linears,
        "compile": hot.compile, "bf16": hot.use_bf16, "date": time.strftime("%Y-%m-%d"),
        "shape_classes": hot.shapes is not None, "anchors_per_token": cfg.train.anchors_per_token,
        "mix": {"median": args.mix_median, "sigma": args.mix_sigma, "max": args.seq_len},
        "world_size": world.size, "parallel": cfg.train.parallel if world.distributed else None,
    }
    if data is not None:
        env["data"] = data.describe()
    optimizer = build_optimizer(drafter.parameters(), cfg.optim, device)
    t0 = time.perf_counter()

    def progress(what: str, result: Any) -> Any:
        """One line on stderr as each part ends: a long bench that is cut off still leaves its figures."""
        if world.is_main:
            print(f"bench: {what} after {time.perf_counter() - t0:.0f}s: {json.dumps(result)}", file=sys.stderr,
                  flush=True)
        return result

    report = {"env": env, "profiles": [progress(p, run_profile(hot, optimizer, cfg, p, args, hf_cfg, peak, world,
                                                               data)) for p in profiles]}
    if stall:
        report["checkpoint_stall"] = progress("checkpoint", checkpoint_stall(hot, optimizer))
    distributed.shutdown()
    return report if world.is_main else None
