"""User mistakes end in one line on stderr and exit code 2, never a traceback."""

import pytest

from blockdraft.cli import main


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["train", "does-not-exist.yaml"], "config file not found"),
        (["export", "no-such-run", "--out", "x"], "checkpoint path not found"),
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
