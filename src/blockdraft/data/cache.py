"""Tokenise a dataset once, in parallel, and keep it on disk as memory-mappable arrays.

The key hashes everything the tokens depend on (the files' bytes, the whole tokenizer with its chat
template, the template options, max_len), so a stale entry is never read. Entries are renamed into
place when whole, so a crash or a second rank racing on the same key never leaves a torn one.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from blockdraft.data.reading import BadRecord, Chunk, check_files, iter_chunks, parse_chunk
from blockdraft.data.report import DataReport
from blockdraft.data.tokenize import SampleEncoder
from blockdraft.errors import UserError

if TYPE_CHECKING:
    from blockdraft.config import DataConfig

CACHE_VERSION = "blockdraft-data-v1"
CHUNK_LINES = 256
PARALLEL_MIN_BYTES = 8 << 20
"""Below this much data, starting tokeniser processes (about 4 s on 2 cores) costs more than it saves."""


@dataclass
class ChunkResult:
    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    lines: np.ndarray
    loss_tokens: np.ndarray
    truncated: np.ndarray
    skips: list[tuple[str, int]]


def encode_chunk(encoder: SampleEncoder, fmt: str, chunk: Chunk) -> ChunkResult:
    """Parse a chunk's lines, then encode its good records together (`SampleEncoder.encode_many`)."""
    parsed = parse_chunk(chunk, fmt)
    encoded = iter(encoder.encode_many([rec for _, rec in parsed if not isinstance(rec, BadRecord)]))
    results = [(line_no, rec if isinstance(rec, BadRecord) else next(encoded)) for line_no, rec in parsed]
    kept = [(line_no, *result) for line_no, result in results if not isinstance(result, BadRecord)]
    ids, masks = [sample_ids for _, sample_ids, _, _ in kept], [mask for _, _, mask, _ in kept]
    return ChunkResult(
        ids=np.concatenate([np.zeros(0, np.int32), *ids]),
        mask=np.concatenate([np.zeros(0, np.bool_), *masks]),
        lengths=np.asarray([len(sample_ids) for sample_ids in ids], dtype=np.int32),
        lines=np.asarray([line_no for line_no, _, _, _ in kept], dtype=np.int32),
        loss_tokens=np.asarray([int(mask.sum()) for mask in masks], dtype=np.int64),
        truncated=np.asarray([cut for _, _, _, cut in kept], dtype=np.bool_),
        skips=[(result.reason, line_no) for line_no, result in results if isinstance(result, BadRecord)],
    )


_WORKER: tuple[SampleEncoder, str] | None = None


def _init_worker(encoder: SampleEncoder, fmt: str) -> None:
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = (encoder, fmt)


def _encode_in_worker(chunk: Chunk) -> ChunkResult:
    assert _WORKER is not None
    return encode_chunk(_WORKER[0], _WORKER[1], chunk)


def file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=20)
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    h = hashlib.blake2b(digest_size=20)
    h.update(type(tokenizer).__name__.encode())
    h.update(tokenizer.backend_tokenizer.to_str().encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    return h.hexdigest()


def cache_key(paths: list[Path], tokenizer: Any, cfg: DataConfig) -> str:
    options = {"format": cfg.format, "thinking": cfg.thinking, "max_len": cfg.max_len, "overlong": cfg.overlong}
    h = hashlib.blake2b(digest_size=16)
    for part in [CACHE_VERSION, tokenizer_fingerprint(tokenizer), json.dumps(options, sort_keys=True)]:
        h.update(part.encode())
    for path in paths:
        h.update(file_digest(path).encode())
    return h.hexdigest()


def default_cache_root() -> Path:
    env = os.environ.get("BLOCKDRAFT_CACHE")
    if env:
        return Path(env) / "data"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "blockdraft" / "data"


def worker_count(cfg: DataConfig) -> int:
    if cfg.num_workers:
        return cfg.num_workers
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Samples(Protocol):
    """What the batch plan, the prefetcher, the batch costs and the warm-up read of a dataset: the cached
    `TokenizedDataset` of a training run, or the synthetic one of `blockdraft bench`."""

    lengths: np.ndarray  # [N] tokens of each sample
    offsets: np.ndarray  # [N + 1] where each sample starts in `mask`, laid end to end
    mask: np.ndarray  # [tokens] bool: the loss mask (assistant tokens) of every sample

    def __len__(self) -> int: ...

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]: ...


class TokenizedDataset:
    """The cached dataset, memory-mapped: sample i is ids[offsets[i]:offsets[i+1]]."""

    def __init__(self, path: Path):
        self.path = path
        self.offsets = np.load(path / "offsets.npy")
        self.lengths = np.load(path / "lengths.npy")
        self.sources = np.load(path / "sources.npy")
        meta = json.loads((path / "meta.json").read_text())
        self.files: list[str] = meta["files"]
        total = int(self.offsets[-1])
        if total:
            self.ids = np.memmap(path / "ids.bin", dtype=np.int32, mode="r", shape=(total,))
            self.mask = np.memmap(path / "mask.bin", dtype=np.bool_, mode="r", shape=(total,))
        else:
            self.ids = np.zeros(0, np.int32)
            self.mask = np.zeros(0, np.bool_)

    def __len__(self) -> int:
        return len(self.lengths)

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32[L], loss mask bool[L]) of sample i, read-only views of the cache."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.ids[lo:hi], self.mask[lo:hi]

    def source(self, i: int) -> str:
        """`file:line` of sample i, to find a sample that misbehaves in training."""
        file_index, line = self.sources[i]
        return f"{self.files[file_index]}:{line}"


