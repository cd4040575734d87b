"""Atomic checkpoints: a crash at any moment never leaves a checkpoint that a resume could pick.

Layout: RUN/checkpoints/step-000200/
  drafter.safetensors   fp32 master weights (unprefixed names, as in the export)
  drafter_config.json   the drafter's Qwen3Config (enough to export without the target)
  optimizer.pt          AdamW state
  trainer.pt            the trainer's stateful parts by name (train state, data position and skip
                        list, RNG, guard windows, time-budget plan): plain Python + tensors
  trainer.json          step, schedule and skip list, human-readable, plus the resolved config
  COMMITTED             written last: its presence is the only proof a checkpoint is complete

Order: write everything into `.tmp-step-000200/`, fsync each file and the folder, rename the folder
into place, fsync the parent, write COMMITTED (fsync), then point `latest` at it (a symlink swapped
atomically) and prune old checkpoints beyond keep_last. Resume trusts only COMMITTED folders.

Asynchronous saves (`Checkpointer`, the trainer's one entry point): a consistent snapshot is staged
into host memory between two steps (`Stager`, pinned and reused buffers for GPU tensors) and
written with the protocol above in a background thread while training goes on; at most one save
is in flight, so the only time the loop is held is the wait for the previous save (if still
running) plus the copy.

Data-parallel runs: drafter.safetensors and optimizer.pt are replaced by DCP's files (`.metadata`
+ one `__R_0.distcp` per rank), written by every rank into the same temp folder (on a file system
every rank sees); rank 0 adds the other files and commits as above. DCP records each tensor's
global shape and shards, so a resume at any world size (1 included) reads exactly the slices it
needs, and `load_checkpoint(..., with_training_state=False)` gathers the full drafter for export.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from blockdraft.errors import UserError
from blockdraft.train.staging import Stager

MARKER = "COMMITTED"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index: marks a sharded checkpoint


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


def save_checkpoint(ckpt_root: Path, step: int, drafter_state: dict[str, torch.Tensor], drafter_config: dict[str, Any],
                    optimizer_state: dict[str, Any], trainer_state: dict[str, Any], trainer_info: dict[str, Any],
                    keep_last: int) -> SavedCheckpoint:
    t0 = time.time()
    tmp = _fresh_tmp(ckpt_root, step)
    try:
        manifest = _write_files(tmp, drafter_state, drafter_config, optimizer_state, trainer_state, trainer_info)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (full disk) leaves nothing behind
        raise
    path, size = _commit(ckpt_root, tmp, step, manifest, keep_last)
    return SavedCheckpoint(path, size, time.time() - t0)


def _fresh_tmp(ckpt_root: Path, step: int) -> Path:
    """An empty temp folder for the save of `step` (a leftover of a crash is removed)."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".tmp-{step_dir_name(step)}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _commit(ckpt_root: Path, tmp: Path, step: int, manifest: dict[str, tuple[int, int]], keep_last: int
            ) -> tuple[Path, int]:
    """Rename the sealed temp folder into place, then COMMITTED, `latest` and pruning."""
    final = ckpt_root / step_dir_name(step)
    if final.exists():  # an uncommitted leftover of an earlier crash at this very step
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_root)
    marker = final / MARKER
    marker.write_text(json.dumps({"step": step, "files": manifest}))
    _fsync_file(marker)
    _fsync_dir(final)
    _point_latest(ckpt_root, final)
    _prune(ckpt_root, keep_last)
    return final, sum(size for size, _ in manifest.values())


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _write_files(tmp: Path, drafter_state: dict[str, torch.Tensor], drafter_config: dict[str, Any],
                 optimizer_state: dict[str, Any], trainer_state: dict[str, Any], trainer_info: dict[str, Any],
                 ) -> dict[str, tuple[int, int]]:
    """Write and fsync every file; returns {name: (bytes, crc32)} for the COMMITTED manifest."""
    save_file({k: v.contiguous() for k, v in drafter_state.items()}, tmp / "drafter.safetensors")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    _write_meta(tmp, drafter_config, trainer_state, trainer_info)
    return _seal(tmp)


def _write_meta(tmp: Path, drafter_config: dict[str, Any], trainer_state: dict[str, Any],
                trainer_info: dict[str, Any]) -> None:
    (tmp / "drafter_config.json").write_text(json.dumps(drafter_config, indent=2))
    torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / "trainer.json").write_text(json.dumps(trainer_info, indent=2, default=str))


def _seal(tmp: Path) -> dict[str, tuple[int, int]]:
    """fsync every file of the folder and the folder itself; {name: (bytes, crc32)}."""
    manifest = {}
    for f in sorted(tmp.iterdir()):
        _fsync_file(f)
        manifest[f.name] = (f.stat().st_size, _crc32(f))
    _fsync_dir(tmp)
    return manifest


