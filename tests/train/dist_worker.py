"""Run by tests/train/test_distributed.py, under torchrun (2 ranks) or alone: K updates on fixed
micro-batches, then the per-step losses and the whole drafter are written for the test to compare.

`python dist_worker.py CONFIG.json OUT MODE...`: each MODE (ddp, fsdp, or either with `+fp8` for
`train.fp8_linears` on the CPU) trains fresh Trainers with 1 and with 2 micro-batches per rank. Update
k of a run of G micro-batches per update (over all ranks) uses `fixed_batch` kG .. kG+G-1, in rank
order: rank r takes its run of consecutive ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from blockdraft.config import Config
from blockdraft.data.prefetch import Batch
from blockdraft.train import distributed, loop
from blockdraft.train.loop import Trainer

STEPS = 3
SHAPES = [(2, 40), (3, 24)]  # (rows, width) of even and odd micro-batches: ranks hold unequal token counts


def fixed_batch(trainer: Trainer, index: int) -> Batch:
    """Micro-batch `index`: real rows of the corpus, cut to one width, every token a loss token."""
    n, width = SHAPES[index % 2]
    rows, i = [], 7 * index
    while len(rows) < n:
        ids, _ = trainer.dataset.sample(i % len(trainer.dataset.lengths))
        if len(ids) >= width:
            rows.append(torch.tensor(ids[:width], dtype=torch.long))
        i += 1
    ids = torch.stack(rows)
    batch = Batch(input_ids=ids, loss_mask=torch.ones_like(ids, dtype=torch.bool), lengths=torch.full((n,), width),
                  sample_ids=list(range(n)), bucket=0, epoch=0, index_in_epoch=index, epoch_progress=0.0,
                  real_tokens=n * width, padded_tokens=n * width)
    return trainer.hot.to_device(trainer.hot.prepare(batch))


def train_fixed(cfg: Config, per_rank: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(loss of each update, the whole drafter afterwards) on every rank."""
    trainer = Trainer(cfg, show_console=False)
    trainer.prefetcher.close()
    losses = []
    for k in range(STEPS):
        first = (k * trainer.world + trainer.rank) * per_rank
        rec = trainer.train_step([fixed_batch(trainer, i) for i in range(first, first + per_rank)])
        assert not rec["skipped"], rec
        losses.append(rec["loss"])
    return losses, distributed.full_drafter_state(trainer.drafter)


def main(config_file: str, out: str, modes: list[str]) -> None:
    cfg = Config.model_validate_json(Path(config_file).read_text())
    world, _ = distributed.init(torch.device("cpu"), cfg.train.dist_timeout_s)
    results = {}
    for mode in modes:
        cfg.train.parallel, fp8 = mode.split("+")[0], mode.endswith("+fp8")
        cfg.train.fp8_linears = fp8
        if fp8:
            loop.require_fp8 = lambda device: None  # torchao's FP8 layers run on the CPU; the trainer refuses it
        for per_rank in (1, 2):
            losses, weights = train_fixed(cfg, per_rank)
            results[f"{mode}-{per_rank}"] = losses
            if world.is_main:
                torch.save(weights, f"{out}-{mode}-{per_rank}.pt")
    if world.is_main:
        Path(f"{out}.json").write_text(json.dumps(results))
    distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
