"""Data parallelism on CPU with gloo, 2 processes launched by torchrun: 2 ranks x 1 micro-batch train
exactly like 1 rank x 2 accumulated micro-batches (DDP and FSDP2), on fixed batches and in real CLI
runs with the real sampler, resumed at the other world size too; sharded checkpoints resume at
another world size both ways and export to one serving folder; a rank killed with SIGKILL ends the
job within seconds, with torchrun naming it, and the run resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from blockdraft.commands.ckpt_scan import scan
from blockdraft.config import Config, DataConfig, dump_config
from blockdraft.data.batching import BatchSampler
from blockdraft.errors import UserError
from blockdraft.model.export import load_drafter
from blockdraft.telemetry.log import read_log
from blockdraft.train import loop
from blockdraft.train.checkpoint import committed_checkpoints, load_checkpoint, read_state
from blockdraft.train.loop import Trainer
from tests.conftest import make_config
from tests.train.dist_worker import train_fixed

WORKER = Path(__file__).with_name("dist_worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # 2 ranks on a 2-core CI machine


def torchrun(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            *map(str, args)]


def launch(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess:
    done = subprocess.run(torchrun(*args), capture_output=True, text=True, timeout=timeout, env=ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def start(*args: str | Path) -> subprocess.Popen:
    return subprocess.Popen(torchrun(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)


def wait_for_steps(job: subprocess.Popen, log: Path, ready) -> None:
    """Until `ready(records)` holds for the job's log."""
    deadline = time.time() + 180
    while not (log.is_file() and ready(read_log(log))):
        assert job.poll() is None, job.stderr.read()[-4000:]
        assert time.time() < deadline, "the job never got there"
        time.sleep(0.1)


def launch_two_ranks(target: Path, corpus: Path, root: Path, *modes: str) -> tuple[Config, Path]:
    """One launch of dist_worker.py for `modes`, 1 and 2 micro-batches per rank, every update clipped
    (FSDP2 scales sharded gradients by the norm of all of them)."""
    # every candidate anchor is taken (num_anchors > T), so both layouts see the very same blocks
    cfg = make_config(target, corpus, root, train={"num_anchors": 1000, "save_every": 100}, optim={"grad_clip": 1e-3})
    (root / "config.json").write_text(cfg.model_dump_json())
    launch(WORKER, root / "config.json", root / "out", *modes)
    return cfg, root / "out"


def assert_two_ranks_equal_one(cfg: Config, out: Path, modes: tuple[str, ...], per_rank: int) -> list[float]:
    """2 ranks x `per_rank` micro-batches (the launch's) == 1 rank x 2*`per_rank` (this process): the same
    losses and weights. Returns this process's losses."""
    losses, weights = train_fixed(cfg, 2 * per_rank)  # this process alone: 1 rank, all accumulated
    two = json.loads(Path(f"{out}.json").read_text())
    for mode in modes:
        assert two[f"{mode}-{per_rank}"] == pytest.approx(losses, rel=1e-6), mode
        gathered = torch.load(f"{out}-{mode}-{per_rank}.pt")
        assert gathered.keys() == weights.keys()
        for name, tensor in weights.items():
            torch.testing.assert_close(gathered[name], tensor, rtol=1e-5, atol=1e-7, msg=f"{mode} {name}")
    return losses


@pytest.fixture(scope="module")
def two_ranks(tiny_target, tiny_corpus, tmp_path_factory) -> tuple[Config, Path]:
    return launch_two_ranks(tiny_target, tiny_corpus, tmp_path_factory.mktemp("two-ranks"), "ddp", "fsdp")


@pytest.mark.parametrize("per_rank", [1, 2])
def test_two_ranks_train_exactly_like_one_rank_accumulating_their_micro_batches(two_ranks, per_rank):
    """2 ranks x `per_rank` micro-batches == 1 rank x 2*`per_rank`, under DDP and FSDP2 (with 2 per
    rank, the gradient sync is deferred to the last micro-batch)."""
    losses = assert_two_ranks_equal_one(*two_ranks, ("ddp", "fsdp"), per_rank)
    assert losses[0] != losses[-1]  # the weights did move


