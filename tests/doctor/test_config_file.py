"""`doctor --config FILE`: a file it cannot use is one line naming the file and what is wrong."""

import pytest

from blockdraft.doctor.config_file import read_config
from blockdraft.errors import UserError


def test_a_config_that_is_not_yaml_is_one_line_saying_where(tmp_path):
    broken = tmp_path / "train.yaml"
    broken.write_text("optim:\n  betas: [0.9, 0.95\n")
    with pytest.raises(UserError) as info:
        read_config(broken)
    assert str(info.value).startswith(f"--config {broken}: not YAML or JSON (")
    assert "at line 3, column 1)" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(UserError, match=r"^--config .*nope.yaml: no such file$"):
        read_config(tmp_path / "nope.yaml")


def test_the_settings_it_recognises_are_read_with_the_key_they_came_from(tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("trainer:\n  learning_rate: 3.0e-4\n  num_train_epochs: 6\n")
    settings, sources = read_config(config)
    assert settings["optim"]["lr"] == 3e-4 and settings["train"]["epochs"] == 6
    assert sources["optim.lr"] == "trainer.learning_rate" and sources["train.epochs"] == "trainer.num_train_epochs"
