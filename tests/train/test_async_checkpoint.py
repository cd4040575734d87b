"""Asynchronous checkpoints: training goes on while a save is written, the loop is held only to stage
the state, the `checkpoint` record comes at commit, and pruning never outruns the commit."""

import time

import torch

from blockdraft.telemetry.log import read_log
from blockdraft.train import checkpoint
from blockdraft.train.checkpoint import committed_checkpoints
from blockdraft.train.loop import Trainer
from blockdraft.train.staging import Stager

SLOW_WRITE_S = 1.5


def test_staged_state_does_not_follow_later_updates():
    w = torch.ones(3)
    staged = Stager().stage({"w": w, "nested": [w, 2]})
    w.add_(1.0)  # training updates parameters in place
    assert torch.equal(staged["w"], torch.ones(3)) and torch.equal(staged["nested"][0], torch.ones(3))
    assert staged["nested"][1] == 2


def test_reserved_buffers_are_the_ones_a_save_fills():
    state = {"model": {"w": torch.randn(4, 3)}, "optim": {"state": {0: {"exp_avg": torch.randn(4, 3)}}}}
    stager = Stager()
    stager.reserve(state)
    staged = stager.stage(state)
    reserved = dict(stager._buffers)
    assert staged["model"]["w"].data_ptr() == reserved["/model/w"].data_ptr()
    assert torch.equal(staged["optim"]["state"][0]["exp_avg"], state["optim"]["state"][0]["exp_avg"])
    state["model"]["w"].add_(1.0)
    again = stager.stage(state)  # the next save reuses them
    assert again["model"]["w"].data_ptr() == reserved["/model/w"].data_ptr()
    assert torch.equal(again["model"]["w"], state["model"]["w"])


def test_steps_keep_flowing_while_a_slow_save_is_written(tiny_config, monkeypatch):
    write = checkpoint._write_files

    def slow_write(*args, **kwargs):
        time.sleep(SLOW_WRITE_S)
        return write(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "_write_files", slow_write)
    cfg = tiny_config(train={"save_every": 2, "keep_last": 1})
    result = Trainer(cfg, show_console=False).run()
    records = read_log(result.run_dir / "log.jsonl")
    order = [(r["kind"], r["step"]) for r in records if r["kind"] in ("step", "checkpoint")]
    # the step-2 save was still being written while update 3 ran: its record comes after update 3
    assert order.index(("checkpoint", 2)) > order.index(("step", 3))
    ckpts = [r for r in records if r["kind"] == "checkpoint"]
    assert [c["step"] for c in ckpts] == [2, 4, 6] and all(c["committed"] for c in ckpts)
    assert all(c["write_s"] >= SLOW_WRITE_S and c["commit_time"] <= c["time"] for c in ckpts)
    # keep_last=1: only the newest survives, and `latest` names it
    assert [c.name for c in committed_checkpoints(result.run_dir / "checkpoints")] == ["step-000006"]
    assert (result.run_dir / "checkpoints" / "latest").resolve().name == "step-000006"
