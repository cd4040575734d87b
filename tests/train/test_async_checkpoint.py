"""Asynchronous checkpoints: a save holds the state as it was when `save` returned, whatever the
training does to it while the write goes on; training goes on while a save is written, the loop is
held only to stage the state, the `checkpoint` record comes at commit, and pruning never outruns
the commit."""

import time

import torch
from torch.distributed.checkpoint import FileSystemWriter

from blockdraft.telemetry.log import read_log
from blockdraft.train import distributed
from blockdraft.train.checkpoint import Checkpointer, committed_checkpoints, load_checkpoint, read_state
from blockdraft.train.loop import Trainer

SLOW_WRITE_S = 1.5


def _slow_dcp_writes(monkeypatch, delay_s: float) -> None:
    """Every DCP write starts `delay_s` late: the caller of `save` has long moved on by then."""
    write = FileSystemWriter.write_data

    def slow_write(self, plan, planner):
        time.sleep(delay_s)
        return write(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", slow_write)


def _adamw_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(5, 4)).square().sum().backward()
    optimizer.step()  # in place: the weights and both moments
    optimizer.zero_grad(set_to_none=True)


def test_a_save_holds_the_state_of_its_call_while_adamw_updates_it_in_place(tmp_path, monkeypatch):
    _slow_dcp_writes(monkeypatch, 0.5)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _adamw_step(model, optimizer)
    state = distributed.state_dicts(model, optimizer)
    at_save = {name: t.clone() for name, t in model.state_dict().items()}
    moments = {name: {k: v.clone() for k, v in optimizer.state[p].items()} for name, p in model.named_parameters()}

    saver = Checkpointer(tmp_path, keep_last=2)
    saver.save(1, state, {"hidden_size": 4}, {"train": {"step": 1}}, {"step": 1})
    _adamw_step(model, optimizer)  # while the write still waits to start
    with torch.no_grad():
        model.weight.fill_(7.0)
    assert not torch.equal(model.bias, at_save["bias"])
    info = saver.poll(wait=True)
    assert info["committed"], info

    saved = read_state(tmp_path / "step-000001")
    for name, tensor in at_save.items():
        assert torch.equal(saved["model"][name], tensor), name
    for name, values in moments.items():
        for key, value in values.items():
            assert torch.equal(saved["optim"]["state"][name][key], value), (name, key)
    loaded = load_checkpoint(tmp_path, with_training_state=False)
    assert loaded.parts == {"model", "optim"} and torch.equal(loaded.drafter_state["weight"], at_save["weight"])


def test_a_save_before_adamws_first_update_leaves_the_optimizer_untouched(tmp_path):
    """torch would make AdamW's state with a zero-LR step, which counts in Adam's bias correction."""
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    saver = Checkpointer(tmp_path, keep_last=2)
    saver.save(0, distributed.state_dicts(model, optimizer), {}, {}, {})
    assert saver.poll(wait=True)["committed"] and not optimizer.state
    _adamw_step(model, optimizer)
    loaded = load_checkpoint(tmp_path)
    assert loaded.parts == {"model"}
    distributed.load_weights(model, optimizer, loaded)
    assert not optimizer.state  # as fresh as when it was saved


def test_steps_keep_flowing_while_a_slow_save_is_written(tiny_config, monkeypatch):
    _slow_dcp_writes(monkeypatch, SLOW_WRITE_S)
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
