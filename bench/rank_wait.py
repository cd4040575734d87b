"""How long data-parallel ranks wait for each other per update, under a given batch plan.

Run under torchrun (gloo on CPU). Each update: a barrier, then this rank's forward and backward of its
micro-batches with the gradient sync deferred (no collective inside), then a barrier again. The time
between a rank's end of compute and the second barrier is what it would wait at the update's
all-reduce for the slowest rank. Uses only the Trainer API that the batch plan before issue 20 had too,
so the same script measures the old plan (PYTHONPATH at an export of that source) and the new one.

  OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 bench/rank_wait.py CONFIG OUT.json \
      --updates 40 [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from blockdraft.config import load_config
from blockdraft.train.blocks import sample_blocks
from blockdraft.train.loop import Trainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("out", type=Path)
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args()
    trainer = Trainer(load_config(args.config, args.overrides), show_console=False)
    hot, cfg = trainer.hot, trainer.cfg
    rows = []
    for k in range(args.warmup + args.updates):
        micro = [hot.to_device(trainer.prefetcher.next()) for _ in range(cfg.train.grad_accum)]
        dist.barrier()
        t0 = time.perf_counter()
        with hot.defer_sync():
            for mb in micro:
                for i, part in enumerate(mb.passes):
                    g = torch.Generator().manual_seed(k * 1000 + i)
                    blocks = sample_blocks(part.packed, cfg.drafter.block_size, cfg.train.num_anchors,
                                           trainer.drafter.mask_token_id, g)
                    hot.micro_stats(part, blocks, 0.0, g).weighted_loss.backward()
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        trainer.optimizer.zero_grad(set_to_none=True)
        if k >= args.warmup:
            rows.append({"compute": t1 - t0, "wait": t2 - t1, "step": t2 - t0, "buckets": [mb.bucket for mb in micro],
                         "tokens": sum(mb.real_tokens for mb in micro), "passes": sum(len(mb.passes) for mb in micro)})
    trainer.prefetcher.close()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    if dist.get_rank() == 0:
        updates = list(zip(*gathered, strict=True))  # per update: each rank's row
        step = [max(r["step"] for r in u) for u in updates]
        wait = [statistics.mean(r["wait"] for r in u) for u in updates]  # mean over ranks
        mixed = [len({b for r in u for b in r["buckets"]}) > 1 for u in updates]
        summary = {
            "updates": len(updates),
            "world_size": dist.get_world_size(),
            "mean_step_s": statistics.mean(step),
            "mean_wait_s": statistics.mean(wait),
            "wait_share": sum(wait) / sum(step),
            "p90_wait_share": sorted(w / s for w, s in zip(wait, step, strict=True))[int(0.9 * len(step))],
            "share_multi_bucket": statistics.mean(mixed),
            "per_update": [[{k: v for k, v in r.items()} for r in u] for u in updates],
        }
        args.out.write_text(json.dumps(summary))
        print(json.dumps({k: v for k, v in summary.items() if k != "per_update"}))
    dist.barrier()  # no rank tears the group down while another still writes
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
