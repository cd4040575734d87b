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
    assert report["checkpoint_stall"] is None  # data-parallel saves go through dcp, not measured here