@pytest.fixture(scope="module")
def two_ranks_fp8(tiny_target, tiny_corpus, tmp_path_factory) -> tuple[Config, Path]:
    """As `two_ranks`, with `train.fp8_linears` (torchao's FP8 layers, which run on the CPU too)."""
    pytest.importorskip("torchao.float8")
    cfg, out = launch_two_ranks(tiny_target, tiny_corpus, tmp_path_factory.mktemp("two-ranks-fp8"),
                                "ddp+fp8", "fsdp+fp8")
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"fp8_linears": True})}), out


@pytest.mark.parametrize("per_rank", [1, 2])
def test_fp8_linears_train_under_ddp_and_fsdp2_like_one_rank(two_ranks_fp8, per_rank, monkeypatch):
    """FP8 scales are per micro-batch, so 2 ranks x `per_rank` still equals 1 rank x 2*`per_rank`, under DDP
    and FSDP2 (whose weights are gathered before each layer casts them)."""
    cfg, out = two_ranks_fp8
    monkeypatch.setattr(loop, "require_fp8", lambda device: None)  # the CPU runs torchao's FP8 layers
    losses = assert_two_ranks_equal_one(cfg, out, ("ddp+fp8", "fsdp+fp8"), per_rank)
    plain, _ = train_fixed(cfg.model_copy(update={"train": cfg.train.model_copy(update={"fp8_linears": False})}),
                           2 * per_rank)
    # the ranks' match (1e-6) would fail had they multiplied in fp32: FP8 moves a loss 100x that here
    assert 2e-5 < max(abs(a - b) / abs(b) for a, b in zip(losses, plain, strict=True)) < 0.05


def _steps(log: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_log(log) if r["kind"] == "step"}


def test_a_real_run_of_2_ranks_x_1_equals_1_rank_x_2_and_resumes_at_the_other_world_size(tiny_config, tmp_path):
    """`torchrun -m blockdraft train` with 2 ranks x 1 micro-batch logs the losses, buckets and tokens of
    a 1-process run with grad_accum 2 (the same updates, the same anchors) and saves the same weights;
    resumed on 1 process x 2, it continues that very update sequence."""
    # a constant LR: the first run's max_steps (4) must not shape the schedule the resumed run continues
    cfg = tiny_config(optim={"schedule": "constant"}, train={"max_steps": 4, "save_every": 2})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(dump_config(cfg))
    launch("-m", "blockdraft", "train", config_file, "train.grad_accum=1", "--no-console")
    two = Path(cfg.train.out_dir)
    more = cfg.train.model_copy(update={"max_steps": 6})
    one_cfg = cfg.model_copy(update={"train": more.model_copy(update={"grad_accum": 2,
                                                                       "out_dir": str(tmp_path / "one")})})
    assert Trainer(one_cfg, show_console=False).run().status == "completed"
    resumed = cfg.model_copy(update={"train": more.model_copy(update={"grad_accum": 2})})
    assert Trainer(resumed, resume=True, show_console=False).run().status == "completed"  # 1 x 2, steps 5-6

    a, b = _steps(two / "log.jsonl"), _steps(tmp_path / "one" / "log.jsonl")
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for k in range(1, 7):
        assert a[k]["loss"] == pytest.approx(b[k]["loss"], abs=1e-4), k
        assert (a[k]["buckets"], a[k]["tokens"], a[k]["samples"]) == (b[k]["buckets"], b[k]["tokens"], b[k]["samples"])
        assert len(a[k]["buckets"]) == 2
    assert len({a[k]["loss"] for k in a}) == 6
    for k in (4, 6):
        got = load_checkpoint(two / "checkpoints" / f"step-{k:06d}", with_training_state=False).drafter_state
        want = load_checkpoint(tmp_path / "one" / "checkpoints" / f"step-{k:06d}", with_training_state=False)
        for name, tensor in want.drafter_state.items():
            torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-6, msg=f"step {k} {name}")


