"""A background thread that turns planned batches into padded (pinned) tensors ahead of the trainer.

The thread runs ahead of the trainer by up to `depth` batches, so the sampler's own position is
not the trainer's. The state that resumes training is therefore taken from the last batch the
trainer actually received: loading it restarts the thread exactly at the next batch.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from blockdraft.data.batching import BatchSampler, PlannedBatch
from blockdraft.data.cache import Samples


@dataclass
class Batch:
    """One micro-batch: right-padded with 0, loss_mask False on padding."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    lengths: torch.Tensor
    sample_ids: list[int]
    bucket: int
    epoch: int
    index_in_epoch: int
    epoch_progress: float
    real_tokens: int
    padded_tokens: int
    passes: Any = None  # filled by the consumer's `prepare` hook, in the prefetch thread

    @property
    def batch_id(self) -> str:
        """The batch's identity in the (seeded, fingerprinted) batch plan: stable across resumes."""
        return f"{self.epoch}:{self.index_in_epoch}"


def collate(dataset: Samples, planned: PlannedBatch, batches_per_epoch: int, pin: bool) -> Batch:
    ids_list = [int(i) for i in planned.sample_ids]
    lengths = dataset.lengths[ids_list].astype(np.int64)
    width = int(lengths.max())
    ids = np.zeros((len(ids_list), width), dtype=np.int64)
    mask = np.zeros((len(ids_list), width), dtype=np.bool_)
    for row, i in enumerate(ids_list):
        sample_ids, sample_mask = dataset.sample(i)
        ids[row, : len(sample_ids)] = sample_ids
        mask[row, : len(sample_mask)] = sample_mask
    tensors = [torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(lengths)]
    if pin:
        tensors = [t.pin_memory() for t in tensors]
    return Batch(*tensors, sample_ids=ids_list, bucket=planned.bucket, epoch=planned.epoch,
                 index_in_epoch=planned.index, epoch_progress=(planned.index + 1) / batches_per_epoch,
                 real_tokens=planned.real_tokens, padded_tokens=len(ids_list) * width)


class Prefetcher:
    """`next()` returns batches forever; `state_dict()` is the position after the last one returned."""

    def __init__(self, dataset: Samples, sampler: BatchSampler, depth: int, pin_memory: bool,
                 prepare: Callable[[Batch], Batch] | None = None):
        """`prepare` runs on each batch in the background thread (the trainer packs batches there)."""
        self.dataset = dataset
        self.prepare = prepare
        self.sampler = sampler
        self.depth = depth
        self.pin = bool(pin_memory) and torch.cuda.is_available()
        self._state = sampler.state_dict()
        self._thread: threading.Thread | None = None
        self._start()

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(
            target=self._produce, args=(self._stop, self._queue), name="blockdraft-prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, stop: threading.Event, q: queue.Queue, item: Any) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return
            except queue.Full:
                pass

    def _produce(self, stop: threading.Event, q: queue.Queue) -> None:
        try:
            while not stop.is_set():
                planned = self.sampler.next()
                batch = collate(self.dataset, planned, self.sampler.batches_per_epoch, self.pin)
                self._put(stop, q, self.prepare(batch) if self.prepare else batch)
        except BaseException as exc:  # handed to the trainer's thread by next()
            self._put(stop, q, exc)

    def close(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None

    @property
    def queue_depth(self) -> int:
        """Batches ready now; a queue that stays near 0 means the trainer waits for data."""
        return self._queue.qsize() if self._thread is not None else 0

    def next(self) -> Batch:
        if self._thread is None:
            raise RuntimeError("the prefetcher is closed")
        item = self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._state = self.sampler.position(item.epoch, item.index_in_epoch + 1)
        return item

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        try:
            self.sampler.load_state_dict(state)
        except BaseException:
            self.sampler.load_state_dict(self._state)  # a bad state leaves the position as it was
            raise
        finally:
            self._state = self.sampler.state_dict()
            self._start()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
