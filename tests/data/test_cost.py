"""The cost model: anchor candidates as training counts them, and a micro-batch's cost as the model
FLOPs of model/flops.py give it for the padded target forward plus the drafter's work."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import Qwen3Config

from blockdraft.config import build_config
from blockdraft.data import cost
from blockdraft.data.batching import batch_cost
from blockdraft.model.flops import Dims, DraftWork, drafter_flops, target_flops
from blockdraft.train.blocks import pack


def fake_dataset(lengths: list[int], rng: np.random.Generator) -> SimpleNamespace:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return SimpleNamespace(lengths=np.asarray(lengths, dtype=np.int32), offsets=offsets,
                           mask=rng.random(int(offsets[-1])) < 0.6)


@pytest.mark.parametrize("scan_tokens", [7, 1 << 22])
def test_anchor_candidates_are_the_ones_training_samples_from(monkeypatch, scan_tokens):
    monkeypatch.setattr(cost, "SCAN_TOKENS", scan_tokens)  # a scan cut into many pieces counts the same
    rng = np.random.default_rng(0)
    ds = fake_dataset([3, 17, 1, 40, 9, 25], rng)
    counts, pos_sums = cost.anchor_candidates(ds, block_size=4)
    for i, n in enumerate(ds.lengths.tolist()):
        mask = torch.from_numpy(ds.mask[ds.offsets[i] : ds.offsets[i + 1]].copy())[None]
        packed = pack(torch.zeros(1, n, dtype=torch.long), mask, torch.tensor([n]), block_size=4, num_anchors=10**6)
        assert counts[i] == packed.num_blocks
        assert pos_sums[i] == packed.pos[packed.candidates].sum().item()


def test_a_micro_batch_costs_the_padded_target_forward_plus_the_drafter_work():
    hf = Qwen3Config(vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    cfg = build_config({"target": {"path": "unused"}, "drafter": {"num_layers": 2, "block_size": 8},
                        "train": {"num_anchors": 5}})
    lengths = np.array([30, 12, 50])
    candidates = np.array([20, 3, 41])
    pos_sums = np.array([300.0, 20.0, 1000.0])
    costs = cost.flop_costs(lengths, candidates, pos_sums, hf, cfg, [1, 4])
    blocks = np.minimum(candidates, 5)
    work = DraftWork(int(lengths.sum()), int(blocks.sum()), float((blocks * pos_sums / candidates).sum()),
                     int(blocks.sum()) * 7)
    expected = target_flops([50] * 3, Dims.of(hf), 5) + drafter_flops(work, Dims.of(hf), 2, 2, 8, 500)
    assert batch_cost(np.array([1, 0, 2]), costs) == pytest.approx(expected, rel=1e-12)
    tokens = cost.token_costs(lengths)
    assert batch_cost(np.array([1, 0, 2]), tokens) == 150  # padded tokens


def test_flop_costs_follow_the_anchor_density():
    """With train.anchors_per_token a sample's blocks (hence its cost) are capped by its answer tokens."""
    from blockdraft.data.cost import flop_costs

    raw = {"target": {"path": "unused"}, "drafter": {"num_layers": 1, "block_size": 4}}
    cfg = build_config(raw, [])
    dense = build_config(raw, ["train.anchors_per_token=0.1"])
    hf = SimpleNamespace(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         intermediate_size=64, vocab_size=320, num_hidden_layers=4)
    lengths, cands, sums, answers = np.array([100, 100]), np.array([8, 8]), np.array([400.0, 400.0]), np.array([90, 20])
    plain = flop_costs(lengths, cands, sums, hf, cfg, [1, 2], answers).work
    fewer = flop_costs(lengths, cands, sums, hf, dense, [1, 2], answers).work
    assert plain[0] == plain[1] and fewer[0] == plain[0]  # 9 blocks allowed >= 8 candidates
    assert fewer[1] < plain[1]  # 2 blocks instead of 8
