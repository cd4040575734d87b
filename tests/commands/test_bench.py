"""`blockdraft bench` on the tiny shape: the report holds what the issue asks for, and bad input is one line."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from blockdraft.cli import main


def test_tiny_bench_reports_throughput_memory_and_the_fast_vs_plain_check(capsys):
    rc = main(["bench", "--target-shape", "tiny", "--lengths", "mix", "--steps", "2", "--warmup", "1",
               "--seq-len", "128", "--micro-batch", "2", "--device", "cpu", "--json", "train.num_anchors=16",
               "optim.grad_clip=1e-6"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    (mix,) = report["profiles"]
    assert mix["clipped_share"] == 1.0 and mix["grad_norm_median"] > 1e-6  # every update timed the clip
    assert mix["profile"] == "mix" and mix["steps"] == 2
    assert mix["tokens_per_s"] > 0 and 0 <= mix["pad_frac"] < 1 and 0 <= mix["data_wait_share"] < 1
    assert mix["tokens_per_step"] <= 2 * 128  # real tokens, within the padded budget
    assert mix["check"]["ok"] is True
    stall = report["checkpoint_stall"]
    assert stall["reserve_s"] >= 0 and stall["first_s"] >= 0 and stall["steady_s"] >= 0
    assert stall["d2h_s"] is None  # the device-to-host floor exists on a GPU only
    assert mix["graphs_compiled"] == 0  # nothing is compiled on the CPU path
    assert report["env"]["drafter"].startswith("5 layers, B=16")


@pytest.mark.parametrize("argv, message", [
    (["--target-shape", "gpt-17"], "unknown target shape"),
    (["--lengths", "short"], "--lengths takes full, mix and/or data, not 'short'"),
    (["--target-shape", "tiny", "--lengths", "data"], "--lengths data measures your training files: name them"),
    (["--target", "/nonexistent"], "no config.json there"),
    (["--target-shape", "tiny", "--profile", "/dev/null/p"], "--profile /dev/null/p: cannot make the folder"),
    (["--target-shape", "tiny", "drafter.mask_token_id=512"], "outside the target's embedding table"),
    (["--target-shape", "tiny", "data.max_len=4096"], "set the sample length with --seq-len"),
    (["--target-shape", "tiny", "data.tokens_per_batch=512"], "the micro-batch with --micro-batch"),
])
def test_bad_bench_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert main(["bench", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_bench_under_torchrun_counts_every_ranks_tokens():
    """2 ranks (gloo): each draws its own full-length batches; tokens/s counts both, and per GPU half."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "blockdraft", "bench", "--target-shape", "tiny", "--lengths", "full", "--steps", "2", "--warmup", "1",
           "--seq-len", "128", "--micro-batch", "2", "--device", "cpu", "--no-check", "--json",
           "train.num_anchors=16", "optim.grad_clip=1e9"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # rank 0 alone prints
    (full,) = report["profiles"]
    assert report["env"]["world_size"] == 2 and report["env"]["parallel"] == "ddp"
    assert full["tokens_per_step"] == 2 * 2 * 128  # 2 ranks x 2 samples x 128 tokens
    assert full["clipped_share"] == 0.0  # no update reached the cap
    assert full["tokens_per_s_per_gpu"] == pytest.approx(full["tokens_per_s"] / 2)
    stall = report["checkpoint_stall"]  # each rank stages its own state, as a save in training does
    assert stall["first_s"] >= 0 and stall["steady_s"] >= 0 and stall["d2h_s"] is None


