"""The bench's synthetic samples are cut into micro-batches as `blockdraft train` cuts a real dataset."""

from types import SimpleNamespace

import numpy as np

from blockdraft.bench.shapes import target_config
from blockdraft.bench.synthetic import SyntheticDataset
from blockdraft.config import build_config
from blockdraft.data.cost import anchor_candidates, dataset_costs, flop_costs


def test_the_mix_costs_are_those_of_the_same_samples_read_as_a_dataset():
    cfg = build_config({"target": {"path": "<tiny>"}, "data": {"max_len": 512}}, [])
    hf_cfg = target_config("tiny", None)
    data = SyntheticDataset("mix", 512, hf_cfg.vocab_size, 300, median=120, sigma=0.9)
    samples = [data.sample(i) for i in range(len(data))]
    as_read = SimpleNamespace(  # what data/cache.py's TokenizedDataset gives anchor_candidates
        lengths=data.lengths, offsets=np.concatenate([[0], np.cumsum(data.lengths)]),
        mask=np.concatenate([m for _, m in samples]))
    counts, pos_sums = anchor_candidates(as_read, cfg.drafter.block_size)
    answers = np.asarray([m.sum() for _, m in samples])
    expected = flop_costs(data.lengths, counts, pos_sums, hf_cfg, cfg, [1, 2], answers)
    got = dataset_costs(data, hf_cfg, cfg, [1, 2])
    assert got.kind == "flops" and (counts > 0).all()
    np.testing.assert_allclose(got.work, expected.work, rtol=1e-12)
    np.testing.assert_allclose(got.row, expected.row, rtol=1e-12)
