"""User mistakes end in one line on stderr and exit code 2, never a traceback."""

from pathlib import Path

import pytest

from blockdraft.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["train", "does-not-exist.yaml"], "config file not found"),
        (["export", "no-such-run", "--out", "x"], "checkpoint path not found"),
        (["eval", "--target", "t", "--drafter", "d", "--prompts", "p", "--limit", "0"],
         "--limit must be at least 1, got 0"),
        (["eval", "--target", "t", "--drafter", "d", "--prompts", "p", "--temperature", "-1"],
         "--temperature must be at least 0, got -1"),
        (["data", "f.jsonl", "--target", "t", "--grad-accum", "0"], "--grad-accum must be at least 1, got 0"),
        (["regenerate", "--target", "t", "--in", "f", "--out", "o", "--shard-size", "0"],
         "--shard-size must be at least 1, got 0"),
        (["bench", "--device", "cpu", "--warmup", "-2"], "--warmup must be at least 0, got -2"),
        (["bench", "--device", "cpu", "train.fp8_linears=true"],
         "train.fp8_linears: FP8 matmuls need a GPU of compute capability 8.9 or newer (this device: cpu)"),
    ],
)
def test_user_errors_exit_2_with_one_line(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_override_and_missing_target(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("target:\n  path: /nonexistent/model\n")
    assert main(["train", str(cfg), "optim.lr=oops"]) == 2
    assert "optim.lr" in capsys.readouterr().err
    assert main(["train", str(cfg)]) == 2
    assert "target folder not found" in capsys.readouterr().err


def test_missing_data_or_prompt_files_are_one_line_before_the_run_folder_is_made(tiny_target, tiny_corpus,
                                                                                   tmp_path, capsys):
    """A mistyped path is refused before anything is made or loaded, ahead of the notes a run prints
    (the demo config's last-layer tap is one), so the line is the only one on stderr."""
    bad_prompts = tmp_path / "bad.jsonl"
    bad_prompts.write_text('{"bad"\n')
    base = ["train", str(ROOT / "configs" / "demo.yaml"), f"target.path={tiny_target}",
            f"data.train_files=[{tiny_corpus}]", f"train.out_dir={tmp_path / 'run'}", "train.device=cpu",
            "drafter.target_layer_ids=[3]", "--no-console"]
    for override, fragment in (("data.train_files=[/nope.jsonl]", "data file not found: /nope.jsonl"),
                               ("eval.prompts=[/nope.jsonl]", "data file not found: /nope.jsonl"),
                               (f"eval.prompts=[{bad_prompts}]", "no usable prompt in")):
        assert main([*base, override]) == 2
        err = capsys.readouterr().err
        assert fragment in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_mask_id_outside_the_table_says_what_to_do(tiny_target, tiny_corpus, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"target:\n  path: {tiny_target}\ndrafter:\n  mask_token_id: 100000\n  target_layer_ids: [0, 2]\n"
        f"data:\n  train_files: [{tiny_corpus}]\n  cache_dir: {tmp_path / 'cache'}\n"
        f"train:\n  out_dir: {tmp_path / 'run'}\n  device: cpu\n"
    )
    assert main(["train", str(cfg), "--no-console"]) == 2
    err = capsys.readouterr().err
    assert "mask_token_id=100000 is outside the target's embedding table" in err
    assert "leave drafter.mask_token_id unset" in err and not (tmp_path / "cache").exists()


def test_verb_modules_and_help_import_neither_torch_nor_transformers():
    """Every verb module loads its heavy code inside `run`, so `--help` and `doctor` start fast."""
    import subprocess
    import sys

    code = (
        "import importlib, sys, contextlib, io\n"
        "from blockdraft.cli import main\n"
        "from blockdraft.commands import VERBS\n"
        "mods = [importlib.import_module(m) for m, _ in VERBS.values()]\n"
        "assert all(callable(m.add_arguments) and callable(m.run) for m in mods)\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "sys.exit(int('torch' in sys.modules or 'transformers' in sys.modules))\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_missing_verb_module_is_a_bug_not_a_hidden_verb(monkeypatch):
    from blockdraft import cli

    monkeypatch.setitem(cli.VERBS, "doctor", ("blockdraft.commands.no_such_verb", "gone"))
    with pytest.raises(ModuleNotFoundError):
        main(["doctor", "x"])


def test_overrides_count_after_an_option(monkeypatch):
    """`bench ... a=1 --no-check b=2` keeps both overrides, in order; a stray word is still refused."""
    from blockdraft.commands import bench

    seen = {}
    monkeypatch.setattr(bench, "run", lambda args: seen.update(vars(args)) or 0)
    assert main(["bench", "--device", "cpu", "train.compile=false", "--no-check", "drafter.num_layers=1",
                 "drafter.num_layers=2"]) == 0
    assert seen["overrides"] == ["train.compile=false", "drafter.num_layers=1", "drafter.num_layers=2"]
    assert seen["no_check"] is True
    with pytest.raises(SystemExit) as stray:
        main(["bench", "--device", "cpu", "a.b=1", "--no-check", "oops"])
    assert stray.value.code == 2
    with pytest.raises(SystemExit) as no_overrides:
        main(["doctor", "run", "a.b=1"])
    assert no_overrides.value.code == 2
