"""Atomic checkpoints in one format, torch.distributed.checkpoint (DCP), at every world size: a crash
at any moment never leaves a checkpoint that a resume could pick.

The files of RUN/checkpoints/step-000200/ are listed in docs/training.md ("Checkpoints"). DCP's state
dict is {"model": drafter, "optim": AdamW state keyed by parameter name}; trainer.pt holds the
trainer's stateful parts by name; COMMITTED, written last, is the only proof a checkpoint is complete.

Order: every rank writes its DCP file into `.tmp-step-000200/` (on a file system every rank sees);
rank 0 adds the other files, fsyncs each file and the folder, renames the folder into place (a
committed one of the same step is set aside as `.replaced-step-000200/` until then, and still counts
until the new one commits), fsyncs the parent, writes COMMITTED (fsync), points `latest` at it (a
symlink swapped atomically) and prunes beyond keep_last. Resume trusts only COMMITTED folders.

Asynchronous saves (`Checkpointer`): between two steps each rank stages a host copy with DCP's own
stager (what `dcp.async_save` runs first; AdamW updates in place), then `dcp.save` writes it in a
daemon thread of ours (`dcp.async_save`'s executor is joined at exit: a second Ctrl-C must not wait
for a hung write). One save at most is in flight: the loop waits only for the previous one and the copy.

Readers: a resume at any world size reads the slices it needs; export, ckpt-scan and eval rebuild
full tensors in this process alone (`read_state`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from blockdraft.errors import UserError

MARKER = "COMMITTED"
REPLACED = ".replaced-"  # a committed checkpoint set aside while its step is saved again
DCP_METADATA = ".metadata"
OLD_WEIGHTS = "drafter.safetensors"  # the weights file of the format before DCP


@contextlib.contextmanager
def _alone_quietly() -> Iterator[None]:
    """Around each dcp.save and dcp.load. Without a process group, DCP saves and loads in this process
    alone (it detects that itself) and warns each time it does: here, that is the intent."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", "torch.distributed is .* in a single process", UserWarning)
        yield