def verify_checkpoint(path: Path) -> None:
    """Raise UserError if a file of a committed checkpoint is missing, truncated or altered since the
    save (its size or CRC32 differs from the COMMITTED manifest). Markers without a manifest pass."""
    try:
        manifest = json.loads((path / MARKER).read_text()).get("files", {})
    except (json.JSONDecodeError, AttributeError):
        return
    for name, (size, crc) in manifest.items():
        f = path / name
        if not f.is_file():
            raise UserError(f"checkpoint {path} is damaged: {name} is missing")
        if f.stat().st_size != size:
            raise UserError(f"checkpoint {path} is damaged: {name} has {f.stat().st_size} bytes, {size} were saved")
        if _crc32(f) != crc:
            raise UserError(f"checkpoint {path} is damaged: {name} does not match its checksum")


class Checkpointer:
    """`save` stages the state and writes it in a background thread (one save in flight); `poll`
    hands a finished save's record to the training thread (only that thread writes the log);
    `newest` finds what a resume reads. Data-parallel (`group`: a gloo group of its own, so its
    collectives never interleave with the training's), every rank saves at the same step: DCP
    stages this rank's shards (the loop's only hold) and writes them; once the coordinator's
    save returns, rank 0 adds the trainer files, seals and commits."""

    def __init__(self, root: Path, keep_last: int, rank: int = 0, group: dist.ProcessGroup | None = None) -> None:
        self.root, self.keep_last, self.rank, self.group = root, keep_last, rank, group
        self.stager = None if group is not None else Stager()
        self._reserved = False
        self._writer: FileSystemWriter | None = None  # kept: on CUDA it reuses its pinned staging buffers
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] | None = None

    def reserve(self, live: Callable[[], dict[str, Any]]) -> None:
        """Pin the staging buffers in the background, once the state exists in full (AdamW's too)."""
        if self.stager is not None and not self._reserved:
            self.stager.reserve(live())
            self._reserved = True

    def save(self, step: int, model: dict[str, Any], optim: dict[str, Any], drafter_config: dict[str, Any],
             trainer_state: dict[str, Any], trainer_info: dict[str, Any]) -> None:
        """`model`/`optim` are the live state dicts; the caller has waited for the previous save."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint is already in flight; poll(wait=True) first")
        t0 = time.perf_counter()
        if self.stager is not None:
            staged = self.stager.stage({"model": model, "optim": optim})
            write = partial(save_checkpoint, self.root, step, staged["model"], drafter_config, staged["optim"],
                            trainer_state, trainer_info, self.keep_last)
        else:
            write = self._sharded(step, model, optim, drafter_config, trainer_state, trainer_info)
        self._result = None
        self._thread = threading.Thread(target=self._write, args=(step, time.perf_counter() - t0, write),
                                        name="checkpoint", daemon=True)
        self._thread.start()

    def _sharded(self, step: int, model: dict[str, Any], optim: dict[str, Any], drafter_config: dict[str, Any],
                 trainer_state: dict[str, Any], trainer_info: dict[str, Any]) -> Callable[[], SavedCheckpoint]:
        """Start every rank's DCP write (staged before this returns); the rest of the save, to finish it."""
        tmp = self.root / f".tmp-{step_dir_name(step)}"
        if self.rank == 0:
            tmp = _fresh_tmp(self.root, step)
        dist.barrier(group=self.group)
        if self._writer is None:
            self._writer = FileSystemWriter(tmp, cache_staged_state_dict=torch.cuda.is_available())
        future = dcp.async_save({"model": model, "optim": optim}, checkpoint_id=tmp, storage_writer=self._writer,
                                process_group=self.group)
        started = time.time()

        def finish() -> SavedCheckpoint:
            try:
                future.result()
            except BaseException:  # reported on every rank; no rank writes any more: clean up once
                if self.rank == 0:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise
            if self.rank != 0:
                return SavedCheckpoint(self.root / step_dir_name(step), 0, time.time() - started)
            _write_meta(tmp, drafter_config, trainer_state, trainer_info)
            path, size = _commit(self.root, tmp, step, _seal(tmp), self.keep_last)
            return SavedCheckpoint(path, size, time.time() - started)

        return finish

    def _write(self, step: int, stall_s: float, write: Callable[[], SavedCheckpoint]) -> None:
        info: dict[str, Any] = {"step": step, "path": str(self.root / step_dir_name(step)), "stall_s": stall_s}
        t0 = time.time()
        try:
            saved = write()
            info.update(path=str(saved.path), write_s=saved.write_s, bytes=saved.bytes, committed=True)
        except Exception as exc:  # reported by the trainer as a warning; training goes on
            info.update(write_s=time.time() - t0, bytes=0, committed=False, error=f"{type(exc).__name__}: {exc}")
        info["commit_time"] = time.time()
        self._result = info

    def poll(self, wait: bool = False) -> dict[str, Any] | None:
        """The finished save's `checkpoint` fields (with its `step`), its stall counting any wait here."""
        if self._thread is None or (not wait and self._thread.is_alive()):
            return None
        t0 = time.perf_counter()
        self._thread.join()
        self._thread = None
        assert self._result is not None
        self._result["stall_s"] += time.perf_counter() - t0
        return self._result

    def newest(self, warn: Callable[[str], None]) -> LoadedCheckpoint | None:
        """The newest committed checkpoint that loads; a damaged one goes to `warn` and is passed over."""
        damaged = False
        for path in reversed(committed_checkpoints(self.root)):
            try:
                return load_checkpoint(path)
            except UserError as exc:
                damaged = True
                warn(f"{exc}; trying the previous checkpoint")
        if damaged:
            raise UserError(f"no readable checkpoint under {self.root}")
        return None


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
    if (path / "drafter.safetensors").is_file() or (path / DCP_METADATA).is_file():
        raise UserError(f"{path} is an incomplete checkpoint (no {MARKER} marker): it was never finished")
    raise UserError(f"no complete checkpoint under {path}")


