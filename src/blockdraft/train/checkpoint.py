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
`AsyncCheckpointer` writes it with the protocol above in a background thread while training goes
on; at most one save is in flight, so the only time the loop is held is the wait for the previous
save (if still running) plus the copy.

Data-parallel runs (`ShardedCheckpointer`): drafter.safetensors and optimizer.pt are replaced by a
torch.distributed.checkpoint folder content (`.metadata` + one `__R_0.distcp` per rank), written by
every rank into the same temp folder; rank 0 adds the other files and commits as above. DCP records
each tensor's global shape and its shards, so a resume at any world size (1 included) reads back
exactly the slices it needs, and `load_checkpoint(..., with_training_state=False)` gathers the
full drafter for export. The folder must be on a file system that every rank sees.
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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from blockdraft.errors import UserError

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


def _write_files(
    tmp: Path,
    drafter_state: dict[str, torch.Tensor],
    drafter_config: dict[str, Any],
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    trainer_info: dict[str, Any],
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


@dataclass
class Snapshot:
    """Everything `save_checkpoint` needs, already in host memory: the trainer may move on."""

    step: int
    drafter_state: dict[str, torch.Tensor]
    drafter_config: dict[str, Any]
    optimizer_state: dict[str, Any]
    trainer_state: dict[str, Any]
    trainer_info: dict[str, Any]


class Stager:
    """Copies (nested) state into host tensors that the training loop will not touch again.

    Buffers are kept between saves (no allocation or page faults on the loop's time), pinned for GPU
    tensors so the copies are fast and asynchronous; CPU tensors are copied too, since training updates
    parameters in place. Pinning 16 bytes per drafter parameter takes seconds (8.8 s for 12.6 GB on an
    H200 host), so the trainer calls `reserve` in a background thread after the first update, when
    AdamW's state exists: the first save then finds its buffers ready. Callers must not stage while an
    earlier snapshot is still being written: the buffers are reused.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._reserving: threading.Thread | None = None

    def reserve(self, tree: Any) -> threading.Thread:
        """Allocate the buffers `stage(tree)` will need, in a background thread (returned, started)."""
        specs: dict[str, tuple[torch.Size, torch.dtype, bool]] = {}
        self._walk(tree, "", lambda key, t: specs.setdefault(key, (t.shape, t.dtype, t.is_cuda)))

        def allocate() -> None:
            for key, (shape, dtype, pin) in specs.items():
                self._buffers.setdefault(key, torch.empty(shape, dtype=dtype, pin_memory=pin))

        self._reserving = threading.Thread(target=allocate, name="pin-buffers", daemon=True)
        self._reserving.start()
        return self._reserving

    @property
    def nbytes(self) -> int:
        """Host memory held by the buffers (the bytes one save copies)."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, tree: Any) -> Any:
        if self._reserving is not None:  # a save before the buffers are ready waits for them (counted as stall)
            self._reserving.join()
            self._reserving = None
        staged = self._walk(tree, "", self._copy)
        if torch.cuda.is_available() and self._buffers:
            torch.cuda.synchronize()  # the non-blocking copies must land before the writer reads them
        return staged

    def _copy(self, key: str, node: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or buf.shape != node.shape or buf.dtype != node.dtype:
            buf = torch.empty(node.shape, dtype=node.dtype, pin_memory=node.is_cuda)
            self._buffers[key] = buf
        return buf.copy_(node.detach(), non_blocking=True)

    def _walk(self, node: Any, key: str, leaf: Callable[[str, torch.Tensor], Any]) -> Any:
        if isinstance(node, torch.Tensor):
            return leaf(key, node)
        if isinstance(node, dict):
            return {k: self._walk(v, f"{key}/{k}", leaf) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(self._walk(v, f"{key}/{i}", leaf) for i, v in enumerate(node))
        return node


class AsyncCheckpointer:
    """Writes snapshots in a background thread, one at a time. Results (committed or failed) are
    collected by the training thread with `poll`, so only that thread writes the log."""

    def __init__(self, ckpt_root: Path, keep_last: int) -> None:
        self.ckpt_root = ckpt_root
        self.keep_last = keep_last
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] | None = None

    def submit(self, snap: Snapshot, stall_s: float) -> None:
        """Write `snap` (already staged by the caller, which took `stall_s` for it)."""
        self._launch(snap.step, stall_s, lambda: save_checkpoint(
            self.ckpt_root, snap.step, snap.drafter_state, snap.drafter_config, snap.optimizer_state,
            snap.trainer_state, snap.trainer_info, self.keep_last))

    def _launch(self, step: int, stall_s: float, write: Callable[[], SavedCheckpoint]) -> None:
        if self._thread is not None:
            raise RuntimeError("a checkpoint is already in flight; wait() first")
        self._result = None
        self._thread = threading.Thread(target=self._write, args=(step, stall_s, write), name="checkpoint",
                                        daemon=True)
        self._thread.start()

    def _write(self, step: int, stall_s: float, write: Callable[[], SavedCheckpoint]) -> None:
        info: dict[str, Any] = {"step": step, "path": str(self.ckpt_root / step_dir_name(step)), "stall_s": stall_s}
        t0 = time.time()
        try:
            saved = write()
            info.update(path=str(saved.path), write_s=saved.write_s, bytes=saved.bytes, committed=True)
        except Exception as exc:  # reported by the trainer as a warning; training goes on
            info.update(write_s=time.time() - t0, bytes=0, committed=False, error=f"{type(exc).__name__}: {exc}")
        info["commit_time"] = time.time()
        self._result = info

    def poll(self, wait: bool = False) -> tuple[dict[str, Any] | None, float]:
        """(the finished save's result or None, seconds spent waiting for it)."""
        if self._thread is None or (not wait and self._thread.is_alive()):
            return None, 0.0
        t0 = time.perf_counter()
        self._thread.join()
        self._thread = None
        return self._result, time.perf_counter() - t0


class ShardedCheckpointer(AsyncCheckpointer):
    """The same protocol for a data-parallel run. `submit` is called by every rank at the same step:
    dcp.async_save stages this rank's shards of the drafter and AdamW state to host memory (the
    loop's only hold), then writes them in the background over `group`, a gloo group of its own (a
    collective there never interleaves with the training's). Once the coordinator's save returns,
    every rank's shards are on disk; rank 0 then adds the trainer files, seals and commits."""

    def __init__(self, ckpt_root: Path, keep_last: int, rank: int, group: dist.ProcessGroup) -> None:
        super().__init__(ckpt_root, keep_last)
        self.rank, self.group = rank, group
        self._writer: FileSystemWriter | None = None  # kept: on CUDA it reuses its pinned staging buffers

    def submit(self, snap: Snapshot, stall_s: float) -> None:
        """`snap` holds the live (sharded) state dicts: they are staged here, before returning."""
        t0 = time.perf_counter()
        tmp = self.ckpt_root / f".tmp-{step_dir_name(snap.step)}"
        if self.rank == 0:
            tmp = _fresh_tmp(self.ckpt_root, snap.step)
        dist.barrier(group=self.group)
        if self._writer is None:
            self._writer = FileSystemWriter(tmp, cache_staged_state_dict=torch.cuda.is_available())
        future = dcp.async_save({"model": snap.drafter_state, "optim": snap.optimizer_state}, checkpoint_id=tmp,
                                storage_writer=self._writer, process_group=self.group)
        started = time.time()

        def finish() -> SavedCheckpoint:
            final = self.ckpt_root / step_dir_name(snap.step)
            try:
                future.result()
            except BaseException:  # reported on every rank; no rank writes any more: clean up once
                if self.rank == 0:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise
            if self.rank != 0:
                return SavedCheckpoint(final, 0, time.time() - started)
            _write_meta(tmp, snap.drafter_config, snap.trainer_state, snap.trainer_info)
            path, size = _commit(self.ckpt_root, tmp, snap.step, _seal(tmp), self.keep_last)
            return SavedCheckpoint(path, size, time.time() - started)

        self._launch(snap.step, stall_s + time.perf_counter() - t0, finish)


class Checkpointer:
    """The trainer's checkpoints: `save` stages the state and writes it in the background (one save
    in flight), `poll` hands back a finished save's record, `newest` finds what a resume reads.
    With `group` (a gloo group of a data-parallel run) the writer is DCP's, sharded; else
    safetensors through the `Stager`."""

    def __init__(self, root: Path, keep_last: int, rank: int = 0, group: dist.ProcessGroup | None = None) -> None:
        self.root = root
        self.writer = (ShardedCheckpointer(root, keep_last, rank, group) if group is not None
                       else AsyncCheckpointer(root, keep_last))
        self.stager = None if group is not None else Stager()
        self._reserved = False

    def reserve(self, live: Callable[[], dict[str, Any]]) -> None:
        """Pin the staging buffers in the background, once the state exists in full (AdamW's too)."""
        if self.stager is not None and not self._reserved:
            self.stager.reserve(live())
            self._reserved = True

    def save(self, step: int, model: dict[str, Any], optim: dict[str, Any], drafter_config: dict[str, Any],
             trainer_state: dict[str, Any], trainer_info: dict[str, Any]) -> None:
        """`model`/`optim` are the live state dicts; the caller has waited for the previous save."""
        t0 = time.perf_counter()
        if self.stager is not None:
            staged = self.stager.stage({"model": model, "optim": optim})
            model, optim = staged["model"], staged["optim"]
        self.writer.submit(Snapshot(step, model, drafter_config, optim, trainer_state, trainer_info),
                           time.perf_counter() - t0)

    def poll(self, wait: bool = False) -> dict[str, Any] | None:
        """The finished save's `checkpoint` fields (with its `step`), its stall counting any wait here."""
        info, waited = self.writer.poll(wait)
        if info is not None:
            info["stall_s"] += waited
        return info

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
    """A checkpoint read back. For a sharded one (`sharded`), the drafter and optimizer states are
    None when the training state was asked for: the trainer loads them in place, resharded
    (`distributed.load_weights`); without training state, the drafter is gathered in full."""

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
