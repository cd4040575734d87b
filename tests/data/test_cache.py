"""The on-disk cache: hits on a re-run, misses when any input changes, parallel == serial."""

from __future__ import annotations

import os

import numpy as np
import pytest

from blockdraft.data import cache as cache_mod
from blockdraft.data.cache import cache_key, prepare_dataset
from blockdraft.data.reading import check_files
from blockdraft.data.tokenize import SampleEncoder
from blockdraft.errors import UserError

from .conftest import chat, data_cfg, make_tokenizer, write_jsonl

SENTENCES = [
    "hello world",
    "the quick brown fox",
    "What is the capital of France?",
    "Paris is the capital.",
    "def add(a, b): return a + b",
    "Recursion is when a function calls itself.",
]


def corpus(n: int) -> list[dict]:
    rng = np.random.default_rng(n)
    out = []
    for i in range(n):
        turns = [" ".join(rng.choice(SENTENCES, size=rng.integers(1, 6))) for _ in range(2 * rng.integers(1, 4))]
        out.append(chat(*turns) if i % 7 else {"text": turns[0]})
    return out


def arrays(dataset) -> list[tuple[list[int], list[bool]]]:
    return [(dataset.sample(i)[0].tolist(), dataset.sample(i)[1].tolist()) for i in range(len(dataset))]


def test_rerun_hits_the_cache(tmp_path, qwen_tok):
    path = write_jsonl(tmp_path / "d.jsonl", corpus(50))
    cfg = data_cfg(tmp_path)
    first, report1 = prepare_dataset(cfg, qwen_tok, [str(path)])
    second, report2 = prepare_dataset(cfg, qwen_tok, [str(path)])
    assert not report1.cache_hit and report2.cache_hit
    assert report1.as_record() | {"cache_hit": True} == report2.as_record()
    assert arrays(first) == arrays(second)
    assert first.lengths.dtype == np.int32 and len(first) == 50
    assert isinstance(second.ids, np.memmap)
    assert [int(m.sum()) for _, m in (second.sample(i) for i in range(50))] == [int(sum(m)) for _, m in arrays(first)]


def test_key_follows_every_input(tmp_path, qwen_tok):
    path = write_jsonl(tmp_path / "d.jsonl", corpus(5))
    paths = check_files([str(path)])
    cfg = data_cfg(tmp_path)
    key = cache_key(paths, qwen_tok, cfg)
    assert cache_key(paths, make_tokenizer("qwen"), cfg) == key  # same tokenizer rebuilt: same key
    changed = [
        cache_key(paths, qwen_tok, cfg.model_copy(update={"max_len": 100})),
        cache_key(paths, qwen_tok, cfg.model_copy(update={"thinking": True})),
        cache_key(paths, qwen_tok, cfg.model_copy(update={"overlong": "drop"})),
        cache_key(paths, qwen_tok, cfg.model_copy(update={"format": "messages"})),
        cache_key(paths, make_tokenizer("llama"), cfg),
    ]
    other_template = make_tokenizer("qwen")
    other_template.chat_template = other_template.chat_template.replace("\\n", "\\n\\n", 1)
    changed.append(cache_key(paths, other_template, cfg))
    write_jsonl(path, corpus(5)[:4])
    changed.append(cache_key(paths, qwen_tok, cfg))
    assert key not in changed and len(set(changed)) == len(changed)


def test_parallel_tokenisation_matches_serial(tmp_path, qwen_tok, monkeypatch):
    files = [str(write_jsonl(tmp_path / f"d{i}.jsonl", corpus(700 + i))) for i in range(2)]
    serial, serial_report = prepare_dataset(data_cfg(tmp_path / "a"), qwen_tok, files)
    monkeypatch.setattr(cache_mod, "PARALLEL_MIN_BYTES", 0)
    cfg = data_cfg(tmp_path / "b").model_copy(update={"num_workers": 2})
    parallel, parallel_report = prepare_dataset(cfg, qwen_tok, files, progress=True)
    assert arrays(serial) == arrays(parallel)
    assert serial_report.samples_used == parallel_report.samples_used == 1401
    assert np.array_equal(serial.sources, parallel.sources)
    assert parallel.source(700) == f"{files[1]}:1"


class _DiesInWorker(SampleEncoder):
    """Unpickled in a tokeniser process, it ends that process at once: a worker killed for memory."""

    def __reduce__(self):
        return os._exit, (3,)


def test_a_tokeniser_process_that_dies_is_one_clear_error_not_a_hang(tmp_path, qwen_tok, monkeypatch):
    files = [str(write_jsonl(tmp_path / "d.jsonl", corpus(300)))]
    monkeypatch.setattr(cache_mod, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(cache_mod, "SampleEncoder", _DiesInWorker)
    cfg = data_cfg(tmp_path / "c").model_copy(update={"num_workers": 2})
    with pytest.raises(UserError, match="tokeniser process died.*data.num_workers"):
        prepare_dataset(cfg, qwen_tok, files)
    assert not list((tmp_path / "c").rglob("*.tmp-*"))  # nothing half-written is left in the cache