def test_bench_under_fsdp2_checks_the_fast_path_on_the_sharded_drafter():
    """The fast-vs-plain check runs through the wrapper the bench trains (FSDP2 gathers the shards) and
    reads the sharded gradients' full norm."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "blockdraft", "bench", "--target-shape", "tiny", "--lengths", "full", "--steps", "1", "--warmup", "1",
           "--seq-len", "128", "--micro-batch", "2", "--device", "cpu", "--json", "train.num_anchors=16",
           "train.parallel=fsdp"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    (full,) = report["profiles"]
    assert report["env"]["parallel"] == "fsdp"
    assert full["check"]["ok"] and full["check"]["grad_norm_rel_diff"] < 5e-2


def test_bench_counts_supervised_blocks_and_wall_time_consistently(capsys):
    """A mix of short samples: tokens and blocks per second at the median update and over the whole
    window, blocks per 1k tokens linking them, the slow updates and the graphs compiled."""
    rc = main(["bench", "--target-shape", "tiny", "--lengths", "mix", "--steps", "8", "--warmup", "1",
               "--seq-len", "128", "--micro-batch", "2", "--mix-median", "60", "--mix-sigma", "0.6", "--device", "cpu",
               "--no-check", "--json", "train.num_anchors=16", "train.anchors_per_token=0.25"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    (mix,) = report["profiles"]
    assert report["env"]["anchors_per_token"] == 0.25
    assert report["env"]["fast_path"] is False and report["env"]["flex_backend"] is None  # dense SDPA on CPU
    assert report["env"]["mix"] == {"median": 60, "sigma": 0.6, "max": 128}
    assert mix["steps"] == 8 and mix["tokens"] > 0 and mix["blocks"] > 0
    assert mix["blocks_per_1k_tokens"] == pytest.approx(1000 * mix["blocks"] / mix["tokens"])
    assert mix["blocks_per_s"] == pytest.approx(mix["tokens_per_s"] * mix["blocks_per_1k_tokens"] / 1000)
    assert mix["tokens_per_s_wall"] == pytest.approx(mix["tokens"] / mix["wall_s"])
    assert mix["blocks_per_s_wall"] == pytest.approx(mix["blocks"] / mix["wall_s"])
    assert mix["rate_wall_over_median"] == pytest.approx(mix["tokens_per_s_wall"] / mix["tokens_per_s"])
    assert mix["wall_s"] >= mix["steps"] * mix["step_time_s"] / 2  # the median update times the count, roughly
    # 0.25 blocks per answer token, rounded up per sample (samples have 64 tokens at least)
    assert 100 < mix["blocks_per_1k_tokens"] <= 250 + 1000 / 64
    assert mix["slow_steps"] == len(mix["slow_step_list"])
    for slow in mix["slow_step_list"]:
        assert slow["time_s"] > 2 * mix["step_time_s"] and 2 <= slow["update"] <= 9
    # nothing compiles on the CPU's plain path (the process-wide total also counts earlier tests' graphs)
    assert mix["graphs_compiled"] == 0 and mix["last_compile_update"] is None
    assert mix["time_wall_over_median"] == pytest.approx(mix["wall_s"] / (mix["steps"] * mix["step_time_s"]))


def test_summary_names_the_slow_updates_and_the_last_compile():
    from blockdraft.bench.measure import summarize_rows

    rows = [{"update": k, "step_time": 1.0, "wait": 0.0, "tokens": 1000, "padded": 1100, "blocks": 400,
             "blocks_run": 440, "blocks_sampled": 400, "graphs": 7, "flops_target": 1e12, "flops_drafter": 1e12,
             "loss": 1.0} for k in range(11, 21)]
    rows[3]["step_time"] = 30.0  # a recompile inside the window
    for r in rows[3:]:
        r["graphs"] = 9
    out = summarize_rows(rows, 0.5, None, 1, graphs_before=7)
    assert out["slow_steps"] == 1 and out["slow_step_list"] == [
        {"update": 14, "time_s": 30.0, "over_median": 30.0, "graphs_compiled": 2}]
    assert out["graphs_compiled"] == 2 and out["graphs_compiled_total"] == 9 and out["last_compile_update"] == 14
    assert out["tokens_per_s"] == 1000 and out["tokens_per_s_wall"] == pytest.approx(10_000 / 39)
    assert out["blocks_per_s"] == 400 and out["blocks_per_1k_tokens"] == 400
    assert out["filler_block_frac"] == pytest.approx(40 / 440)  # padding to the block classes
    assert out["loss_finite"] is True


def test_the_window_mfu_counts_every_update_s_flops_over_the_window_s_time():
    """Updates of unequal size: the median update's MFU is one update's, the window's weighs each by its
    FLOPs, which is what compares two trainers whose updates differ."""
    from blockdraft.bench.measure import summarize_rows

    rows = [{"update": k, "step_time": t, "wait": 0.0, "tokens": n, "padded": n, "blocks": n // 4, "graphs": 0,
             "blocks_run": n // 4, "blocks_sampled": n // 4,
             "flops_target": f, "flops_drafter": f, "loss": 1.0}
            for k, (t, n, f) in enumerate([(1.0, 1000, 50e12), (2.0, 3000, 150e12), (1.0, 1000, 50e12)])]
    out = summarize_rows(rows, 0.5, peak=1000.0)
    assert out["tflops"] == pytest.approx(100.0)  # the median update: 100 TFLOP in 1 s
    assert out["tflops_wall"] == pytest.approx(500 / 4)  # 500 TFLOP in 4 s
    assert (out["mfu"], out["mfu_wall"]) == (pytest.approx(0.1), pytest.approx(0.125))
    assert summarize_rows(rows, 0.5, None)["mfu_wall"] is None


def test_a_non_finite_loss_fails_the_bench_whatever_its_rates(monkeypatch, capsys):
    """A kernel option that breaks the update can make it faster: its rates must not pass for a result."""
    from blockdraft.bench.measure import summarize_rows
    from blockdraft.commands import bench

    rows = [{"update": k, "step_time": 1.0, "wait": 0.0, "tokens": 1000, "padded": 1000, "blocks": 400, "graphs": 0,
             "blocks_run": 400, "blocks_sampled": 400, "flops_target": 1e12, "flops_drafter": 1e12,
             "loss": float("nan") if k == 3 else 1.0} for k in range(6)]
    profile = {**summarize_rows(rows, 0.5, None), "profile": "full"}
    assert profile["loss_finite"] is False
    report = {"profiles": [profile], "checkpoint_stall": {}}
    monkeypatch.setattr(bench, "measure", lambda args: report)
    assert main(["bench", "--device", "cpu", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["profiles"][0]["loss_finite"] is False
    assert "loss was not finite in full" in captured.err


def test_bench_on_a_multimodal_target_folder_times_its_text_decoder(tmp_path, capsys):
    """A Gemma-3 folder with a vision tower: the taps and costs are its text decoder's, as in training."""
    from transformers import Gemma3Config, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=32)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict()).save_pretrained(tmp_path)
    rc = main(["bench", "--target", str(tmp_path), "--lengths", "mix", "--steps", "2", "--warmup", "1",
               "--seq-len", "128", "--micro-batch", "2", "--device", "cpu", "--json",
               "train.num_anchors=16", "drafter.num_layers=1"])
    assert rc == 0
    (mix,) = json.loads(capsys.readouterr().out)["profiles"]
    assert mix["check"]["ok"] is True and mix["loss_finite"] is True
    assert mix["tokens_per_s"] > 0