def test_a_data_position_moves_to_another_update_size_at_the_same_fraction_of_its_epoch():
    lengths, cfg = np.arange(8, 400), DataConfig(tokens_per_batch=1000)
    two, one = (BatchSampler(lengths, cfg, seed=3, rank=0, world_size=w) for w in (2, 1))
    two.load_state_dict({"epoch": 1, "index": 10, "fingerprint": two.fingerprint})
    state = two.state_dict()
    assert two.carry_over(state, 2) == state
    moved = one.carry_over(state, 2)
    assert moved["epoch"] == 1 and moved["index"] == round(10 * one.batches_per_epoch / two.batches_per_epoch)
    one.load_state_dict(moved)
    other = BatchSampler(lengths[1:], cfg, seed=3)
    with pytest.raises(UserError, match="changed"):
        other.carry_over(state, 2)


def _assert_same_state(trainer: Trainer, saved: dict) -> None:
    """The trainer's drafter and AdamW state equal a sharded checkpoint's, tensor for tensor."""
    for name, tensor in trainer.drafter.state_dict().items():
        assert torch.equal(tensor, saved["model"][name]), name
    for name, param in trainer.drafter.named_parameters():
        for key, value in trainer.optimizer.state[param].items():
            assert torch.equal(value, saved["optim"]["state"][name][key]), (name, key)


def test_sharded_checkpoints_resume_at_another_world_size_both_ways(tiny_config, tiny_corpus, tmp_path):
    cfg = tiny_config(optim={"schedule": "constant"}, train={"save_every": 100, "max_steps": 3})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(dump_config(cfg))
    run = Path(cfg.train.out_dir)

    evaluation = [f"eval.prompts=[{tiny_corpus}]", "eval.max_prompts=2", "eval.prompt_tokens=16", "train.eval_every=3"]
    launch("-m", "blockdraft", "train", config_file, "train.parallel=fsdp", *evaluation, "--no-console")  # 2 ranks
    ckpt = run / "checkpoints" / "step-000003"
    assert sorted(p.name for p in ckpt.iterdir()) == [".metadata", "COMMITTED", "__0_0.distcp", "__1_0.distcp",
                                                      "drafter_config.json", "trainer.json", "trainer.pt"]
    shards = [(ckpt / f"__{r}_0.distcp").stat().st_size for r in (0, 1)]
    assert min(shards) > 0.4 * max(shards)  # FSDP2: each rank wrote its half of every tensor
    report = scan(ckpt)  # ckpt-scan reads the shards without the run's config or a process group
    names = {r["name"] for r in report["tensors"]}
    assert "fc.weight" in names and any(n.startswith("optimizer.") and n.endswith("exp_avg_sq") for n in names)
    assert report["nonfinite_tensors"] == [] and report["damaged"] is None
    one = Trainer(cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_steps": 6})}), resume=True,
                  show_console=False)  # 1 rank: updates 4-6
    assert one.step == 3
    _assert_same_state(one, read_state(ckpt))
    assert one.run().status == "completed"

    launch("-m", "blockdraft", "train", config_file, "train.max_steps=8", "--resume", "--no-console")  # 2, DDP
    records = read_log(run / "log.jsonl")
    assert [r["step"] for r in records if r["kind"] == "step"] == list(range(1, 9))  # rank 0 alone logs
    starts = [r for r in records if r["kind"] == "run_start"]
    assert [(s["world_size"], s["resumed_from"]) for s in starts] == [(2, None), (1, 3), (2, 6)]
    changed = [r for r in records if r["kind"] == "warning" and r["code"] == "world_size_changed"]
    assert [r["step"] for r in changed] == [3, 6]
    (evaluated,) = [r for r in records if r["kind"] == "eval"]  # under FSDP2, from the gathered drafter
    assert evaluated["step"] == 3 and evaluated["prompts"] == 2 and evaluated["lossless"] is True
    plans = [BatchSampler(one.dataset.lengths, cfg.data, seed=cfg.train.seed, rank=r, world_size=2,
                          costs=one.sampler.costs).plan(0) for r in (0, 1)]
    tokens = {r["step"]: r["tokens"] for r in records if r["kind"] == "step"}
    assert [tokens[k] for k in (1, 2, 3)] == [sum(p[k].real_tokens for p in plans) for k in range(3)]  # all ranks
    step_lrs = {r["step"]: r["lr"] for r in records if r["kind"] == "step"}
    assert step_lrs[4] == step_lrs[8] == pytest.approx(cfg.optim.lr)  # the schedule continued

    newest = committed_checkpoints(run / "checkpoints")[-1]
    assert newest.name == "step-000008" and (newest / ".metadata").is_file()
    subprocess.run([sys.executable, "-m", "blockdraft", "export", str(run), "--out", str(tmp_path / "export"),
                    "--dtype", "float32"], check=True, capture_output=True)
    exported = load_drafter(tmp_path / "export").state_dict()
    for name, tensor in read_state(newest, {"model"})["model"].items():
        assert torch.equal(exported[name], tensor), name


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the torchrun worker of `rank` (a child of the launcher)."""
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == launcher and f"RANK={rank}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def start_training(cfg: Config, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`blockdraft train` of `cfg` under torchrun (2 ranks), started; returns (job, its log)."""
    config_file = tmp_path / "config.yaml"
    config_file.write_text(dump_config(cfg))
    return start("-m", "blockdraft", "train", config_file, "--no-console"), Path(cfg.train.out_dir) / "log.jsonl"


