"""`blockdraft ckpt-scan PATH`: statistics and NaN/Inf counts of every tensor in a checkpoint.

Why: "was the checkpoint already poisoned?" must be answerable in seconds, on any machine, without
the run's config or the target model. Reads the drafter weights and the optimizer state directly;
exit code 1 if any value is non-finite or a file no longer matches its COMMITTED manifest.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a checkpoint folder, a run folder or its checkpoints/ folder (newest complete one)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def tensor_stats(name: str, t: Any) -> dict[str, Any]:
    """Statistics over the finite values (in float64), plus how many values are NaN or +-Inf."""
    import torch

    row: dict[str, Any] = {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                           "numel": t.numel(), "nan": 0, "inf": 0, "min": None, "max": None, "mean": None,
                           "std": None}
    if t.numel() == 0 or t.dtype == torch.bool:
        return row
    x = t.detach().to(torch.float64).flatten()
    if t.is_floating_point() or t.is_complex():
        row["nan"] = int(torch.isnan(x).sum())
        row["inf"] = int(torch.isinf(x).sum())
        x = x[torch.isfinite(x)]
    if x.numel():
        stats = {"min": float(x.min()), "max": float(x.max()), "mean": float(x.mean()),
                 "std": float(x.std()) if x.numel() > 1 else 0.0}
        row.update({k: v if math.isfinite(v) else None for k, v in stats.items()})  # huge values can overflow
    return row


def scan(path: Path) -> dict[str, Any]:
    from blockdraft.errors import UserError
    from blockdraft.train.checkpoint import read_state, resolve_checkpoint, tensors_in, verify_checkpoint

    ckpt = resolve_checkpoint(path)
    damaged = None
    try:
        verify_checkpoint(ckpt)
    except UserError as exc:
        damaged = str(exc)
    state = read_state(ckpt)  # the shards of every rank, gathered here, in this process alone
    tensors = tensors_in(state["model"], "drafter") + tensors_in(state.get("optim", {}).get("state", {}), "optimizer")
    rows = [tensor_stats(name.removeprefix("drafter."), t) for name, t in tensors]
    bad = [r["name"] for r in rows if r["nan"] or r["inf"]]
    return {"path": str(ckpt), "tensors": rows, "nonfinite_tensors": bad, "damaged": damaged}


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Column, Table

    from blockdraft.telemetry.console import or_dash

    numbers = (Column(c, justify="right") for c in ("min", "max", "mean", "std", "NaN", "Inf"))
    table = Table("tensor", "shape", "dtype", *numbers, title=report["path"], title_justify="left")
    for r in report["tensors"]:
        style = "bold red" if r["nan"] or r["inf"] else None
        table.add_row(r["name"], "x".join(map(str, r["shape"])) or "scalar", r["dtype"],
                      *(or_dash(r[k], ".4g") for k in ("min", "max", "mean", "std")), str(r["nan"]), str(r["inf"]),
                      style=style)
    console = Console()
    console.print(table)
    bad = report["nonfinite_tensors"]
    if report["damaged"]:
        console.print(f"[bold red]{report['damaged']}[/]")
    if bad:
        console.print(f"[bold red]{len(bad)} of {len(report['tensors'])} tensors hold NaN or Inf: {', '.join(bad)}[/]")
    elif not report["damaged"]:
        console.print(f"[green]all {len(report['tensors'])} tensors are finite[/]")


def run(args: argparse.Namespace) -> int:
    report = scan(Path(args.path))
    if args.json:
        print(json.dumps(report))
    else:
        _print_table(report)
    return 1 if report["nonfinite_tensors"] or report["damaged"] else 0
