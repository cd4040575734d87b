"""The visibility rule: context of the same sequence strictly before the anchor, own block
bidirectional, other blocks and other sequences never."""

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
    padded = flex_block_mask(anchors, block_doc, context_doc, b, capture=(1024, 4096))
    assert padded.shape == plain.shape == (1, 1, 384, 256 + 384)
    torch.testing.assert_close(padded.to_dense(), plain.to_dense(), rtol=0, atol=0)
    q, kv = torch.arange(384)[:, None], torch.arange(640)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    dense = dense_mask(anchors, block_doc, context_doc, b)[0, 0]
    assert torch.equal(padded.mask_mod(zero, zero, q, kv), dense)  # and entry by entry, not only per tile
