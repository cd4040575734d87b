"""Signals and kill -9 on a real training process: a second SIGTERM leaves at once without touching
the committed checkpoints; a run killed with SIGKILL at a random step and resumed ends with exactly
the weights, AdamW state and losses of an uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from blockdraft.telemetry.log import read_log
from blockdraft.train.checkpoint import committed_checkpoints, read_state
from blockdraft.train.loop import Trainer


def _start(config_file: Path, prelude: str = "") -> subprocess.Popen:
    """`blockdraft train` in a child process (through the CLI, as a user runs it)."""
    code = textwrap.dedent(prelude) + textwrap.dedent(f"""
        import sys
        from blockdraft.cli import main
        sys.exit(main(["train", {str(config_file)!r}, "--no-console"]))
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, f"the child ended before {what}: {proc.stderr.read()[-2000:]}"
        assert time.time() < deadline, f"the child never reached {what}"
        time.sleep(0.05)


def _steps(log: Path) -> list[dict]:
    return [r for r in read_log(log) if r["kind"] == "step"] if log.is_file() else []


def test_a_second_sigterm_exits_at_once_and_leaves_the_committed_checkpoint(tiny_config, tmp_path):
    cfg = tiny_config(train={"max_steps": 100_000, "save_every": 3})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(cfg.model_dump_json())  # JSON is YAML
    writing = tmp_path / "writing"
    # every save after step 3 hangs half-written: the first SIGTERM's final save never finishes
    proc = _start(config_file, f"""
        import pathlib, time
        from torch.distributed.checkpoint import FileSystemWriter
        write = FileSystemWriter.write_data

        def hanging_write(self, plan, planner):
            if self.path.name == ".tmp-step-000003":
                return write(self, plan, planner)
            (self.path / "__0_0.distcp").write_bytes(b"partial")
            pathlib.Path({str(writing)!r}).touch()
            time.sleep(600)

        FileSystemWriter.write_data = hanging_write
    """)
    try:
        _wait_for(proc, writing.exists, "a hanging save")
        proc.send_signal(signal.SIGTERM)  # first: finish the step, then wait for the save ... forever
        time.sleep(1.0)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)  # second: leave now
        sent = time.time()
        _, stderr = proc.communicate(timeout=30)
        took = time.time() - sent
    finally:
        proc.kill()
    assert took < 5, f"the second SIGTERM took {took:.1f}s"
    assert proc.returncode == 130 and "interrupted" in stderr
    run = Path(cfg.train.out_dir)
    end = read_log(run / "log.jsonl")[-1]
    assert end["kind"] == "run_end" and end["status"] == "interrupted" and "second SIGTERM" in end["reason"]
    root = run / "checkpoints"
    assert [c.name for c in committed_checkpoints(root)] == ["step-000003"]
    assert (root / "latest").resolve().name == "step-000003"
    resumed = Trainer(cfg, resume=True, show_console=False)
    resumed.prefetcher.close()
    assert resumed.step == 3


def test_sigkill_at_a_random_step_then_resume_ends_with_the_uninterrupted_weights(tiny_config, tmp_path):
    steps = 10
    full_cfg = tiny_config(train={"max_steps": steps, "save_every": 2, "out_dir": str(tmp_path / "full")})
    full = Trainer(full_cfg, show_console=False).run()
    cfg = tiny_config(train={"max_steps": steps, "save_every": 2, "out_dir": str(tmp_path / "killed")})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(cfg.model_dump_json())
    log = Path(cfg.train.out_dir) / "log.jsonl"
    kill_after = random.randint(1, steps - 2)  # the SIGKILL lands in the update (or save) after this one
    # updates paced at 0.2 s, so the poll (every 0.05 s) sees step k before step k + 2 is written
    proc = _start(config_file, prelude="""
        import time
        from blockdraft.train.loop import Trainer
        _step_once = Trainer.step_once
        Trainer.step_once = lambda self: (time.sleep(0.2), _step_once(self))[1]
    """)
    try:
        _wait_for(proc, lambda: len(_steps(log)) >= kill_after, f"step {kill_after}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    reached = len(_steps(log))
    assert reached < steps, f"the run finished before the kill (after step {kill_after})"

    resumed = Trainer(cfg, resume=True, show_console=False)
    start = resumed.step
    assert resumed.run().status == "completed"
    msg = f"killed after step {kill_after}, resumed from step {start}"
    expected = {r["step"]: r["loss"] for r in _steps(full.run_dir / "log.jsonl")}
    records = _steps(log)
    assert [r["step"] for r in records] == [*range(1, reached + 1), *range(start + 1, steps + 1)], msg
    assert [r["loss"] for r in records] == [expected[r["step"]] for r in records], msg  # bit-identical
    final = read_state(full.run_dir / "checkpoints" / f"step-{steps:06d}")
    again = read_state(log.parent / "checkpoints" / f"step-{steps:06d}")
    assert final["model"].keys() == again["model"].keys()
    assert all(torch.equal(final["model"][k], again["model"][k]) for k in final["model"]), msg
    adam, adam_again = final["optim"]["state"], again["optim"]["state"]
    moments = [(name, key) for name, held in adam.items() for key in held]
    assert moments and all(torch.equal(adam[n][k], adam_again[n][k]) for n, k in moments), msg
