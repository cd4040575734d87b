"""`blockdraft data` and `blockdraft regenerate` through the real CLI entry point."""

from __future__ import annotations

import json
import shutil
import signal

import pytest

from blockdraft import cli
from blockdraft.data import regenerate
from tests.data.conftest import chat, write_jsonl
from tests.data.test_reading import broken_corpus


def test_data_json_counts_and_plan(tmp_path, qwen_dir, capsys):
    path = write_jsonl(tmp_path / "broken.jsonl", broken_corpus() + [chat("hello world", "fine.")] * 30)
    rc = cli.main(
        [
            "data",
            str(path),
            "--target",
            str(qwen_dir),
            "--max-len",
            "64",
            "--overlong",
            "drop",
            "--tokens-per-batch",
            "256",
            "--cache-dir",
            str(tmp_path / "c"),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in (
        "samples_total",
        "samples_used",
        "skipped",
        "buckets",
        "batches",
        "max_same_bucket_run",
        "length_autocorr_lag1",
        "pad_frac",
        "first_bad_lines",
        "length_histogram",
    ):
        assert key in out
    assert (out["samples_total"], out["samples_used"]) == (47, 33)
    assert out["skipped"]["malformed_json"] == 2 and out["first_bad_lines"]["invalid_utf8"] == [f"{path}:4"]
    assert sum(b["samples"] for b in out["buckets"]) == 33
    assert sum(b["batches"] for b in out["buckets"]) == out["batches"]
    assert sum(h["samples"] for h in out["length_histogram"]) == 33


def test_data_tables(tmp_path, qwen_dir, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", broken_corpus())
    rc = cli.main(
        ["data", str(path), "--target", str(qwen_dir), "--cache-dir", str(tmp_path / "c"), "--buckets", "20,40"]
    )
    text = capsys.readouterr().out
    assert rc == 0
    for needle in ("skipped records", "malformed_json", "d.jsonl:2", "batch plan", "max same-bucket run"):
        assert needle in text


@pytest.mark.parametrize(
    "argv_tail, message",
    [
        (["missing.jsonl"], "data file not found"),
        (["ALLBAD"], "no usable samples"),
        (["GOOD", "--buckets", "a,b"], "--buckets"),
        (["GOOD", "--max-len", "2"], "data.max_len"),
    ],
)
def test_data_user_errors_exit_2(tmp_path, qwen_dir, capsys, argv_tail, message):
    good = write_jsonl(tmp_path / "good.jsonl", [chat("hello", "world")])
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{", {"messages": []}])
    argv = [str(good) if a == "GOOD" else str(bad) if a == "ALLBAD" else a for a in argv_tail]
    rc = cli.main(["data", *argv, "--target", str(qwen_dir), "--cache-dir", str(tmp_path / "c")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1


def test_data_takes_a_hub_id_from_the_local_cache(tmp_path, qwen_dir, capsys, monkeypatch):
    """`--target owner/name` resolves to its cached snapshot, as `train` and `regenerate` do."""
    from huggingface_hub import constants

    from tests.model.test_locate import fake_hub_cache

    fake_hub_cache(tmp_path / "hub", "acme/tiny-tok", qwen_dir)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    path = write_jsonl(tmp_path / "d.jsonl", [chat("hello world", "fine.")] * 5)
    argv = ["data", str(path), "--target", "acme/tiny-tok", "--cache-dir", str(tmp_path / "c"), "--json"]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["samples_used"] == 5
    assert cli.main([*argv[:3], "acme/not-cached", *argv[4:]]) == 2
    assert "nor in the local Hugging Face cache" in capsys.readouterr().err


def test_data_bad_target_exit_2(tmp_path, capsys):
    good = write_jsonl(tmp_path / "good.jsonl", [chat("hello", "world")])
    assert cli.main(["data", str(good), "--target", str(tmp_path / "nowhere")]) == 2
    assert "target folder not found" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory, qwen_tok):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("tiny_qwen3")
    config = Qwen3Config(
        vocab_size=len(qwen_tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        eos_token_id=qwen_tok.eos_token_id,
        pad_token_id=qwen_tok.pad_token_id,
    )
    Qwen3ForCausalLM(config).save_pretrained(path)
    qwen_tok.save_pretrained(path)
    return path


def test_regenerate_refuses_a_target_larger_than_the_free_memory_in_one_line(tmp_path, tiny_target, capsys,
                                                                              monkeypatch):
    from blockdraft import device

    monkeypatch.setattr(device, "free_memory_bytes", lambda where: 1000)
    src = write_jsonl(tmp_path / "in.jsonl", [chat("hello", "old answer")])
    assert cli.main(["regenerate", "--target", str(tiny_target), "--in", str(src), "--out", str(tmp_path / "out"),
                     "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{tiny_target.name}'s weights in float32 take" in err and "\n" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("shard-*.jsonl"))


def test_regenerate_writes_shards_and_resumes(tmp_path, tiny_target, capsys, monkeypatch):
    records = [
        chat("hello world", "old answer", "the capital?", "old again"),
        {"text": "def add(a, b):"},
        {"messages": [{"role": "user", "content": "prompt only"}]},
        "{broken",
        chat("quick", "fox"),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out"
    argv = [
        "regenerate",
        "--target",
        str(tiny_target),
        "--in",
        str(src),
        "--out",
        str(out),
        "--max-new-tokens",
        "5",
        "--batch-size",
        "2",
        "--shard-size",
        "3",
    ]
    caller_handler = signal.getsignal(signal.SIGTERM)
    assert cli.main(argv) == 0
    assert signal.getsignal(signal.SIGTERM) is caller_handler  # a library caller keeps its own SIGTERM handler
    shards = sorted(out.glob("shard-*.jsonl"))
    assert [p.name for p in shards] == ["shard-00000.jsonl", "shard-00001.jsonl"]
    rows = [json.loads(line) for p in shards for line in p.read_text().splitlines()]
    assert [r["source"].rsplit(":", 1)[1] for r in rows] == ["1", "2", "3", "5"]
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == ["user", "assistant", "user", "assistant"]
    assert first[0]["content"] == "hello world" and first[2]["content"] == "the capital?"
    assert "old" not in first[1]["content"] + first[3]["content"]
    assert [m["role"] for m in rows[1]["messages"]] == ["user", "assistant"]  # text record = a prompt
    assert [m["role"] for m in rows[2]["messages"]] == ["user", "assistant"]  # prompt-only gets an answer
    printed = capsys.readouterr()
    assert "malformed_json" in printed.out
    cut = sum(not r["finished"] for r in rows)
    assert cut == 4 and "(4 hit --max-new-tokens)" in printed.out  # 5 new tokens end no answer of this target
    assert "note: 100% of the conversations hold an answer cut at --max-new-tokens 5" in printed.err

    shards[1].unlink()
    stamp = shards[0].stat().st_mtime_ns
    monkeypatch.setattr(regenerate, "CUT_SHARE_NOTE", 1.0)  # every answer cut is not more than all of them
    assert cli.main(argv) == 0
    assert shards[0].stat().st_mtime_ns == stamp and shards[1].is_file()
    printed = capsys.readouterr()
    assert "1 written now, 1 already done" in printed.out and "note:" not in printed.err
    again = [json.loads(line) for line in shards[1].read_text().splitlines()]
    assert again == rows[3:]  # greedy: the same output on a rerun

    assert cli.main([*argv[:-2], "--shard-size", "2"]) == 2
    assert "shard_size" in capsys.readouterr().err

    # answers made 2 tokens per call, finished rows making room for queued ones, are the same answers
    chunked = tmp_path / "chunked"
    assert cli.main([*argv[:6], str(chunked), *argv[7:], "--chunk-tokens", "2"]) == 0
    assert [json.loads(line) for p in sorted(chunked.glob("shard-*.jsonl")) for line in p.read_text().splitlines()] \
        == rows


def test_cli_modules_do_not_import_torch():
    """`blockdraft --help` and `blockdraft doctor` import these modules; torch must wait for `run`."""
    import subprocess
    import sys

    code = (
        "import sys, blockdraft.data, blockdraft.commands.data, blockdraft.data.regenerate;"
        "sys.exit(int('torch' in sys.modules or 'transformers' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_data_plans_the_updates_of_a_world_size_and_accumulation(tmp_path, qwen_dir, tiny_target, capsys):
    """With the target's config.json the plan is cut by the run's cost model; without one it falls back
    to padded tokens and says so. Both report how the updates mix the buckets."""
    short = [chat("hi", "ok " * k) for k in range(1, 40)]
    long = [chat("tell me", "a long answer " * (20 + k)) for k in range(12)]
    path = write_jsonl(tmp_path / "mix.jsonl", short + long)
    config = tmp_path / "run.yaml"
    config.write_text("target: {path: unused}\ndrafter: {num_layers: 1, block_size: 4, target_layer_ids: [0, 1]}\n"
                      "train: {num_anchors: 8}\n")
    base = ["data", str(path), "--config", str(config), "--max-len", "256", "--tokens-per-batch", "512",
            "--buckets", "32,96", "--cache-dir", str(tmp_path / "c"), "--world-size", "4", "--grad-accum", "2",
            "--json"]
    assert cli.main([*base, "--target", str(tiny_target)]) == 0
    costed = json.loads(capsys.readouterr().out)
    assert (costed["world_size"], costed["grad_accum"], costed["batch_cost"]) == (4, 2, "flops")
    assert costed["batches"] == 8 * costed["updates_per_epoch"] == 4 * costed["batches_per_rank"]
    assert set(costed["update_mix"]) == {"share_multi_bucket", "mean_max_bucket_share", "max_same_bucket_run"}
    assert costed["update_mix"]["share_multi_bucket"] == 1.0  # 8 micro-batches, runs of 3 at most
    assert costed["warnings"] == []

    assert cli.main([*base, "--target", str(qwen_dir)]) == 0
    by_tokens = json.loads(capsys.readouterr().out)
    assert by_tokens["batch_cost"] == "tokens" and "no config.json" in by_tokens["warnings"][0]
    assert cli.main([*base[:-1], "--target", str(tiny_target)]) == 0
    assert "updates of 4 x 2 micro-batches" in capsys.readouterr().out


def test_data_costs_a_multimodal_target_by_its_decoder(tmp_path, qwen_dir, capsys):
    """A Gemma-3-style config keeps the decoder's sizes in text_config: the cost model reads them there."""
    from transformers import Gemma3Config

    target = tmp_path / "vlm"
    shutil.copytree(qwen_dir, target)
    Gemma3Config(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16)).save_pretrained(target)
    path = write_jsonl(tmp_path / "d.jsonl", [chat("hi", "ok " * k) for k in range(1, 20)])
    argv = ["data", str(path), "--target", str(target), "--cache-dir", str(tmp_path / "c"), "--json"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["batch_cost"] == "flops" and out["warnings"] == []
