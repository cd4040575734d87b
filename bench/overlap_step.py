"""The optimizer step of one update beside the next update's target forward, on two CUDA streams.

Why: the frozen target does not read the drafter's weights, so update k+1's target forward need not wait
for update k's AdamW step. On an H100 the step takes 11.4 ms of a 390 ms full-length Qwen3-8B-shaped
update and reads and writes memory while the target's GEMMs are bound by arithmetic
(benchmarks/2026-12-07-h100-auto-flash-attention-and-rope-on-the-gpu.md, section 4). Whether the GPU
runs the two side by side, and how much of the step that hides, decides whether the training loop should
be built to do it. This measures it on the bench's shapes, with random weights and gradients:
- the step alone (fused AdamW over the drafter's parameters, as `train.optimizer` builds it);
- the target forward alone (its tapped layers, compiled, as training runs them, on micro-batch x seq-len tokens);
- one after the other, on one stream;
- both at once: the forward on a side stream, the step on the main one.
`hidden_ms` is sequential minus concurrent: what an update would save. Median of `--calls` after 3,
CUDA events. Prints one JSON object.

    PYTHONPATH=src python3 bench/overlap_step.py [--target-shape qwen3-8b] [--seq-len 3072] [--micro-batch 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

import torch

from blockdraft.bench.measure import build_models, cuda_median_ms
from blockdraft.bench.shapes import SHAPES, target_config
from blockdraft.config import build_config
from blockdraft.errors import exit_script
from blockdraft.train.optimizer import build_optimizer


def pieces(shape: str, seq_len: int, micro_batch: int, device: torch.device) -> tuple[Callable, Callable]:
    """(target forward, optimizer step) on the bench's models: the target's taps for a random
    [micro_batch, seq_len] batch, and one AdamW step of the drafter on random gradients."""
    cfg = build_config({"target": {"path": f"<random {shape}>"}}, [])  # the bench's drafter and AdamW
    hf_cfg = target_config(shape, None)
    target, drafter = build_models(cfg, hf_cfg, device)
    if device.type == "cuda":
        target.compile_features()
    params = [p for p in drafter.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    optimizer = build_optimizer(params, cfg.optim, device)
    ids = torch.randint(0, hf_cfg.vocab_size, (micro_batch, seq_len), device=device)
    return (lambda: target.features(ids)[0]), optimizer.step


def side_by_side(forward: Callable[[], torch.Tensor], step: Callable[[], object]) -> Callable[[], torch.Tensor]:
    """The forward on a side stream, the step on the current one; the current stream waits for both."""
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()

    def both() -> torch.Tensor:
        side.wait_stream(main)
        with torch.cuda.stream(side):
            taps = forward()
        step()
        main.wait_stream(side)
        taps.record_stream(main)
        return taps

    return both


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target-shape", default="qwen3-8b", help=f"one of {', '.join(SHAPES)}")
    p.add_argument("--seq-len", type=int, default=3072)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: overlap_step.py needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    device = torch.device("cuda", torch.cuda.current_device())
    forward, step = pieces(args.target_shape, args.seq_len, args.micro_batch, device)
    alone = forward()
    ms = {"step": cuda_median_ms(step, args.calls), "target_forward": cuda_median_ms(forward, args.calls),
          "sequential": cuda_median_ms(lambda: (step(), forward()), args.calls),
          "concurrent": cuda_median_ms(side_by_side(forward, step), args.calls)}
    same = bool(torch.equal(side_by_side(forward, step)(), alone))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.target_shape,
              "tokens": args.seq_len * args.micro_batch, "ms": ms, "hidden_ms": ms["sequential"] - ms["concurrent"],
              "hidden_share_of_step": (ms["sequential"] - ms["concurrent"]) / ms["step"],
              "taps_equal_alone": same}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    exit_script(main)