def _fsync(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the renames and creations in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def committed_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first; a set-aside one counts while its step has no newer commit."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.glob("step-*") if p.is_dir() and (p / MARKER).is_file()]
    found += [p for p in ckpt_root.glob(f"{REPLACED}step-*")
              if (p / MARKER).is_file() and not (ckpt_root / p.name.removeprefix(REPLACED) / MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


def host_stager() -> FileSystemWriter:
    """DCP's file writer, also the stager `dcp.async_save` would use (on CUDA its pinned buffers are
    kept for the next save). Its path is set by each save."""
    return FileSystemWriter(".", cache_staged_state_dict=torch.cuda.is_available())


def _commit(ckpt_root: Path, tmp: Path, step: int, manifest: dict[str, tuple[int, int]], keep_last: int
            ) -> tuple[Path, int]:
    """Rename the sealed temp folder into place, then COMMITTED, `latest` and pruning."""
    final, aside = ckpt_root / step_dir_name(step), ckpt_root / f"{REPLACED}{step_dir_name(step)}"
    if (final / MARKER).is_file():  # a re-save of this step: the old one stays whole until the new commits
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    elif final.exists():  # an uncommitted leftover of an earlier crash at this very step
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(ckpt_root)
    marker = final / MARKER
    marker.write_text(json.dumps({"step": step, "files": manifest}))
    _fsync(marker)
    _fsync(final)
    latest = ckpt_root / ".latest.tmp"  # `latest` points at the new checkpoint: a symlink swapped atomically
    latest.unlink(missing_ok=True)
    latest.symlink_to(final.name)
    os.replace(latest, ckpt_root / "latest")
    _fsync(ckpt_root)
    shutil.rmtree(aside, ignore_errors=True)
    _prune(ckpt_root, keep_last)
    return final, sum(size for size, _ in manifest.values())


def _crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def _seal(tmp: Path) -> dict[str, tuple[int, int]]:
    """fsync every file of the folder and the folder itself; {name: (bytes, crc32)}."""
    manifest = {}
    for f in sorted(tmp.iterdir()):
        _fsync(f)
        manifest[f.name] = (f.stat().st_size, _crc32(f))
    _fsync(tmp)
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
    """Saves in the background, one in flight, and finds what a resume reads. Under a process group
    (`group`: a gloo group of its own, so its collectives never interleave with the training's) every
    rank saves at the same step and writes its shards; rank 0 then adds the trainer files and commits."""

    def __init__(self, root: Path, keep_last: int, rank: int = 0, group: dist.ProcessGroup | None = None) -> None:
        self.root, self.keep_last, self.rank, self.group = root, keep_last, rank, group
        self._writer = host_stager()  # kept: on CUDA it reuses its pinned staging buffers
        self._reserving: threading.Thread | None = None
        self._thread: threading.Thread | None = None
        self._result: dict[str, Any] | None = None

    def reserve(self, live: Callable[[], dict[str, Any]]) -> None:
        """Pin the staging buffers in the background, once the state exists in full (AdamW's too):
        pinning 16 bytes a parameter takes seconds (8.8 s for 12.6 GB on an H200 host), which the
        first save would otherwise hold the loop for. On CPU nothing is kept: nothing to reserve."""
        if self._writer.cache_staged_state_dict and self._reserving is None:
            self._reserving = threading.Thread(target=self._writer.stage, args=(live(),), name="pin-buffers",
                                               daemon=True)
            self._reserving.start()

    def save(self, step: int, state: dict[str, Any], drafter_config: dict[str, Any], trainer_state: dict[str, Any],
             trainer_info: dict[str, Any]) -> None:
        """`state` is this rank's live {"model", "optim"}; the caller has waited for the previous save."""
        if self._thread is not None:
            raise RuntimeError("a checkpoint is already in flight; poll(wait=True) first")
        t0 = time.perf_counter()
        if self._reserving is not None:  # a save before the buffers are ready waits for them (counted as stall)
            self._reserving.join()
        staged = self._writer.stage(state)  # a copy: AdamW's next update must not reach the write
        tmp = self.root / f".tmp-{step_dir_name(step)}"
        if self.rank == 0:  # an empty folder: a leftover of a crash goes
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        if dist.is_initialized():
            dist.barrier(group=self.group)  # no rank writes before rank 0 has emptied the folder
        finish = partial(self._finish, step, tmp, staged, drafter_config, trainer_state, trainer_info)
        self._result = None
        self._thread = threading.Thread(target=self._write, args=(step, time.perf_counter() - t0, finish),
                                        name="checkpoint", daemon=True)
        self._thread.start()

    def _finish(self, step: int, tmp: Path, staged: dict[str, Any], drafter_config: dict[str, Any],
                trainer_state: dict[str, Any], trainer_info: dict[str, Any]) -> tuple[Path, int]:
        """The DCP write; then, on rank 0, the trainer files and the commit. (path, bytes)."""
        try:  # a rank's failed write fails it on every rank: no rank writes any more
            with _alone_quietly():
                dcp.save(staged, checkpoint_id=tmp, storage_writer=self._writer, process_group=self.group)
            if self.rank != 0:
                return self.root / step_dir_name(step), 0
            (tmp / "drafter_config.json").write_text(json.dumps(drafter_config, indent=2))  # the files besides DCP's
            torch.save(trainer_state, tmp / "trainer.pt")
            (tmp / "trainer.json").write_text(json.dumps(trainer_info, indent=2, default=str))
            manifest = _seal(tmp)
        except BaseException:
            if self.rank == 0:  # a failed write (full disk) leaves nothing behind
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return _commit(self.root, tmp, step, manifest, self.keep_last)

    def _write(self, step: int, stall_s: float, finish: Callable[[], tuple[Path, int]]) -> None:
        info: dict[str, Any] = {"step": step, "path": str(self.root / step_dir_name(step)), "stall_s": stall_s}
        t0 = time.time()
        try:
            path, size = finish()
            info.update(path=str(path), bytes=size, committed=True)
        except (Exception, dcp.CheckpointException) as exc:  # reported by the trainer as a warning; training goes on
            info.update(bytes=0, committed=False, error=_cause(exc))
        info.update(write_s=time.time() - t0, commit_time=time.time())
        self._result = info
        if dist.is_initialized():  # no rank's save ends before rank 0's commit: a rollback reads one checkpoint
            dist.barrier(group=self.group)

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
        """The newest committed checkpoint that loads; a damaged one goes to `warn` and is passed over
        (one of an older blockdraft is no damage: it stops the resume with its own message)."""
        damaged = False
        for path in reversed(committed_checkpoints(self.root)):
            _refuse_old_format(path)
            try:
                return load_checkpoint(path)
            except UserError as exc:
                damaged = True
                warn(f"{exc}; trying the previous checkpoint")
        if damaged:
            raise UserError(f"no readable checkpoint under {self.root}")
        return None


def _prune(ckpt_root: Path, keep_last: int) -> None:
    """Delete the oldest committed checkpoints beyond keep_last, and stale temp folders."""
    for old in committed_checkpoints(ckpt_root)[:-keep_last]:
        (old / MARKER).unlink()  # un-commit first: a crash mid-delete leaves no half checkpoint
        shutil.rmtree(old)
    for stale in ckpt_root.glob(".tmp-step-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _cause(exc: BaseException) -> str:
    """One line naming a failure. DCP wraps each rank's own in a CheckpointException: the lowest
    rank's is named."""
    if isinstance(exc, dcp.CheckpointException) and exc.failures:
        rank, (exc, _) = min(exc.failures.items())
        return f"{type(exc).__name__} on rank {rank}: {exc}"
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def _readable(path: Path) -> Iterator[None]:
    """A failure to read the checkpoint at `path` becomes one UserError line."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError, pickle.UnpicklingError, dcp.CheckpointException) as exc:
        raise UserError(f"checkpoint {path} is unreadable ({_cause(exc)[:200]})") from None


def _refuse_old_format(path: Path) -> None:
    if (path / OLD_WEIGHTS).is_file() and not (path / DCP_METADATA).is_file():
        raise UserError(f"checkpoint {path} was written by an older blockdraft ({OLD_WEIGHTS}, no {DCP_METADATA}), "
                        "which this one does not read: export or resume it with the blockdraft that wrote it")


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder, a run folder or a checkpoints folder -> the newest COMMITTED checkpoint."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint path not found: {path}")
    if (path / MARKER).is_file():
        found = [path.resolve()]
    else:
        found = committed_checkpoints(path / "checkpoints") or committed_checkpoints(path)
    if not found:
        if (path / DCP_METADATA).is_file() or (path / OLD_WEIGHTS).is_file():
            raise UserError(f"{path} is an incomplete checkpoint (no {MARKER} marker): it was never finished")
        raise UserError(f"no complete checkpoint under {path}")
    _refuse_old_format(found[-1])
    return found[-1]


@dataclass
class LoadedCheckpoint:
    """A checkpoint read back. With training state: no drafter state (the trainer loads it in place,
    resharded, with AdamW's); without it, the drafter gathered in full. `parts`: the state dict's
    top-level keys ("optim" is absent from a save before AdamW's first update)."""

    path: Path
    drafter_state: dict[str, torch.Tensor] | None
    drafter_config: dict[str, Any]
    trainer_state: dict[str, Any] | None
    parts: set[str]


def tensors_in(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, tensor) pairs of a nested state dict, in its own order: what ckpt-scan inspects
    and the bench counts the bytes of."""
    if isinstance(node, torch.Tensor):
        return [(prefix, node)]
    if isinstance(node, dict):
        return [pair for k, v in node.items() for pair in tensors_in(v, f"{prefix}.{k}")]
    if isinstance(node, (list, tuple)):
        return [pair for i, v in enumerate(node) for pair in tensors_in(v, f"{prefix}.{i}")]
    return []


def read_state(path: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """Full tensors of a checkpoint, in this process alone ({"model": ..., "optim": ...}), or only
    the top-level `keys`. The state dict is rebuilt from the checkpoint's own metadata (each entry's
    shape and dtype, and its place in the nested dict), so no model or config is needed."""
    with _readable(path):
        meta = FileSystemReader(path).read_metadata()
    places = meta.planner_data or {}
    flat: dict[str, Any] = {}
    for fqn, md in meta.state_dict_metadata.items():
        if keys is None or places.get(fqn, (fqn,))[0] in keys:
            tensor = isinstance(md, TensorStorageMetadata)
            flat[fqn] = torch.empty(md.size, dtype=md.properties.dtype) if tensor else None  # None: bytes
    load_into(flat, path)
    state: dict[str, Any] = {}
    for fqn, value in flat.items():
        _put(state, places.get(fqn, (fqn,)), value)
    return state


def load_into(state: dict[str, Any], path: Path) -> None:
    """dcp.load in place: each rank reads the slices its tensors hold."""
    with _readable(path), _alone_quietly():
        dcp.load(state, checkpoint_id=path)


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
    drafter_state = trainer_state = None
    with _readable(path):
        drafter_config = json.loads((path / "drafter_config.json").read_text())
        if with_training_state:
            trainer_state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=True)
        parts = {place[0] for place in (FileSystemReader(path).read_metadata().planner_data or {}).values()}
    if not with_training_state:
        drafter_state = read_state(path, {"model"})["model"]
    return LoadedCheckpoint(path, drafter_state, drafter_config, trainer_state, parts)
