"""Batched encoding (one `encode_batch` per chunk) gives exactly what the per-record method gave:
ids, the assistant-only loss mask, truncation and skip reasons with their line numbers, in order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from blockdraft.data.cache import encode_chunk
from blockdraft.data.reading import BadRecord, Chat, parse_item
from blockdraft.data.tokenize import SampleEncoder

from .conftest import chat
from .test_cache import corpus


def per_record(encoder: SampleEncoder, record) -> tuple[np.ndarray, np.ndarray, bool]:
    """The method before batching: one render-then-encode call per record."""
    if isinstance(record, Chat):
        full, spans = encoder.assistant_spans(record.messages)
        enc = encoder.backend.encode(full, add_special_tokens=False)
        ids, mask = enc.ids, encoder._mask_from_spans(enc.ids, enc.offsets, full, spans)
        if not mask.any():
            raise BadRecord("no_assistant_tokens")
    else:
        ids = encoder.backend.encode(record.text, add_special_tokens=True).ids
        mask = np.ones(len(ids), dtype=np.bool_)
    truncated = len(ids) > encoder.max_len
    if truncated:
        if encoder.overlong == "drop":
            raise BadRecord("overlong")
        ids, mask = ids[: encoder.max_len], mask[: encoder.max_len]
        if not mask.any():
            raise BadRecord("no_loss_within_max_len")
    return np.asarray(ids, dtype=np.int32), mask, truncated


def lines() -> list[bytes]:
    records = corpus(60) + [
        chat("only a question", ""),  # no assistant tokens
        chat("x " * 200, "late answer"),  # the answer lies beyond a short max_len
        {"messages": []},
        {"text": "plain text with a bos"},
    ]
    raw = [json.dumps(r).encode() for r in records]
    return raw[:10] + [b"{not json", b'{"messages": [{"role": "wizard", "content": "hi"}]}'] + raw[10:]


@pytest.mark.parametrize("style", ["qwen", "llama"])
@pytest.mark.parametrize("thinking,max_len,overlong", [(False, 4096, "truncate"), (True, 40, "truncate"),
                                                       (False, 120, "drop")])
def test_batched_chunk_equals_per_record_encoding(request, style, thinking, max_len, overlong):
    encoder = SampleEncoder(request.getfixturevalue(f"{style}_tok"), thinking, max_len, overlong)
    chunk = list(enumerate(lines(), start=1))
    expected_ids, expected_masks, expected_cut, expected_skips = [], [], [], []
    for line_no, item in chunk:
        try:
            ids, mask, cut = per_record(encoder, parse_item(item, "auto"))
        except BadRecord as bad:
            expected_skips.append((bad.reason, line_no))
            continue
        expected_ids.append(ids)
        expected_masks.append(mask)
        expected_cut.append(cut)
    result = encode_chunk(encoder, "auto", chunk)
    assert result.skips == expected_skips
    assert {reason for reason, _ in expected_skips} >= {"malformed_json", "unknown_role", "empty_conversation"}
    assert result.lengths.tolist() == [len(i) for i in expected_ids]
    assert np.array_equal(result.ids, np.concatenate(expected_ids))
    assert np.array_equal(result.mask, np.concatenate(expected_masks))
    assert result.truncated.tolist() == expected_cut
    assert result.loss_tokens.tolist() == [int(m.sum()) for m in expected_masks]
    assert 0 < result.mask.mean() < 1  # the mask is neither all on nor all off


def test_encode_many_keeps_order_and_reasons(qwen_tok):
    encoder = SampleEncoder(qwen_tok, False, 60, "drop")
    records = [parse_item(json.dumps(r).encode(), "auto") for r in corpus(16)]
    outcomes = []
    for record, result in zip(records, encoder.encode_many(records), strict=True):
        try:
            ids, mask, cut = per_record(encoder, record)
        except BadRecord as bad:
            assert isinstance(result, BadRecord) and result.reason == bad.reason
            outcomes.append(bad.reason)
            continue
        assert np.array_equal(result[0], ids) and np.array_equal(result[1], mask) and result[2] == cut
        outcomes.append("ok")
    assert "ok" in outcomes and "overlong" in outcomes[1:-1]  # a dropped record between kept ones
