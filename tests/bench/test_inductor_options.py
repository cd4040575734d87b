"""bench/inductor_options.py: it sets the named inductor settings, nested ones too, and refuses unknown names."""

import importlib.util
from pathlib import Path

import pytest
import torch._inductor.config as inductor_config

_spec = importlib.util.spec_from_file_location(
    "inductor_options", Path(__file__).parents[2] / "bench" / "inductor_options.py"
)
inductor_options = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(inductor_options)


def test_top_level_and_dotted_settings_are_set():
    with inductor_config.patch({"aggressive_fusion": False, "triton.cudagraphs": False}):
        inductor_options.apply({"aggressive_fusion": True, "triton.cudagraphs": True})
        assert inductor_config.aggressive_fusion is True
        assert inductor_config.triton.cudagraphs is True


def test_an_unknown_setting_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        inductor_options.apply({"no_such_setting": 1})
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip()
    assert message == "inductor_options: torch._inductor.config has no setting 'no_such_setting'"
