"""Share of the per-update loss's variance explained by length bucket (eta squared), from a run's log.

The loss falls as training goes on, so the trend is taken out first: a degree-4 polynomial fit of
log(loss) on log(step); eta^2 = variance of the per-group means of the residual (weighted by group
size) / variance of the residual. An update's group is its most frequent bucket (ties: the larger id),
which for one-bucket updates is simply their bucket.

  python bench/bucket_eta2.py RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np


def eta2(run: Path, skip: int = 10) -> dict[str, float]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step" and not r["skipped"]][skip:]
    x = np.log([r["step"] for r in steps])
    y = np.log([r["loss"] for r in steps])
    resid = y - np.polyval(np.polyfit(x, y, 4), x)
    groups = np.asarray([max(Counter(r["buckets"]).items(), key=lambda kv: (kv[1], kv[0]))[0] for r in steps])
    between = sum((groups == g).sum() * (resid[groups == g].mean() - resid.mean()) ** 2 for g in np.unique(groups))
    multi = np.mean([len(set(r["buckets"])) > 1 for r in steps])
    return {"updates": len(steps), "eta2": float(between / (len(resid) * resid.var())),
            "resid_std": float(resid.std()), "share_multi_bucket": float(multi)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run folders, each with its log.jsonl")
    for run in ap.parse_args().runs:
        print(run, json.dumps(eta2(run)))
