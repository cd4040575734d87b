"""A corpus of broken files: every bad record is skipped, counted by reason, and located by line."""

from __future__ import annotations

import json

import pytest

from blockdraft.data.cache import prepare_dataset
from blockdraft.data.reading import BadRecord, Chat, Text, iter_records, parse_item
from blockdraft.errors import UserError

from .conftest import chat, data_cfg, write_jsonl

LONG = "the quick brown fox jumps over the lazy dog " * 20


def broken_corpus() -> list:
    return [
        chat("hello world", "fine, thank you."),  # 1 ok
        '{"messages": [{"role": "user", "content": "hi"}',  # 2 malformed_json
        chat("What is the capital of France?", "Paris."),  # 3 ok
        b'{"text": "caf\xe9 \xff"}',  # 4 invalid_utf8
        "[1, 2, 3]",  # 5 not_an_object
        {"prompt": "no known field"},  # 6 missing_field
        {"messages": [{"role": "wizard", "content": "abracadabra"}]},  # 7 unknown_role
        {"messages": []},  # 8 empty_conversation
        {"messages": [{"role": "user", "content": "only a question"}]},  # 9 no_assistant_tokens
        "",  # 10 blank: not a record
        {"messages": [{"role": "user"}]},  # 11 missing_field
        {"messages": "hello"},  # 12 bad_field
        {"text": "   "},  # 13 empty_text
        chat("hello", LONG),  # 14 overlong (drop)
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello world"}]},  # 15 ok
        chat("hello", "   "),  # 16 no_assistant_tokens
        {"messages": [{"role": "user", "content": 42}, {"role": "assistant", "content": "x"}]},  # 17 bad_field
        "not json at all",  # 18 malformed_json
    ]


def test_broken_corpus_counts_and_lines(tmp_path, qwen_tok):
    path = write_jsonl(tmp_path / "broken.jsonl", broken_corpus())
    _, report = prepare_dataset(data_cfg(tmp_path, max_len=64, overlong="drop"), qwen_tok, [str(path)])
    assert report.samples_total == 17
    assert report.samples_used == 3
    assert report.skipped == {
        "malformed_json": 2,
        "invalid_utf8": 1,
        "not_an_object": 1,
        "missing_field": 2,
        "unknown_role": 1,
        "empty_conversation": 1,
        "no_assistant_tokens": 2,
        "bad_field": 2,
        "empty_text": 1,
        "overlong": 1,
    }
    assert report.samples_used + sum(report.skipped.values()) == report.samples_total
    lines = {k: [int(w.rsplit(":", 1)[1]) for w in v] for k, v in report.first_bad_lines.items()}
    assert lines["malformed_json"] == [2, 18]
    assert lines["invalid_utf8"] == [4]
    assert lines["missing_field"] == [6, 11]
    assert lines["no_assistant_tokens"] == [9, 16]
    assert lines["overlong"] == [14]
    assert report.first_bad_lines["unknown_role"] == [f"{path}:7"]
    record = report.as_record()
    json.dumps(record)
    assert record["skipped"]["bad_field"] == 2


def test_truncation_keeps_or_skips_by_loss(tmp_path, qwen_tok):
    path = write_jsonl(tmp_path / "long.jsonl", [chat("hello", LONG), chat(LONG, "fine, thank you.")])
    dataset, report = prepare_dataset(data_cfg(tmp_path, max_len=64), qwen_tok, [str(path)])
    assert report.samples_used == 1 and report.truncated == 1
    assert report.skipped == {"no_loss_within_max_len": 1}
    assert dataset.lengths.tolist() == [64]
    assert dataset.source(0) == f"{path}:1"


def test_all_bad_is_one_clear_error(tmp_path, qwen_tok):
    path = write_jsonl(tmp_path / "bad.jsonl", ["{", {"messages": []}])
    with pytest.raises(UserError, match=r"no usable samples.*malformed_json.*bad\.jsonl:1"):
        prepare_dataset(data_cfg(tmp_path), qwen_tok, [str(path)])


def test_missing_file_is_a_user_error(tmp_path, qwen_tok):
    with pytest.raises(UserError, match="not found"):
        prepare_dataset(data_cfg(tmp_path), qwen_tok, [str(tmp_path / "nope.jsonl")])
    with pytest.raises(UserError, match="no data files"):
        prepare_dataset(data_cfg(tmp_path), qwen_tok)


def test_formats_and_role_aliases():
    rec = parse_item(b'{"conversations": [{"from": "human", "value": "a"}, {"from": "GPT", "value": "b"}]}', "auto")
    assert rec == Chat([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    parts = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c"},
        ]
    }
    assert parse_item(parts, "auto").messages[0]["content"] == "ab"
    assert parse_item({"text": "x", "messages": []}, "text") == Text("x")
    with pytest.raises(BadRecord) as bad:
        parse_item({"text": "x"}, "messages")
    assert bad.value.reason == "missing_field"


def test_json_array_and_parquet(tmp_path, qwen_tok):
    records = [chat("hello world", "fine, thank you."), chat("What is the capital?", "Paris.")]
    jsonl = write_jsonl(tmp_path / "a.jsonl", records)
    array = tmp_path / "b.json"
    array.write_text(json.dumps(records + [{"messages": []}]))
    assert [(n, type(r).__name__) for n, r in iter_records(array, "auto")] == [
        (1, "Chat"),
        (2, "Chat"),
        (3, "BadRecord"),
    ]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    cfg = data_cfg(tmp_path)
    a, _ = prepare_dataset(cfg, qwen_tok, [str(jsonl)])
    b, rb = prepare_dataset(cfg, qwen_tok, [str(array)])
    c, _ = prepare_dataset(cfg, qwen_tok, [str(parquet)])
    assert rb.skipped == {"empty_conversation": 1}
    for i in range(2):
        assert a.sample(i)[0].tolist() == b.sample(i)[0].tolist() == c.sample(i)[0].tolist()


def test_bom_gzip_string_turns_and_folders(tmp_path, qwen_tok):
    import gzip

    good = chat("hello world", "fine, thank you.")
    lines = [b"\xef\xbb\xbf" + json.dumps(good).encode(), json.dumps({"messages": json.dumps(good["messages"])})]
    path = tmp_path / "d.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
    dataset, report = prepare_dataset(data_cfg(tmp_path), qwen_tok, [str(path)])
    assert report.samples_used == 2 and not report.skipped
    assert dataset.sample(0)[0].tolist() == dataset.sample(1)[0].tolist()
    with pytest.raises(UserError, match="folder"):
        prepare_dataset(data_cfg(tmp_path), qwen_tok, [str(tmp_path)])


def test_a_folder_stands_for_its_data_files(tmp_path):
    from blockdraft.data.reading import check_files

    (tmp_path / "shard-00001.jsonl").write_text("{}\n")
    (tmp_path / "shard-00000.jsonl").write_text("{}\n")
    (tmp_path / "manifest.json").write_text("{}")  # regenerate's settings, not data
    (tmp_path / "shard-00002.jsonl.tmp").write_text("")  # a shard still being written
    assert [p.name for p in check_files([str(tmp_path)])] == ["shard-00000.jsonl", "shard-00001.jsonl"]
