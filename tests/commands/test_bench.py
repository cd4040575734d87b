"""`blockdraft bench` on the tiny shape: the report holds what the issue asks for, and bad input is one line."""

import json
import os
import subprocess
import sys

import pytest

from blockdraft.cli import main


def test_tiny_bench_reports_throughput_memory_and_the_fast_vs_plain_check(capsys):
    rc = main(["bench", "--target-shape", "tiny", "--lengths", "mix", "--steps", "2", "--warmup", "1",
               "--seq-len", "128", "--micro-batch", "2", "--device", "cpu", "--json", "train.num_anchors=16"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    (mix,) = report["profiles"]
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
    (["--lengths", "short"], "--lengths takes full and/or mix"),
    (["--target", "/nonexistent"], "no config.json there"),
    (["--target-shape", "tiny", "--profile", "/dev/null/p"], "--profile /dev/null/p: cannot make the folder"),
    (["--target-shape", "tiny", "drafter.mask_token_id=512"], "outside the target's embedding table"),
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
           "train.num_anchors=16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)  # rank 0 alone prints
    (full,) = report["profiles"]
    assert report["env"]["world_size"] == 2 and report["env"]["parallel"] == "ddp"
    assert full["tokens_per_step"] == 2 * 2 * 128  # 2 ranks x 2 samples x 128 tokens
    assert full["tokens_per_s_per_gpu"] == pytest.approx(full["tokens_per_s"] / 2)
    stall = report["checkpoint_stall"]  # each rank stages its own state, as a save in training does
    assert stall["first_s"] >= 0 and stall["steady_s"] >= 0 and stall["d2h_s"] is None


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
    assert report["env"]["mix"] == {"median": 60, "sigma": 0.6, "max": 128}
    assert mix["steps"] == 8 and mix["tokens"] > 0 and mix["blocks"] > 0
    assert mix["blocks_per_1k_tokens"] == pytest.approx(1000 * mix["blocks"] / mix["tokens"])
    assert mix["blocks_per_s"] == pytest.approx(mix["tokens_per_s"] * mix["blocks_per_1k_tokens"] / 1000)
    assert mix["tokens_per_s_wall"] == pytest.approx(mix["tokens"] / mix["wall_s"])
    assert mix["blocks_per_s_wall"] == pytest.approx(mix["blocks"] / mix["wall_s"])
    assert mix["wall_over_median"] == pytest.approx(mix["tokens_per_s_wall"] / mix["tokens_per_s"])
    assert mix["wall_s"] >= mix["steps"] * mix["step_time_s"] / 2  # the median update times the count, roughly
    # 0.25 blocks per answer token, rounded up per sample (samples have 64 tokens at least)
    assert 100 < mix["blocks_per_1k_tokens"] <= 250 + 1000 / 64
    assert mix["slow_steps"] == len(mix["slow_step_list"])
    for slow in mix["slow_step_list"]:
        assert slow["time_s"] > 2 * mix["step_time_s"] and 2 <= slow["update"] <= 9
    # nothing compiles on the CPU's plain path (the process-wide total also counts earlier tests' graphs)
    assert mix["graphs_compiled"] == 0 and mix["last_compile_update"] is None
    assert mix["wall_over_median_time"] == pytest.approx(mix["wall_s"] / (mix["steps"] * mix["step_time_s"]))


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