def test_a_killed_rank_ends_the_job_within_seconds_and_the_run_resumes(tiny_config, tmp_path):
    cfg = tiny_config(train={"max_steps": 100_000, "save_every": 3})
    job, log = start_training(cfg, tmp_path)
    try:
        wait_for_steps(job, log, lambda records: any(r["kind"] == "checkpoint" for r in records))
        os.kill(_rank_pid(job.pid, 1), signal.SIGKILL)
        killed = time.time()
        _, stderr = job.communicate(timeout=60)
        ended_after = time.time() - killed
    finally:
        job.kill()
    assert job.returncode != 0 and ended_after < 30
    assert "Signal 9 (SIGKILL) received" in stderr and "rank      : 1" in stderr
    end = read_log(log)[-1]
    assert end["kind"] == "run_end" and end["status"] == "failed"

    committed = int(committed_checkpoints(log.parent / "checkpoints")[-1].name.split("-")[1])
    more = cfg.train.model_copy(update={"max_steps": committed + 2})
    resumed = Trainer(cfg.model_copy(update={"train": more}), resume=True, show_console=False)
    assert resumed.step == committed
    assert resumed.run().status == "completed" and resumed.step == committed + 2


def test_sigterm_to_torchrun_stops_every_rank_after_the_same_update_and_saves(tiny_config, tmp_path):
    cfg = tiny_config(train={"max_steps": 100_000, "save_every": 1000})
    job, log = start_training(cfg, tmp_path)
    try:
        wait_for_steps(job, log, lambda records: sum(r["kind"] == "step" for r in records) >= 3)
        job.send_signal(signal.SIGTERM)  # as a scheduler stops a job: torchrun passes it to every rank
        job.communicate(timeout=60)
    finally:
        job.kill()
    records = read_log(log)
    steps = [r["step"] for r in records if r["kind"] == "step"]
    assert steps == list(range(1, len(steps) + 1))
    end = records[-1]
    assert end["kind"] == "run_end" and end["status"] == "interrupted" and end["reason"] == "SIGTERM"
    (saved,) = committed_checkpoints(log.parent / "checkpoints")
    assert saved.name == f"step-{steps[-1]:06d}" and end["step"] == steps[-1]
