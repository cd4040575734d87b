"""bench/overlap_step.py: its two pieces are the target's taps and the trainer's AdamW step, and without
a GPU it stops with one line."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("overlap_step", Path(__file__).parents[2] / "bench" / "overlap_step.py")
overlap_step = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overlap_step)


def test_the_pieces_are_the_targets_taps_and_the_drafters_adamw_step():
    torch.manual_seed(0)
    forward, step = overlap_step.pieces("tiny", seq_len=48, micro_batch=2, device=torch.device("cpu"))
    taps = forward()
    assert taps.shape == (2, 48, 5 * 64)  # 5 tapped layers of the tiny shape's hidden size 64
    optimizer = step.__self__
    assert isinstance(optimizer, torch.optim.AdamW)
    params = optimizer.param_groups[0]["params"]
    before = [p.detach().clone() for p in params]
    step()
    assert all(not torch.equal(b, p) for b, p in zip(before, params, strict=True))  # every weight moved
    torch.testing.assert_close(forward(), taps)  # the target is frozen: the step does not touch it


def test_without_a_gpu_it_stops_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert overlap_step.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CUDA GPU" in err
