"""The prefetch thread: padded tensors, epochs that follow each other, exact resume while running ahead."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from blockdraft.data.batching import BatchSampler
from blockdraft.data.cache import prepare_dataset
from blockdraft.data.prefetch import Batch, Prefetcher

from .conftest import data_cfg, write_jsonl
from .test_cache import corpus


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, qwen_tok):
    tmp = tmp_path_factory.mktemp("prefetch")
    path = write_jsonl(tmp / "d.jsonl", corpus(120))
    cfg = data_cfg(tmp, tokens_per_batch=400, max_same_bucket_run=2)
    dataset, _ = prepare_dataset(cfg, qwen_tok, [str(path)])
    return dataset, cfg


def signature(batch: Batch) -> tuple:
    return batch.epoch, batch.index_in_epoch, tuple(batch.sample_ids), batch.input_ids.sum().item()


def test_batches_are_padded_tensors(prepared):
    dataset, cfg = prepared
    sampler = BatchSampler(dataset.lengths, cfg, seed=0)
    with Prefetcher(dataset, sampler, depth=3, pin_memory=True) as pf:
        for _ in range(sampler.batches_per_epoch):
            b = pf.next()
            n, width = b.input_ids.shape
            assert b.input_ids.dtype == torch.long and b.loss_mask.dtype == torch.bool
            assert b.lengths.dtype == torch.long and width == b.lengths.max().item() and n == len(b.sample_ids)
            for row, i in enumerate(b.sample_ids):
                ids, mask = dataset.sample(i)
                length = len(ids)
                assert b.lengths[row].item() == length
                assert np.array_equal(b.input_ids[row, :length].numpy(), ids)
                assert np.array_equal(b.loss_mask[row, :length].numpy(), mask)
                assert not b.input_ids[row, length:].any() and not b.loss_mask[row, length:].any()
            assert b.real_tokens == b.lengths.sum().item() and b.padded_tokens == n * width
            assert b.epoch_progress == pytest.approx((b.index_in_epoch + 1) / sampler.batches_per_epoch)
        assert b.epoch == 0 and b.epoch_progress == 1.0
        nxt = pf.next()
        assert (nxt.epoch, nxt.index_in_epoch) == (1, 0)
        assert pf.state_dict()["epoch"] == 1 and pf.state_dict()["index"] == 1


def test_resume_through_the_thread_is_exact(prepared):
    dataset, cfg = prepared
    per_epoch = BatchSampler(dataset.lengths, cfg, seed=4).batches_per_epoch
    for k in (1, per_epoch - 1, per_epoch, per_epoch + 3):
        first = Prefetcher(dataset, BatchSampler(dataset.lengths, cfg, seed=4), depth=4, pin_memory=False)
        for _ in range(k):
            first.next()
        state = first.state_dict()
        while first.queue_depth < 4:  # let the thread run ahead before comparing
            time.sleep(0.01)
        expected = [signature(first.next()) for _ in range(per_epoch + 2)]
        first.close()
        second = Prefetcher(dataset, BatchSampler(dataset.lengths, cfg, seed=4), depth=2, pin_memory=False)
        second.next()  # already running somewhere else: loading must discard that
        second.load_state_dict(state)
        assert [signature(second.next()) for _ in range(per_epoch + 2)] == expected
        second.close()


def test_thread_errors_reach_the_trainer(prepared):
    dataset, cfg = prepared

    class Broken:
        lengths = dataset.lengths

        def sample(self, i):
            raise OSError("disk went away")

    pf = Prefetcher(Broken(), BatchSampler(dataset.lengths, cfg, seed=0), depth=2, pin_memory=False)
    with pytest.raises(OSError, match="disk went away"):
        pf.next()
    with pytest.raises(RuntimeError, match="closed"):
        pf.next()


def test_queue_fills_and_close_stops_the_thread(prepared):
    dataset, cfg = prepared
    pf = Prefetcher(dataset, BatchSampler(dataset.lengths, cfg, seed=0), depth=3, pin_memory=False)
    deadline = time.time() + 10
    while pf.queue_depth < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert pf.queue_depth == 3
    thread = pf._thread
    pf.close()
    assert not thread.is_alive() and pf.queue_depth == 0
