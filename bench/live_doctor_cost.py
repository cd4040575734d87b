"""What the live doctor costs the training thread, per update, on a synthetic record stream.

Three ways over the same stream (a synthetic run's records, written to log.jsonl as the trainer
writes them; the write itself is not counted, it is the same in all three):
  none    no live doctor
  inline  the old way: `LiveDoctor.observe` on every record inside the log writer (analysis every
          50 step records, whatever the time)
  hook    `LiveDoctorHook`: each update's records, queued by a sink of the log, judged alone, the
          analysis at most every 50 updates and 30 s of (simulated) training time
Each prints the mean cost per update, the worst single update, and the share of an update of
`--update-s` seconds (0.13 s: the demo's CPU update).

  PYTHONPATH=src python bench/live_doctor_cost.py --steps 6000 --update-s 0.13
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from blockdraft.doctor.live import LiveDoctor  # noqa: E402
from blockdraft.telemetry.log import RunLog  # noqa: E402
from blockdraft.train.hooks import LiveDoctorHook, StepEnd  # noqa: E402
from tests.doctor import synthetic  # noqa: E402  (the log generator is a test fixture, not package code)


def _stream(steps: int, seed: int, anomalies: list[str]) -> list[dict]:
    run = synthetic.generate(seed, anomalies=anomalies, n_steps=steps, style="ours")
    return [json.loads(json.dumps(r)) for r in run.records]


def _run(mode: str, records: list[dict], update_s: float, folder: Path) -> tuple[list[float], list[str]]:
    """Per-update seconds spent on the live doctor, and the findings it reported (code:severity)."""
    log = RunLog(folder / f"{mode}.jsonl")
    clock = [0.0]
    trainer = SimpleNamespace(log=log, step=0, console=SimpleNamespace(note=lambda *a, **k: None))
    hook = LiveDoctorHook(trainer, clock=lambda: clock[0]) if mode == "hook" else None
    doctor = LiveDoctor() if mode == "inline" else None
    if hook is not None:
        hook.on_start()
    costs, found, pending = [], [], 0.0
    for rec in records:
        fields = {k: v for k, v in rec.items() if k not in ("kind", "step", "time")}
        written = log.write(rec.get("kind", "step"), int(rec.get("step", 0)), **fields)
        t0 = time.perf_counter()
        if doctor is not None:
            found += [f"{f.code}:{f.severity}" for f in doctor.observe(written)]
        if hook is not None and written["kind"] == "step":
            clock[0] += update_s
            trainer.step = written["step"]
            hook.on_step_end(StepEnd(written, [], update_s, None))
        pending += time.perf_counter() - t0
        if written["kind"] == "step":
            costs.append(pending)
            pending = 0.0
    log.close()
    if hook is not None:
        found = [f"{r['code']}:{r['severity']}" for r in map(json.loads, log.path.read_text().splitlines())
                 if r["kind"] == "warning" and "advice" in r]
    return costs, found


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--update-s", type=float, default=0.13)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--anomaly", action="append", default=None,
                   help="planted in the stream (default homogeneous_batches)")
    args = p.parse_args()
    records = _stream(args.steps, args.seed, args.anomaly or ["homogeneous_batches"])
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("none", "inline", "hook"):
            costs, found = _run(mode, records, args.update_s, Path(tmp))
            mean, worst = sum(costs) / len(costs), sorted(costs)[-3:]
            share = 100 * mean / args.update_s
            print(f"{mode:6s} {len(costs)} updates: mean {mean * 1e6:7.1f} us/update ({share:.3f}% "
                  f"of a {args.update_s:g} s update), worst 3 {[round(w * 1e3, 1) for w in worst]} ms, "
                  f"findings {sorted(found)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
