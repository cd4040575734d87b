"""The rank wait the cost model predicts for a batch plan: per update, each rank's summed micro-batch
FLOPs; a rank waits (max - its own); reported as the mean share of the update (1 - mean / max). Plans
compared on one dataset: this tree's (FLOPs and padded-token budgets) and, with --old-batching, the
batch plan before issue 20 (its batching.py, loaded from an export of that source).

  python bench/predicted_wait.py FILE --target DIR --config RUN.yaml --world-size 8 \
      [--old-batching /tmp/old/src/blockdraft/data/batching.py] [data.key=value ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import numpy as np

from blockdraft.config import default_layer_ids, load_config
from blockdraft.data.batching import BatchSampler, batch_cost
from blockdraft.data.cache import prepare_dataset
from blockdraft.data.cost import dataset_costs
from blockdraft.model.tokenizer import load_tokenizer


def wait_share(per_rank: list[list[np.ndarray]], costs) -> dict[str, float]:
    """per_rank[r][k]: sample ids of rank r's k-th micro-batch, one per update (grad_accum 1)."""
    rank_costs = np.asarray([[batch_cost(ids, costs) for ids in plan] for plan in per_rank])  # [W, U]
    waits = 1 - rank_costs.mean(axis=0) / rank_costs.max(axis=0)
    return {"updates": rank_costs.shape[1], "mean_wait_share": round(float(waits.mean()), 4),
            "p90_wait_share": round(float(np.percentile(waits, 90)), 4)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--target", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--old-batching")
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args()
    cfg = load_config(args.config, [f"data.train_files=[{args.file}]", *args.overrides])
    dataset, _ = prepare_dataset(cfg.data, load_tokenizer(args.target))
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(args.target)
    layer_ids = cfg.drafter.target_layer_ids or default_layer_ids(hf.num_hidden_layers, cfg.drafter.num_taps)
    flops = dataset_costs(dataset, hf, cfg, layer_ids)
    w, out = args.world_size, {}
    for name, costs in (("flops budget", flops), ("token budget", None)):
        plans = [[b.sample_ids for b in BatchSampler(dataset.lengths, cfg.data, 0, r, w, costs=costs).plan(0)]
                 for r in range(w)]
        out[f"mixed updates, {name}"] = wait_share(plans, flops)
    if args.old_batching:
        spec = importlib.util.spec_from_file_location("old_batching", args.old_batching)
        old = importlib.util.module_from_spec(spec)
        sys.modules["old_batching"] = old  # dataclasses look their module up there
        spec.loader.exec_module(old)
        plans = [[b.sample_ids for b in old.BatchSampler(dataset.lengths, cfg.data, 0, r, w).plan(0)]
                 for r in range(w)]
        out["one-bucket updates (before), token budget"] = wait_share(plans, flops)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
