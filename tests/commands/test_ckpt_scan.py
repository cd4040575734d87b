"""`blockdraft ckpt-scan`: per-tensor statistics of drafter and optimizer state, exit 1 on NaN/Inf or
on a damaged file, no config needed."""

import json
from pathlib import Path

import pytest
import torch

from blockdraft.cli import main
from blockdraft.train import distributed
from blockdraft.train.checkpoint import Checkpointer


def _checkpoint(root, poison: bool):
    """A checkpoint as the trainer writes it, of {layers.0.weight (trained, one AdamW step), norm.weight}."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].weight = torch.nn.Parameter(torch.randn(4, 3))
    model.norm = torch.nn.Module()
    model.norm.weight = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    opt = torch.optim.AdamW([model.layers[0].weight], lr=1e-3, weight_decay=0.0)
    model.layers[0].weight.sum().backward()
    opt.step()
    if poison:
        with torch.no_grad():
            model.layers[0].weight[1, 2] = float("nan")
            model.norm.weight[0] = float("inf")
    saver = Checkpointer(root, keep_last=3)
    saver.save(7, distributed.state_dicts(model, opt), {"hidden_size": 3}, {"step": 7}, {"step": 7})
    info = saver.poll(wait=True)
    assert info["committed"], info
    return Path(info["path"])


def _scan(capsys, path) -> tuple[int, dict]:
    code = main(["ckpt-scan", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_clean_checkpoint_scans_finite(tmp_path, capsys):
    path = _checkpoint(tmp_path / "checkpoints", poison=False)
    code, report = _scan(capsys, tmp_path)  # a run folder resolves to its newest complete checkpoint
    assert code == 0 and report["path"] == str(path.resolve())
    rows = {r["name"]: r for r in report["tensors"]}
    assert set(rows) == {"layers.0.weight", "norm.weight", "optimizer.layers.0.weight.step",
                         "optimizer.layers.0.weight.exp_avg", "optimizer.layers.0.weight.exp_avg_sq"}
    w = rows["layers.0.weight"]
    assert w["shape"] == [4, 3] and w["dtype"] == "float32" and w["nan"] == w["inf"] == 0
    torch.manual_seed(0)
    expected = torch.randn(4, 3) - 1e-3  # one AdamW step of lr 1e-3 on a gradient of ones
    assert w["min"] == pytest.approx(float(expected.min()), abs=1e-5)
    assert w["mean"] == pytest.approx(float(expected.mean()), abs=1e-5)
    assert rows["optimizer.layers.0.weight.step"]["max"] == 1.0
    assert report["nonfinite_tensors"] == [] and report["damaged"] is None


def test_nan_and_inf_are_counted_and_fail_the_scan(tmp_path, capsys):
    path = _checkpoint(tmp_path, poison=True)
    code, report = _scan(capsys, path)
    assert code == 1
    rows = {r["name"]: r for r in report["tensors"]}
    assert (rows["layers.0.weight"]["nan"], rows["layers.0.weight"]["inf"]) == (1, 0)
    assert (rows["norm.weight"]["nan"], rows["norm.weight"]["inf"]) == (0, 1)
    assert rows["norm.weight"]["max"] == 1.0  # statistics over the finite values
    assert report["nonfinite_tensors"] == ["layers.0.weight", "norm.weight"]
    assert main(["ckpt-scan", str(path)]) == 1
    assert "2 of 5 tensors hold NaN or Inf" in capsys.readouterr().out


def test_a_damaged_file_fails_the_scan(tmp_path, capsys):
    path = _checkpoint(tmp_path, poison=False)
    shard = path / "__0_0.distcp"
    raw = bytearray(shard.read_bytes())
    at = raw.find(torch.ones(3).numpy().tobytes())  # norm.weight's values, stored as they are
    assert at >= 0
    raw[at + 1] ^= 0xFF  # one flipped byte inside the tensor data: still loads, no longer matches the manifest
    shard.write_bytes(bytes(raw))
    code, report = _scan(capsys, path)
    assert code == 1 and "__0_0.distcp does not match its checksum" in report["damaged"]
    assert {r["name"]: r for r in report["tensors"]}["norm.weight"]["max"] > 1.0  # the scan read the damage


def test_no_checkpoint_is_a_user_error(tmp_path, capsys):
    assert main(["ckpt-scan", str(tmp_path)]) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_an_unreadable_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    path = _checkpoint(tmp_path, poison=False)
    (path / ".metadata").write_bytes(b"not a pickle")
    assert main(["ckpt-scan", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {path} is unreadable" in err and err.count("\n") == 1
