"""Config: YAML + dotted overrides, strict validation, the shipped configs load."""

from pathlib import Path

import pytest

from blockdraft.config import build_config, default_gamma, default_layer_ids, load_config
from blockdraft.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


def test_overrides_are_typed_and_nested():
    cfg = build_config({"target": {"path": "t"}}, ["optim.lr=3e-4", "optim.betas=[0.9,0.999]", "data.thinking=true",
                                                   "drafter.target_layer_ids=[1,2]"])
    assert cfg.optim.lr == 3e-4 and cfg.optim.betas == (0.9, 0.999)
    assert cfg.data.thinking is True and cfg.drafter.target_layer_ids == [1, 2]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.lrr=1"], "unknown key 'optim.lrr'"),
        (["optim.lr=-1"], "optim.lr"),
        (["drafter.block_size=abc"], "drafter.block_size"),
        (["optim.betas=[0.9,1.5]"], "beta"),
        (["nonsense"], "not of the form"),
    ],
)
def test_bad_values_fail_with_one_clear_line(overrides, message):
    with pytest.raises(UserError) as info:
        build_config({"target": {"path": "t"}}, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_config_file_that_is_not_yaml_fails_with_one_line_saying_where(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("train:\n  epochs: [1, 2\n")
    with pytest.raises(UserError) as info:
        load_config(broken)
    assert str(info.value).startswith(f"{broken}: not valid YAML: ") and "at line 3, column 1" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match=r"^cannot parse override value '\[1': .* at line 1, column 3$"):
        build_config({"target": {"path": "t"}}, ["optim.betas=[1"])


def test_shipped_configs_load_and_match_the_published_recipe():
    cfg = load_config(ROOT / "configs" / "qwen3-8b.yaml")
    assert cfg.drafter.block_size == 16 and cfg.drafter.num_layers == 5
    assert cfg.drafter.target_layer_ids == [1, 9, 17, 25, 33]
    assert cfg.train.num_anchors == 512 and cfg.loss.gamma == 7
    assert cfg.optim.lr == 6e-4 and cfg.optim.warmup_ratio == 0.04 and cfg.optim.schedule == "cosine"
    assert cfg.optim.betas == (0.9, 0.95) and cfg.optim.weight_decay == 0 and cfg.optim.grad_clip == 1.0
    assert cfg.data.max_len == 3072 and cfg.train.epochs == 6
    assert load_config(ROOT / "configs" / "demo.yaml").drafter.block_size == 8


def test_default_rules():
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_layer_ids(36, 1) == [18]
    assert default_gamma(16) == 7 and default_gamma(8) == 4