def _encoded_chunks(
    paths: list[Path], encoder: SampleEncoder, fmt: str, workers: int
) -> Iterator[tuple[int, int, ChunkResult]]:
    """(file index, bytes done, result) in file order; at most 2 chunks per worker in flight."""
    tasks = ((fi, chunk, done) for fi, path in enumerate(paths) for chunk, done in iter_chunks(path, CHUNK_LINES))
    if workers <= 1:
        yield from ((fi, done, encode_chunk(encoder, fmt, chunk)) for fi, chunk, done in tasks)
        return
    # Never fork: a process with threads running (a progress bar, a tracker) can fork a worker holding a
    # lock it will never release. The fork server starts single-threaded with this module imported once.
    method = "forkserver" if sys.platform == "linux" else "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload([__name__, type(encoder.tokenizer).__module__])
    # an executor, not a Pool: a worker that dies (killed for memory, say) breaks it with an error,
    # where a Pool starts another and waits for the lost chunk for ever
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(encoder, fmt)) as pool:
        pending: deque = deque()
        try:
            for fi, chunk, done in tasks:
                pending.append((fi, done, pool.submit(_encode_in_worker, chunk)))
                if len(pending) >= 2 * workers:
                    fi0, done0, future = pending.popleft()
                    yield fi0, done0, future.result()
            while pending:
                fi0, done0, future = pending.popleft()
                yield fi0, done0, future.result()
        except BrokenProcessPool:
            raise UserError(f"a tokeniser process died (out of memory?); try fewer with data.num_workers "
                            f"(now {workers})") from None


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (TextColumn("tokenising"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[samples]} samples"),
               TimeElapsedColumn(), TimeRemainingColumn())
    return Progress(*columns, console=Console(stderr=True), disable=not enabled)


def build_cache(paths: list[Path], tokenizer: Any, cfg: DataConfig, entry: Path, progress: bool) -> DataReport:
    """Tokenise every file into a fresh cache entry at `entry`; returns the report stored with it."""
    encoder = SampleEncoder(tokenizer, cfg.thinking, cfg.max_len, cfg.overlong)
    total_bytes = sum(p.stat().st_size for p in paths)
    workers = worker_count(cfg) if total_bytes >= PARALLEL_MIN_BYTES else 1
    report = DataReport(files=[str(p) for p in paths])
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".tmp-", dir=entry.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a shared cache must be readable by every rank's user
    try:
        # np.concatenate needs one array at least; sources: (file index, line) of each sample
        lengths, sources = [np.zeros(0, np.int32)], [np.zeros((0, 2), np.int32)]
        with open(tmp / "ids.bin", "wb") as ids_fh, open(tmp / "mask.bin", "wb") as mask_fh, _progress(progress) as bar:
            task = bar.add_task("tokenising", total=total_bytes, samples=0)
            for fi, done, res in _encoded_chunks(paths, encoder, cfg.format, workers):
                res.ids.tofile(ids_fh)
                res.mask.tofile(mask_fh)
                lengths.append(res.lengths)
                sources.append(np.stack([np.full(len(res.lines), fi, dtype=np.int32), res.lines], axis=1))
                for length, loss, cut in zip(res.lengths, res.loss_tokens, res.truncated, strict=True):
                    report.use(int(length), int(loss), bool(cut))
                for reason, line in res.skips:
                    report.skip(reason, f"{paths[fi]}:{line}")
                bar.update(task, advance=done, samples=report.samples_used)
        all_lengths = np.concatenate(lengths)
        np.save(tmp / "lengths.npy", all_lengths)
        np.save(tmp / "offsets.npy", np.concatenate([[0], np.cumsum(all_lengths, dtype=np.int64)]))
        np.save(tmp / "sources.npy", np.concatenate(sources))
        meta = {"version": CACHE_VERSION, "files": report.files, "report": report.as_record()}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, entry)
        except OSError:  # another process finished the same entry first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def prepare_dataset(
    cfg: DataConfig, tokenizer: Any, files: list[str] | None = None, progress: bool | None = None
) -> tuple[TokenizedDataset, DataReport]:
    """Read, validate and tokenise `files` (default cfg.train_files), through the on-disk cache.

    Raises UserError, before any model is loaded, for a missing file or zero usable samples.
    """
    paths = check_files(list(files if files is not None else cfg.train_files))
    root = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_root()
    entry = root / cache_key(paths, tokenizer, cfg)
    hit = (entry / "meta.json").is_file()
    if hit:
        report = DataReport.from_record(json.loads((entry / "meta.json").read_text())["report"])
    else:
        show = sys.stderr.isatty() if progress is None else progress
        report = build_cache(paths, tokenizer, cfg, entry, show)
    report.cache_path, report.cache_hit = str(entry), hit
    if report.samples_used == 0:
        names = ", ".join(str(p) for p in paths)
        raise UserError(f"no usable samples in {names}: {report.skip_summary()}")
    return TokenizedDataset(entry), report
