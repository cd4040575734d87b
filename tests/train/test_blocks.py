"""Anchors and labels: no shift, assistant-only, whole blocks, without replacement."""

import torch

from blockdraft.train.blocks import sample_blocks

MASK = 99


def make(loss_mask, lengths, block=4, anchors=16, seed=0):
    n, t = loss_mask.shape
    ids = torch.arange(n * t).view(n, t) % 90 + 1
    g = torch.Generator().manual_seed(seed)
    return ids, sample_blocks(ids, loss_mask, lengths, block, anchors, MASK, g)


def test_labels_are_the_tokens_at_anchor_plus_k_without_shift():
    loss_mask = torch.ones(2, 20, dtype=torch.bool)
    ids, b = make(loss_mask, torch.tensor([20, 20]))
    for n in range(2):
        for j in range(b.anchors.shape[1]):
            if not b.valid[n, j]:
                continue
            a = int(b.anchors[n, j])
            assert b.tokens[n, j, 0] == ids[n, a]
            assert (b.tokens[n, j, 1:] == MASK).all()
            assert b.labels[n, j].tolist() == ids[n, a + 1 : a + 4].tolist()
            assert b.positions[n, j].tolist() == list(range(a, a + 4))


def test_anchors_only_on_assistant_tokens_where_a_block_fits():
    loss_mask = torch.zeros(1, 30, dtype=torch.bool)
    loss_mask[0, 10:20] = True
    _, b = make(loss_mask, torch.tensor([30]), anchors=30)
    chosen = b.anchors[b.valid].tolist()
    assert sorted(chosen) == list(range(10, 20))  # all candidates, each once
    assert b.label_mask[b.valid].any()
    # labels outside the assistant span are not counted
    for j, a in enumerate(b.anchors[0].tolist()):
        if b.valid[0, j]:
            for k in range(3):
                assert b.label_mask[0, j, k] == (10 <= a + k + 1 < 20)


def test_short_sequence_and_padding():
    loss_mask = torch.ones(2, 12, dtype=torch.bool)
    loss_mask[1, 6:] = False  # padding
    _, b = make(loss_mask, torch.tensor([12, 6]), anchors=50)
    assert (b.anchors[1][b.valid[1]] + 3 < 6).all()
    assert int(b.valid[0].sum()) == 12 - 4  # a in 1..8
    assert b.anchors.shape[1] == 12 - 4 + 1


def test_anchor_count_is_capped_and_sampling_is_seeded():
    loss_mask = torch.ones(1, 100, dtype=torch.bool)
    _, b1 = make(loss_mask, torch.tensor([100]), anchors=10, seed=1)
    _, b2 = make(loss_mask, torch.tensor([100]), anchors=10, seed=1)
    _, b3 = make(loss_mask, torch.tensor([100]), anchors=10, seed=2)
    assert int(b1.valid.sum()) == 10 and len(set(b1.anchors[0].tolist())) == 10
    assert torch.equal(b1.anchors, b2.anchors) and not torch.equal(b1.anchors, b3.anchors)
