"""The visibility rule: context strictly before the anchor, own block bidirectional, other blocks never."""

import torch

from blockdraft.model.masks import dense_mask


def test_dense_mask_matches_the_rule_entry_by_entry():
    t, b = 10, 3
    anchors = torch.tensor([[2, 5, 7]])
    m = dense_mask(anchors, t, b)[0, 0]
    assert m.shape == (9, t + 9)
    for q in range(9):
        j = q // b
        for kv in range(t + 9):
            if kv < t:
                expected = kv < anchors[0, j].item()
            else:
                expected = (kv - t) // b == j
            assert m[q, kv].item() == expected, (q, kv)


def test_anchor_position_itself_is_not_visible():
    m = dense_mask(torch.tensor([[4]]), 8, 2)[0, 0]
    assert m[:, 3].all() and not m[:, 4].any()
