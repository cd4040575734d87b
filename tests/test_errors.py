"""The shared user-error checks: one line naming what to fix."""

from argparse import Namespace

import pytest

from blockdraft.errors import UserError, check_at_least, exit_script, first_line


def test_the_first_option_below_its_minimum_is_named_and_unset_ones_pass():
    args = Namespace(steps=3, warmup=None, micro_batch=0, limit=-1)
    check_at_least(args, 1, "steps", "warmup")
    with pytest.raises(UserError, match=r"^--micro-batch must be at least 1, got 0$"):
        check_at_least(args, 1, "steps", "micro_batch", "limit")


def test_a_library_message_is_quoted_by_its_first_line_or_its_type():
    assert first_line(OSError("no file\n  more detail\n")) == "no file"
    assert first_line(ValueError("  ")) == "ValueError"


def test_a_scripts_user_error_is_one_line_and_exit_code_2(capsys):
    def main() -> int:
        raise UserError("data file not found: /nope.jsonl")

    with pytest.raises(SystemExit) as stopped:
        exit_script(main)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "error: data file not found: /nope.jsonl\n"
    with pytest.raises(SystemExit) as stopped:
        exit_script(lambda: 0)
    assert stopped.value.code == 0
