"""The visibility rule: context of the same sequence strictly before the anchor, own block
bidirectional, other blocks and other sequences never."""

import pytest
import torch

from blockdraft.model.masks import dense_mask


def test_dense_mask_matches_the_rule_entry_by_entry():
    b = 3
    context_doc = torch.tensor([0] * 6 + [1] * 4)  # two packed sequences: 6 then 4 tokens
    anchors = torch.tensor([2, 4, 7])  # packed indices; the last block is sequence 1's
    block_doc = torch.tensor([0, 0, 1])
    t = context_doc.shape[0]
    m = dense_mask(anchors, block_doc, context_doc, b)[0, 0]
    assert m.shape == (9, t + 9)
    for q in range(9):
        j = q // b
        for kv in range(t + 9):
            if kv < t:
                expected = bool(context_doc[kv] == block_doc[j]) and kv < anchors[j].item()
            else:
                expected = (kv - t) // b == j
            assert m[q, kv].item() == expected, (q, kv)


def test_anchor_position_itself_is_not_visible():
    m = dense_mask(torch.tensor([4]), torch.tensor([0]), torch.zeros(8, dtype=torch.long), 2)[0, 0]
    assert m[:, 3].all() and not m[:, 4].any()


def test_a_block_never_sees_the_sequence_packed_before_it():
    context_doc = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    m = dense_mask(torch.tensor([6]), torch.tensor([1]), context_doc, 2)[0, 0]
    assert not m[:, :4].any() and m[:, 4:6].all() and not m[:, 6:8].any()


def test_a_block_mask_built_from_captures_padded_to_fixed_sizes_is_the_same_mask():
    """The compiled path pads the mask_mod's captured tensors to the run's largest classes (so no graph
    guards on their sizes): the mask it builds must be the unpadded one, tile for tile."""
    from blockdraft.model.masks import flex_block_mask

    gen = torch.Generator().manual_seed(0)
    b = 16
    context_doc = torch.repeat_interleave(torch.arange(3), torch.tensor([100, 60, 96]))  # L = 256
    anchors = torch.randint(0, 256, (24,), generator=gen).sort().values  # V = 24, V*B = 384
    block_doc = context_doc[anchors]
    plain = flex_block_mask(anchors, block_doc, context_doc, b)
    padded = flex_block_mask(anchors, block_doc, context_doc, b, capture=1024)
    assert padded.shape == plain.shape == (1, 1, 384, 256 + 384)
    torch.testing.assert_close(padded.to_dense(), plain.to_dense(), rtol=0, atol=0)
    q, kv = torch.arange(384)[:, None], torch.arange(640)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    dense = dense_mask(anchors, block_doc, context_doc, b)[0, 0]
    assert torch.equal(padded.mask_mod(zero, zero, q, kv), dense)  # and entry by entry, not only per tile


