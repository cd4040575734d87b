"""Atomic checkpoints: a crash at any moment never leaves a checkpoint that a resume could pick.

Layout: RUN/checkpoints/step-000200/
  drafter.safetensors   fp32 master weights (unprefixed names, as in the export)
  drafter_config.json   the drafter's Qwen3Config (enough to export without the target)
  optimizer.pt          AdamW state
  trainer.pt            step, data position, RNG states, skip list (plain Python + tensors)
  trainer.json          the same scalars, human-readable, plus the resolved config
  COMMITTED             written last: its presence is the only proof a checkpoint is complete

Order: write everything into `.tmp-step-000200/`, fsync each file and the folder, rename the folder
into place, fsync the parent, write COMMITTED (fsync), then point `latest` at it (a symlink swapped
atomically) and prune old checkpoints beyond keep_last. Resume trusts only COMMITTED folders.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from blockdraft.errors import UserError

MARKER = "COMMITTED"


@dataclass
class SavedCheckpoint:
    path: Path
    bytes: int
    write_s: float


def _fsync_file(path: Path) -> None:
    with path.open("rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def committed_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.glob("step-*") if p.is_dir() and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    drafter_state: dict[str, torch.Tensor],
    drafter_config: dict[str, Any],
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    trainer_info: dict[str, Any],
    keep_last: int,
) -> SavedCheckpoint:
    t0 = time.time()
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / step_dir_name(step)
    tmp = ckpt_root / f".tmp-{final.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in drafter_state.items()}, tmp / "drafter.safetensors")
    (tmp / "drafter_config.json").write_text(json.dumps(drafter_config, indent=2))
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "trainer.json").write_text(json.dumps(trainer_info, indent=2, default=str))
    size = 0
    for f in tmp.iterdir():
        _fsync_file(f)
        size += f.stat().st_size
    _fsync_dir(tmp)
    if final.exists():  # an uncommitted leftover of an earlier crash at this very step
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    marker = final / MARKER
    marker.write_text(f"{step}\n")
    _fsync_file(marker)
    _fsync_dir(final)
    _point_latest(ckpt_root, final)
    _prune(ckpt_root, keep_last)
    return SavedCheckpoint(final, size, time.time() - t0)


def _point_latest(ckpt_root: Path, target: Path) -> None:
    link = ckpt_root / "latest"
    tmp_link = ckpt_root / ".latest.tmp"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(target.name)
    os.replace(tmp_link, link)
    _fsync_dir(ckpt_root)


def _prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete the oldest committed checkpoints beyond keep_last, and stale temp folders."""
    for old in committed_checkpoints(ckpt_root)[:-keep_last]:
        (old / MARKER).unlink()  # un-commit first: a crash mid-delete leaves no half checkpoint
        shutil.rmtree(old)
    for stale in ckpt_root.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder, a run folder or a checkpoints folder -> the newest COMMITTED checkpoint."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint path not found: {path}")
    if (path / MARKER).is_file():
        return path.resolve()
    for root in (path / "checkpoints", path):
        found = committed_checkpoints(root)
        if found:
            return found[-1]
    if (path / "drafter.safetensors").is_file():
        raise UserError(f"{path} is an incomplete checkpoint (no {MARKER} marker): it was never finished")
    raise UserError(f"no complete checkpoint under {path}")


@dataclass
class LoadedCheckpoint:
    path: Path
    drafter_state: dict[str, torch.Tensor]
    drafter_config: dict[str, Any]
    optimizer_state: dict[str, Any] | None
    trainer_state: dict[str, Any] | None


def load_checkpoint(path: Path, with_training_state: bool = True) -> LoadedCheckpoint:
    path = resolve_checkpoint(path)
    try:
        drafter_state = load_file(path / "drafter.safetensors")
        drafter_config = json.loads((path / "drafter_config.json").read_text())
        optimizer_state = trainer_state = None
        if with_training_state:
            optimizer_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
            trainer_state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError, json.JSONDecodeError) as exc:
        raise UserError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None
    return LoadedCheckpoint(path, drafter_state, drafter_config, optimizer_state, trainer_state)
