"""Two runs' per-step records side by side: the largest loss difference over the common steps, and
whether every step trained on the same micro-batches (buckets, tokens, samples).

  python bench/compare_logs.py RUN_A RUN_B
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def steps(run: Path) -> dict[int, dict]:
    records = (json.loads(line) for line in (run / "log.jsonl").read_text().splitlines())
    return {r["step"]: r for r in records if r["kind"] == "step"}


def main(a: str, b: str) -> None:
    sa, sb = steps(Path(a)), steps(Path(b))
    common = sorted(set(sa) & set(sb))
    diffs = [abs(sa[k]["loss"] - sb[k]["loss"]) for k in common]
    same = all((sa[k]["buckets"], sa[k]["tokens"], sa[k]["samples"]) == (sb[k]["buckets"], sb[k]["tokens"],
                                                                        sb[k]["samples"]) for k in common)
    worst = max(range(len(common)), key=lambda i: diffs[i])
    print(json.dumps({"steps": len(common), "max_abs_loss_diff": max(diffs), "at_step": common[worst],
                      "step1_loss": [sa[common[0]]["loss"], sb[common[0]]["loss"]],
                      "last_loss": [sa[common[-1]]["loss"], sb[common[-1]]["loss"]], "same_micro_batches": same}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", metavar="RUN_A")
    ap.add_argument("run_b", metavar="RUN_B")
    args = ap.parse_args()
    main(args.run_a, args.run_b)