def test_the_block_mask_tiles_are_those_create_block_mask_finds_entry_by_entry():
    """The tile lists come from interval arithmetic; evaluated entry by entry, the rule must give the
    same lists (a tile wrongly taken whole would let queries see keys the rule hides). Packings from
    `pack` and `sample_blocks` themselves: several sequences, shape-class filler context and blocks,
    a block count whose queries end inside a tile."""
    from torch.nn.attention.flex_attention import create_block_mask

    from blockdraft.model.masks import flex_block_mask, intervals, visibility
    from blockdraft.train.blocks import pack, sample_blocks
    from blockdraft.train.shapes import ShapeClasses

    gen = torch.Generator().manual_seed(1)
    for b, lengths, shapes in [(16, [300, 41, 170], ShapeClasses.for_budget(16, 1024)),
                               (16, [700, 200], None), (8, [90, 130, 33, 260], None),
                               (4, [257], ShapeClasses.for_budget(4, 512))]:
        n, t = len(lengths), max(lengths)
        ids = torch.randint(5, 100, (n, t), generator=gen)
        loss_mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
        loss_mask &= torch.rand(n, t, generator=gen) > 0.2
        packed = pack(ids, loss_mask, torch.tensor(lengths), b, 512, None, shapes)
        blocks = sample_blocks(packed, b, 512, 0, gen)
        ours = flex_block_mask(blocks.anchors, blocks.doc, packed.doc, b)
        q_len, kv_len = ours.seq_lengths
        rule = visibility(*intervals(blocks.anchors, blocks.doc, packed.doc, b), b)
        theirs = create_block_mask(rule, None, None, q_len, kv_len, device="cpu")
        assert ours.seq_lengths == theirs.seq_lengths and ours.BLOCK_SIZE == theirs.BLOCK_SIZE
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
            assert torch.equal(getattr(ours, name), getattr(theirs, name)), (b, lengths, name)
            assert getattr(ours, name).is_contiguous(), name  # FlashAttention-4 reads row-major tile lists only
        assert int(ours.full_kv_num_blocks.sum()) > 0 and int(ours.kv_num_blocks.sum()) > 0  # both kinds met
        # the intervals are the rule as stated, by sequence ids, entry by entry (fillers included)
        q, kv, zero = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :], torch.zeros(())
        j, length = q // b, packed.doc.shape[0]
        same_doc = packed.doc[kv.clamp(max=length - 1)] == blocks.doc[j]
        by_ids = torch.where(kv < length, same_doc & (kv < blocks.anchors[j]), (kv - length) // b == j)
        assert torch.equal(rule(zero, zero, q, kv), by_ids), (b, lengths)


def test_the_whole_tile_hint_is_given_only_for_whole_tiles_and_changes_no_output():
    """IS_DIVISIBLE lets the flex kernels skip bounds checks: wrong unless both lengths are whole tiles."""
    from torch.nn.attention.flex_attention import flex_attention

    from blockdraft.model.drafter import flex_kernel_options
    from blockdraft.model.masks import TILE, flex_block_mask

    b = 16
    anchors, block_doc = torch.tensor([3, 40, 100, 130, 200, 250, 10, 20]), torch.tensor([0, 0, 0, 1, 1, 1, 0, 0])
    context_doc = torch.tensor([0] * 128 + [1] * 128)
    mask = flex_block_mask(anchors, block_doc, context_doc, b)
    assert flex_kernel_options(mask, TILE, 3 * TILE) == {"IS_DIVISIBLE": True}
    assert flex_kernel_options(mask, TILE, 3 * TILE - 8) == {} and flex_kernel_options(mask, TILE - 16, 2 * TILE) == {}
    q, k = torch.randn(1, 4, 8 * b, 32), torch.randn(1, 2, 256 + 8 * b, 32)
    hint = flex_kernel_options(mask, q.shape[2], k.shape[2])
    assert hint == {"IS_DIVISIBLE": True}
    hinted = flex_attention(q, k, k, block_mask=mask, enable_gqa=True, kernel_options=hint)
    assert torch.equal(hinted, flex_attention(q, k, k, block_mask=mask, enable_gqa=True))


@pytest.mark.parametrize("context, anchors", [(300, [40, 150, 260]), (40, [10, 30])])
def test_the_block_mask_tile_lists_are_row_major_for_a_pass_of_one_query_tile(context, anchors):
    """FlashAttention-4 takes the tile lists only with stride 1 on the last dim. A pass of at most 128
    block tokens has one query tile, so the backward's lists (per key tile) have a last dim of size 1:
    its stride must still be 1, as a fresh tensor's would be. Key tiles: 3, then 1."""
    from blockdraft.model.masks import TILE, flex_block_mask

    b = 16
    anchors = torch.tensor(anchors)  # V*B <= 48 queries: one query tile
    doc = torch.zeros(context, dtype=torch.long)  # one sequence
    mask = flex_block_mask(anchors, doc[anchors], doc, b)
    assert mask.q_indices.shape == (1, 1, -(-(context + len(anchors) * b) // TILE), 1)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        t = getattr(mask, name)
        assert t.stride() == torch.empty(t.shape).stride(), (name, t.shape, t.stride())
