"""Packing, anchors and labels: no padding, no shift, assistant-only, whole blocks, without replacement."""

import torch

from blockdraft.train.blocks import pack, sample_blocks

MASK = 99


def make(loss_mask, lengths, block=4, anchors=16, seed=0):
    n, t = loss_mask.shape
    ids = torch.arange(n * t).view(n, t) % 90 + 1
    packed = pack(ids, loss_mask, lengths, block, anchors)
    g = torch.Generator().manual_seed(seed)
    return ids, packed, sample_blocks(packed, block, anchors, MASK, g)


def test_packing_keeps_exactly_the_real_tokens_in_order():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    mask = torch.tensor([[False, True, True, False], [True, True, False, False]])
    p = pack(ids, mask, torch.tensor([3, 2]), block_size=2, num_anchors=8)
    assert p.input_ids.tolist() == [5, 6, 7, 8, 9]
    assert p.doc.tolist() == [0, 0, 0, 1, 1] and p.pos.tolist() == [0, 1, 2, 0, 1]
    assert p.loss_mask.tolist() == [False, True, True, True, True]
    assert p.candidates.tolist() == [False, True, False, False, False]  # a >= 1 and a + B - 1 < length
    assert p.num_blocks == 1


def test_labels_are_the_tokens_at_anchor_plus_k_without_shift():
    loss_mask = torch.ones(2, 20, dtype=torch.bool)
    ids, p, b = make(loss_mask, torch.tensor([20, 20]))
    assert b.anchors.shape[0] == 2 * 16
    for j in range(b.anchors.shape[0]):
        n, a = int(b.doc[j]), int(p.pos[b.anchors[j]])
        assert b.tokens[j, 0] == ids[n, a]
        assert (b.tokens[j, 1:] == MASK).all()
        assert b.labels[j].tolist() == ids[n, a + 1 : a + 4].tolist()
        assert b.positions[j].tolist() == list(range(a, a + 4))


def test_anchors_only_on_assistant_tokens_where_a_block_fits():
    loss_mask = torch.zeros(1, 30, dtype=torch.bool)
    loss_mask[0, 10:20] = True
    _, p, b = make(loss_mask, torch.tensor([30]), anchors=30)
    assert sorted(b.anchors.tolist()) == list(range(10, 20))  # all candidates, each once
    for j, a in enumerate(b.anchors.tolist()):  # labels outside the assistant span are not counted
        for k in range(3):
            assert b.label_mask[j, k] == (10 <= a + k + 1 < 20)


def test_padding_is_never_packed_and_blocks_stay_inside_their_sequence():
    loss_mask = torch.ones(2, 12, dtype=torch.bool)
    loss_mask[1, 6:] = False  # padding
    ids, p, b = make(loss_mask, torch.tensor([12, 6]), anchors=50)
    assert p.input_ids.shape[0] == 18
    assert b.anchors.shape[0] == (12 - 4) + (6 - 4)  # a in 1..8 and 1..2
    second = b.doc == 1
    assert (p.pos[b.anchors[second]] + 3 < 6).all()
    assert b.labels[second].tolist() == [ids[1, a + 1 : a + 4].tolist() for a in p.pos[b.anchors[second]].tolist()]


def test_anchor_count_is_capped_per_sequence_and_sampling_is_seeded():
    loss_mask = torch.ones(2, 100, dtype=torch.bool)
    lengths = torch.tensor([100, 100])
    _, _, b1 = make(loss_mask, lengths, anchors=10, seed=1)
    _, _, b2 = make(loss_mask, lengths, anchors=10, seed=1)
    _, _, b3 = make(loss_mask, lengths, anchors=10, seed=2)
    assert (b1.doc == 0).sum() == 10 and (b1.doc == 1).sum() == 10
    assert len(set(b1.anchors.tolist())) == 20
    assert torch.equal(b1.anchors, b2.anchors) and not torch.equal(b1.anchors, b3.anchors)


def test_anchors_are_uniform_over_the_candidates():
    loss_mask = torch.ones(1, 14, dtype=torch.bool)  # candidates a = 1..10 (B = 4)
    counts = torch.zeros(14)
    for seed in range(2000):
        _, _, b = make(loss_mask, torch.tensor([14]), anchors=3, seed=seed)
        counts[b.anchors] += 1
    share = counts[1:11] / 2000
    assert counts[0] == 0 and counts[11:].sum() == 0
    assert (share - 0.3).abs().max() < 0.05  # 3 of 10 each time: 0.3 each, binomial sd 0.01


def test_a_batch_without_candidates_gets_one_block_without_labels():
    loss_mask = torch.zeros(1, 10, dtype=torch.bool)
    _, p, b = make(loss_mask, torch.tensor([10]))
    assert p.num_blocks == 0
    assert b.anchors.shape == (1,) and not b.label_mask.any()
