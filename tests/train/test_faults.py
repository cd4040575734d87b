"""Fault injection: a damaged checkpoint, kill -9 in the middle of a checkpoint write, a failing
write (full disk), a checkpoint of an older blockdraft. Nothing committed is ever harmed and `latest`
never names a partial checkpoint."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from torch.distributed.checkpoint import FileSystemWriter

from blockdraft.cli import main
from blockdraft.errors import UserError
from blockdraft.telemetry.log import read_log
from blockdraft.train.checkpoint import committed_checkpoints, load_checkpoint
from blockdraft.train.loop import Trainer

SHARD = "__0_0.distcp"  # the DCP data file of a one-process save: the weights and AdamW state


def _losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_log(run_dir / "log.jsonl") if r["kind"] == "step"}


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_checkpoint_is_reported_and_the_previous_one_resumed(tiny_config, damage):
    cfg = tiny_config()
    run = Trainer(cfg, show_console=False).run().run_dir
    newest = run / "checkpoints" / "step-000006" / SHARD
    raw = newest.read_bytes()
    newest.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else raw[:-8] + bytes(8))
    resumed = Trainer(cfg, resume=True, show_console=False)
    resumed.prefetcher.close()
    assert resumed.step == 3
    (message,) = [m for code, _, m in resumed.pending_notes if code == "checkpoint_damaged"]
    assert "step-000006" in message and SHARD in message and "previous checkpoint" in message


def test_kill_9_during_a_checkpoint_write_resumes_from_the_previous_one(tiny_config, tmp_path):
    cfg = tiny_config()
    config_file = tmp_path / "config.json"
    config_file.write_text(cfg.model_dump_json())
    ready = tmp_path / "writing"
    child = textwrap.dedent(f"""
        import pathlib, time
        from torch.distributed.checkpoint import FileSystemWriter
        from blockdraft.config import Config
        from blockdraft.train.loop import Trainer

        write = FileSystemWriter.write_data

        def hanging_write(self, plan, planner):
            out = write(self, plan, planner)
            if self.path.name.endswith("step-000006"):  # the final save: a half-written shard, then hang
                target = self.path / {SHARD!r}
                target.write_bytes(target.read_bytes()[:100])
                pathlib.Path({str(ready)!r}).touch()
                time.sleep(600)
            return out

        FileSystemWriter.write_data = hanging_write
        cfg = Config.model_validate_json(pathlib.Path({str(config_file)!r}).read_text())
        Trainer(cfg, show_console=False).run()
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while not ready.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the child never reached the checkpoint write"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    run = tmp_path / "run"
    before = _losses(run)
    assert sorted(before) == [1, 2, 3, 4, 5, 6]
    root = run / "checkpoints"
    assert (root / ".tmp-step-000006").is_dir()  # the partial write is there ...
    assert [c.name for c in committed_checkpoints(root)] == ["step-000003"]  # ... and never counted
    assert (root / "latest").resolve().name == "step-000003"
    resumed = Trainer(cfg, resume=True, show_console=False)
    assert resumed.step == 3
    assert resumed.run().status == "completed"
    records = read_log(run / "log.jsonl")
    replayed = [r for r in records if r["kind"] == "step"][6:]
    assert [r["step"] for r in replayed] == [4, 5, 6]
    assert [r["loss"] for r in replayed] == pytest.approx([before[k] for k in (4, 5, 6)], rel=1e-6)
    assert [c.name for c in committed_checkpoints(root)] == ["step-000003", "step-000006"]
    assert not (root / ".tmp-step-000006").exists()


@pytest.mark.parametrize("failing_step", [3, 6])
def test_a_failing_write_warns_and_latest_stays_on_a_complete_checkpoint(tiny_config, monkeypatch, failing_step):
    write = FileSystemWriter.write_data

    def disk_full(self, plan, planner):
        if self.path.name.endswith(f"step-{failing_step:06d}"):
            (self.path / SHARD).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", disk_full)
    result = Trainer(tiny_config(), show_console=False).run()
    assert result.status == "completed" and result.last_step == 6
    records = read_log(result.run_dir / "log.jsonl")
    ckpts = {r["step"]: r for r in records if r["kind"] == "checkpoint"}
    assert not ckpts[failing_step]["committed"] and "No space left" in ckpts[failing_step]["error"]
    (warning,) = [r for r in records if r["kind"] == "warning" and r["code"] == "checkpoint_failed"]
    assert f"step {failing_step}" in warning["message"]
    root = result.run_dir / "checkpoints"
    good = [c.name for c in committed_checkpoints(root)]
    assert good == [f"step-{6 if failing_step == 3 else 3:06d}"]
    assert (root / "latest").resolve().name == good[-1]
    assert not list(root.glob(".tmp-*")) and not (root / f"step-{failing_step:06d}").exists()


def test_a_checkpoint_of_an_older_blockdraft_is_one_clear_line(tiny_config, tmp_path, capsys):
    cfg = tiny_config()
    run = Trainer(cfg, show_console=False).run().run_dir
    old = run / "checkpoints" / "step-000006"
    for f in old.iterdir():  # the format before DCP: drafter.safetensors + optimizer.pt, no .metadata
        if f.name.startswith((".metadata", "__")):
            f.unlink()
    (old / "drafter.safetensors").write_bytes(b"weights")
    (old / "optimizer.pt").write_bytes(b"adamw")
    with pytest.raises(UserError, match="written by an older blockdraft"):
        load_checkpoint(old)
    with pytest.raises(UserError, match="written by an older blockdraft"):  # no damage to pass over
        Trainer(cfg, resume=True, show_console=False)
    capsys.readouterr()
    for argv in (["export", str(run), "--out", str(tmp_path / "export")], ["ckpt-scan", str(old)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "step-000006 was written by an older blockdraft" in err and "\n" not in err, err


def test_a_crash_while_a_step_is_saved_again_keeps_the_checkpoint_it_replaces(tiny_config, monkeypatch):
    """Resuming a finished run saves its last step again. Until the new save commits, the committed one
    is only set aside: a crash in between resumes from it, and the next commit of the step removes it."""
    import blockdraft.train.checkpoint as checkpoint

    cfg = tiny_config()
    root = Trainer(cfg, show_console=False).run().run_dir / "checkpoints"
    assert [c.name for c in committed_checkpoints(root)] == ["step-000003", "step-000006"]
    replace = os.replace

    def fail_on_the_new_folder(src, dst):
        if str(src).endswith(".tmp-step-000006"):  # between setting the old one aside and renaming the new in
            raise OSError(errno.EIO, "Input/output error")
        return replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", fail_on_the_new_folder)
    Trainer(cfg, resume=True, show_console=False).run()
    assert not (root / "step-000006").exists()
    assert [c.name for c in committed_checkpoints(root)] == ["step-000003", ".replaced-step-000006"]
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    resumed = Trainer(cfg, resume=True, show_console=False)
    assert resumed.step == 6  # from the set-aside checkpoint, not step 3
    assert resumed.run().status == "completed"
    assert [c.name for c in committed_checkpoints(root)] == ["step-000003", "step-000006"]
    assert not list(root.glob(".replaced-*")) and not list(root.glob(".tmp-*"))
