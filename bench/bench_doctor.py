"""Benchmarks for `blockdraft doctor`.

speed:   analyse a synthetic log of N step records end to end (read + parse + all detectors);
         the target is 1,000,000 records in <= 20 s on the 2-core dev box.
quality: plant each anomaly in many synthetic runs and measure recall per code, plus the
         false-alarm rate on clean runs (any warning/error is a false alarm there).

  PYTHONPATH=src python bench/bench_doctor.py speed --records 1000000
  PYTHONPATH=src python bench/bench_doctor.py quality --seeds 30
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from blockdraft.doctor.detectors import diagnose
from blockdraft.doctor.fields import parse_mapping
from blockdraft.doctor.findings import at_least
from blockdraft.doctor.readers import load_run
from blockdraft.doctor.records import parse_log_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.doctor import synthetic  # noqa: E402  (the log generator is a test fixture, not package code)

# A planted anomaly may legitimately bring these along (the same incident seen from another side).
CONSEQUENCES = {
    "window_artifact": {"logging_gap", "loss_spike"},
    "checkpoint_stall": {"logging_gap"},
    "data_wait": {"queue_drain", "throughput_drift"},
    "optimizer_betas": {"loss_spike"},
    "accuracy_cliff": {"loss_spike", "plateau"},
    "homogeneous_batches": {"bucket_loss_modes", "loss_spike"},
    "lr_schedule_mismatch": {"warmup_first_step", "plateau", "loss_spike"},
    "skipped_steps": set(),
    "plateau": {"lr_schedule_mismatch"},
    "nonfinite": {"skipped_steps"},
    "epoch_accounting": {"lr_schedule_mismatch"},
}


def bench_speed(records: int, keep: Path) -> dict[str, float]:
    path = keep / f"log-{records}.jsonl"
    if not path.exists():
        t0 = time.perf_counter()
        run = synthetic.generate(
            4242,
            anomalies=[
                "homogeneous_batches",
                "accuracy_cliff",
                "loss_spike",
                "nonfinite",
                "queue_drain",
                "loss_decay_gamma",
            ],
            n_steps=records,
            style="ours",
        )
        run.write(path)
        print(
            f"generated {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    run = load_run(path)
    t1 = time.perf_counter()
    findings = diagnose(run)
    t2 = time.perf_counter()
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "records": len(run.steps),
        "load_s": t1 - t0,
        "analyse_s": t2 - t1,
        "total_s": t2 - t0,
        "cpu_s": _cpu_seconds() - cpu0,
        "load_average_1min": os.getloadavg()[0],
        "findings": len(findings),
        "peak_rss_mb": peak_mb,
    }


def _cpu_seconds() -> float:
    """CPU time of this process: the figure other jobs on the shared box do not inflate."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _analyse(run: synthetic.SyntheticRun) -> list:
    data = ("\n".join(run.lines()) + "\n").encode()
    return diagnose(parse_log_bytes(data, parse_mapping(run.mapping)))


def bench_quality(seeds: int, clean_seeds: int, first_seed: int = 0) -> dict[str, dict[str, float]]:
    recall: collections.Counter = collections.Counter()
    planted: collections.Counter = collections.Counter()
    extra: collections.Counter = collections.Counter()
    clean_alarm: collections.Counter = collections.Counter()
    clean_info: collections.Counter = collections.Counter()
    clean_runs_with_alarm = 0
    misses = []
    clean_styles: collections.Counter = collections.Counter()
    for seed in range(first_seed, first_seed + clean_seeds):
        clean = synthetic.generate(10_000 + seed)
        clean_styles[clean.style] += 1
        found = _analyse(clean)
        alarms = [f for f in found if at_least(f.severity, "warning")]
        clean_runs_with_alarm += bool(alarms)
        for f in alarms:
            misses.append(("clean", seed, f.code, f.summary))
        for f in found:
            (clean_alarm if at_least(f.severity, "warning") else clean_info)[f.code] += 1
    for seed in range(first_seed, first_seed + seeds):
        for code in synthetic.ANOMALIES:
            run = synthetic.generate(seed, anomalies=[code])
            found = _analyse(run)
            codes = {p.code for p in run.planted}
            for p in run.planted:
                planted[p.code] += 1
                if any(synthetic.matches(p, f) for f in found):
                    recall[p.code] += 1
                else:
                    misses.append((seed, code, run.style))
            allowed = codes | CONSEQUENCES.get(code, set())
            for f in found:
                if at_least(f.severity, "warning") and f.code not in allowed:
                    extra[f.code] += 1
    runs_total = seeds * len(synthetic.ANOMALIES)
    per_code = {}
    for code in sorted(set(planted) | set(clean_alarm) | set(extra)):
        per_code[code] = {
            "recall": recall[code] / planted[code] if planted[code] else float("nan"),
            "planted": planted[code],
            "clean_false_alarm_rate": clean_alarm[code] / clean_seeds,
            "clean_info_rate": clean_info[code] / clean_seeds,
            "unrelated_alarm_rate": extra[code] / runs_total,
        }
    summary = {
        "clean_runs": clean_seeds,
        "clean_styles": dict(clean_styles),
        "clean_runs_with_warning_or_error": clean_runs_with_alarm,
        "planted_runs": runs_total,
        "misses": misses,
    }
    return {"per_code": per_code, "summary": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sp = sub.add_parser("speed")
    sp.add_argument("--records", type=int, default=1_000_000)
    sp.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "blockdraft-bench")
    sq = sub.add_parser("quality")
    sq.add_argument("--seeds", type=int, default=30)
    sq.add_argument("--clean", type=int, default=100, help="clean runs for the false-alarm rate")
    sq.add_argument("--first-seed", type=int, default=0)
    args = parser.parse_args()
    if args.what == "speed":
        args.keep.mkdir(parents=True, exist_ok=True)
        print(json.dumps(bench_speed(args.records, args.keep), indent=2))
        return 0
    result = bench_quality(args.seeds, args.clean, args.first_seed)
    print(f"{'code':22s} {'recall':>8s} {'planted':>8s} {'clean FA':>9s} {'clean info':>10s} {'unrelated':>10s}")
    for code, row in result["per_code"].items():
        print(
            f"{code:22s} {row['recall']:8.3f} {row['planted']:8d} {row['clean_false_alarm_rate']:9.3f} "
            f"{row['clean_info_rate']:10.3f} {row['unrelated_alarm_rate']:10.4f}"
        )
    s = result["summary"]
    print(
        f"clean runs with any warning/error: {s['clean_runs_with_warning_or_error']}/{s['clean_runs']} "
        f"(styles {s['clean_styles']})"
    )
    print(f"planted runs: {s['planted_runs']}")
    for miss in s["misses"]:
        print("miss:", miss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