def test_bench_on_your_data_measures_its_samples_lengths_and_answers(tiny_chat_target, tiny_chats, tmp_path, capsys):
    """--data alone measures the data profile on the file's real samples: the bad line is skipped and
    counted as training counts it. One bucket and a budget that holds every sample make each update one
    micro-batch of the whole file, so an update's real tokens are the file's, and the 3 updates of the
    window (1 warm-up, 2 measured) take 3 epochs of it."""
    from blockdraft.data.cache import TokenizedDataset
    from tests.conftest import CHATS

    rc = main(["bench", "--target", str(tiny_chat_target), "--data", str(tiny_chats), "--steps", "2", "--warmup", "1",
               "--seq-len", "128", "--micro-batch", "4", "--device", "cpu", "--json", "train.num_anchors=16",
               "data.buckets=[]", f"data.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    (data,) = report["profiles"]
    env = report["env"]["data"]
    assert env["files"] == [str(tiny_chats)] and env["cache_path"].startswith(str(tmp_path / "cache"))
    assert (env["samples_used"], env["samples_skipped"], env["skipped"]) == (len(CHATS), 1, {"malformed_json": 1})
    lengths = TokenizedDataset(Path(env["cache_path"])).lengths  # what training reads of the same file
    assert env["lengths"]["p50"] == int(np.percentile(lengths, 50)) and env["lengths"]["max"] == lengths.max()
    assert env["lengths"]["p90"] == int(np.percentile(lengths, 90)) and env["tokens"] == lengths.sum()
    assert (data["profile"], data["steps"], data["dataset_samples"], data["epochs"]) == ("data", 2, len(CHATS), 3)
    assert data["tokens_per_step"] == lengths.sum() and data["tokens"] == 2 * lengths.sum()
    assert data["pad_frac"] == pytest.approx(1 - lengths.sum() / (len(lengths) * lengths.max()))
    assert data["blocks"] > 0 and data["loss_finite"] is True
    assert data["check"]["ok"] is True


def test_bench_measures_your_data_beside_the_synthetic_profiles_and_prints_what_it_read(tiny_chat_target, tiny_chats,
                                                                                         tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # the whole table on one line a row
    rc = main(["bench", "--target", str(tiny_chat_target), "--lengths", "mix,data", "--data", str(tiny_chats),
               "--steps", "2", "--warmup", "1", "--seq-len", "128", "--micro-batch", "2", "--device", "cpu",
               "--no-check", "train.num_anchors=16", f"data.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    out = capsys.readouterr().out
    assert f"data: 4 samples of {tiny_chats} (1 skipped: 1 malformed_json; 0 truncated" in out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert rows == ["mix", "data"]


@pytest.mark.parametrize("argv, message", [
    (["--target-shape", "tiny", "--data", "CHATS"], "--data is tokenised with the target's tokenizer: give --target"),
    (["--target", "TARGET", "--data", "/nope.jsonl"], "data file not found: /nope.jsonl"),
    (["--target", "TARGET", "--lengths", "full", "--data", "CHATS"], "--data is measured as the data profile"),
    (["--target", "TARGET", "--data", "CHATS", "train.num_anchors=16"], "--data took 'train.num_anchors=16' for"),
    (["--target", "SMALL", "--data", "CHATS"], "(the tokenizer of SMALL), outside the target's embedding table (300"),
])
def test_bad_data_arguments_are_one_line_and_exit_2(argv, message, tiny_chat_target, tiny_chats, tmp_path,
                                                    monkeypatch, capsys):
    small = tmp_path / "small"  # the tokenizer's ids run past this config's table
    shutil.copytree(tiny_chat_target, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 300}))
    names = {"TARGET": str(tiny_chat_target), "CHATS": str(tiny_chats), "SMALL": str(small)}
    monkeypatch.setenv("BLOCKDRAFT_CACHE", str(tmp_path / "cache"))
    assert main(["bench", "--device", "cpu", *(names.get(a, a) for a in argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert message.replace("SMALL", str(small)) in err and "\n" not in err
