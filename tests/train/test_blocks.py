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


def _three_answers():
    """Answers of 32, 22 and 10 tokens in sequences of 40, 25 and 12."""
    lengths, t = torch.tensor([40, 25, 12]), 40
    mask = torch.zeros(3, t, dtype=torch.bool)
    mask[0, 8:40], mask[1, 3:25], mask[2, 2:12] = True, True, True
    return torch.arange(3 * t).view(3, t) % 90 + 1, mask, lengths


def test_the_default_density_draws_the_anchors_it_always_drew():
    ids, mask, lengths = _three_answers()
    p = pack(ids, mask, lengths, 4, 6)
    b = sample_blocks(p, 4, 6, MASK, torch.Generator().manual_seed(7))
    # recorded from the sampler before anchors_per_token and shape classes existed
    assert b.anchors.tolist() == [10, 11, 13, 16, 31, 35, 44, 45, 47, 50, 51, 52, 67, 69, 70, 71, 72, 73]


def test_anchors_per_token_gives_short_answers_fewer_blocks_and_num_anchors_still_caps():
    ids, mask, lengths = _three_answers()
    p = pack(ids, mask, lengths, 4, num_anchors=6, anchors_per_token=0.25)
    b = sample_blocks(p, 4, 6, MASK, torch.Generator().manual_seed(7))
    # ceil(0.25 x answer tokens), capped by 6 and by the candidates (answer positions whose block fits)
    assert p.doc_blocks.tolist() == [6, 6, 3, 0]  # 32 -> 8 -> 6; 22 -> 6 (5.5 up); 10 -> 3
    assert b.doc.tolist() == [0] * 6 + [1] * 6 + [2] * 3 and p.num_blocks == 15
    assert b.label_mask.any(dim=1).all()
    long = pack(ids, mask, lengths, 4, num_anchors=100, anchors_per_token=0.1)
    assert long.doc_blocks.tolist() == [4, 3, 1, 0]  # 3.2 -> 4, 2.2 -> 3, 1.0 -> 1
    few = sample_blocks(long, 4, 100, MASK, torch.Generator().manual_seed(7))
    assert torch.bincount(few.doc, minlength=3).tolist() == [4, 3, 1]
    assert len(set(few.anchors.tolist())) == 8  # without replacement


def test_shape_classes_pad_the_pass_but_keep_its_anchors_and_labels():
    from blockdraft.train.shapes import ShapeClasses

    ids, mask, lengths = _three_answers()
    plain = pack(ids, mask, lengths, 4, 6)
    padded = pack(ids, mask, lengths, 4, 6, shapes=ShapeClasses.for_budget(4, 300))
    assert plain.input_ids.shape[0] == plain.real_tokens == padded.real_tokens == 77
    assert padded.input_ids.shape[0] == 512  # the budget's context, whatever the pass's length
    assert padded.padded_blocks == 32  # 128 // B = 32 blocks a step
    assert (padded.doc[77:] == 3).all() and not padded.candidates[77:].any()
    a = sample_blocks(plain, 4, 6, MASK, torch.Generator().manual_seed(7))
    b = sample_blocks(padded, 4, 6, MASK, torch.Generator().manual_seed(7))
    v = a.anchors.shape[0]
    assert b.anchors.shape[0] == 32 and b.anchors[:v].tolist() == a.anchors.tolist()
    for name in ("doc", "tokens", "positions", "labels", "label_mask"):
        assert getattr(b, name)[:v].tolist() == getattr(a, name).tolist(), name
    assert (b.doc[v:] == -1).all() and not b.label_mask[v:].any()  # filler: no context, no label