@dataclass
class LoadedCheckpoint:
    """A checkpoint read back. Sharded, with training state: no drafter or optimizer state (the
    trainer loads them in place, resharded); without it, the drafter gathered in full."""

    path: Path
    drafter_state: dict[str, torch.Tensor] | None
    drafter_config: dict[str, Any]
    optimizer_state: dict[str, Any] | None
    trainer_state: dict[str, Any] | None
    sharded: bool = False


def is_sharded(path: Path) -> bool:
    return (path / DCP_METADATA).is_file()


def read_sharded(path: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """Full tensors of a sharded checkpoint, in this process alone ({"model": ..., "optim": ...}), or
    only the top-level `keys`. The state dict is rebuilt from the checkpoint's own metadata (each
    entry's shape and dtype, and its place in the nested dict), so no model or config is needed."""
    reader = FileSystemReader(path)
    meta = reader.read_metadata()
    places = meta.planner_data or {}
    flat: dict[str, Any] = {}
    for fqn, md in meta.state_dict_metadata.items():
        if keys is None or places.get(fqn, (fqn,))[0] in keys:
            tensor = isinstance(md, TensorStorageMetadata)
            flat[fqn] = torch.empty(md.size, dtype=md.properties.dtype) if tensor else None  # None: bytes
    load_sharded_into(flat, path)
    state: dict[str, Any] = {}
    for fqn, value in flat.items():
        _put(state, places.get(fqn, (fqn,)), value)
    return state


def load_sharded_into(state: dict[str, Any], path: Path) -> None:
    """dcp.load in place (each rank reads the slices its tensors hold); in a process without a
    group, without DCP's warning that it reads alone: here, that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())


def _put(root: dict[str, Any], place: tuple[str | int, ...], value: Any) -> None:
    """root[place[0]][place[1]]... = value, making dicts (str keys) and lists (int keys) on the way."""
    node: Any = root
    for key, below in zip(place, [*place[1:], None], strict=True):
        if isinstance(node, list):
            node.extend([None] * (int(key) + 1 - len(node)))
        if below is None:
            node[key] = value
        else:
            missing = node[key] is None if isinstance(node, list) else key not in node
            if missing:
                node[key] = {} if isinstance(below, str) else []
            node = node[key]


def load_checkpoint(path: Path, with_training_state: bool = True) -> LoadedCheckpoint:
    path = resolve_checkpoint(path)
    verify_checkpoint(path)
    sharded = is_sharded(path)
    try:
        drafter_config = json.loads((path / "drafter_config.json").read_text())
        drafter_state = optimizer_state = trainer_state = None
        if with_training_state:
            trainer_state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
            if not sharded:
                optimizer_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        if not sharded:
            drafter_state = load_file(path / "drafter.safetensors")
        elif not with_training_state:
            drafter_state = read_sharded(path, {"model"})["model"]
    except (OSError, ValueError, RuntimeError, json.JSONDecodeError, KeyError) as exc:
        raise UserError(f"checkpoint {path} is unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None
    return LoadedCheckpoint(path, drafter_state, drafter_config, optimizer_state, trainer_state, sharded)
