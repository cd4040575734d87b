"""Export: serving-format config and tensor names; loading an export back gives identical outputs."""

import json

import pytest
import torch
from safetensors.torch import load_file

from blockdraft.cli import main
from blockdraft.errors import UserError
from blockdraft.model.export import load_drafter, write_export
from blockdraft.train.loop import Trainer


def test_export_round_trip_and_format(tiny_config, tmp_path):
    cfg = tiny_config(train={"max_steps": 2, "save_every": 100})
    trainer = Trainer(cfg, show_console=False)
    trainer.run()
    out = tmp_path / "export"
    assert main(["export", str(cfg.train.out_dir), "--out", str(out), "--dtype", "float32"]) == 0

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["num_hidden_layers"] == cfg.drafter.num_layers == len(config["layer_types"])
    assert config["block_size"] == cfg.drafter.block_size
    assert config["num_target_layers"] == 4
    assert config["dflash_config"]["target_layer_ids"] == trainer.drafter.target_layer_ids
    assert config["dflash_config"]["mask_token_id"] == trainer.drafter.mask_token_id
    names = set(load_file(out / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)

    loaded = load_drafter(out)
    torch.manual_seed(0)
    n, t, q, h = 1, 9, 4, 32
    args = (torch.randn(n, q, h), torch.arange(5, 9)[None], torch.randn(n, t, h), torch.arange(t)[None])
    trainer.drafter.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(*args), trainer.drafter(*args), rtol=0, atol=0)
    trainer.prefetcher.close()


def test_trust_remote_code_loading_builds_this_drafter(tiny_config, tmp_path):
    """z-lab's documented path: AutoModel with trust_remote_code builds our drafter with our weights,
    from the folder alone; its forward (z-lab's arguments) equals the drafter's."""
    import os
    import stat
    import subprocess
    import sys

    from transformers import AutoModel

    cfg = tiny_config(train={"max_steps": 1, "save_every": 100})
    trainer = Trainer(cfg, show_console=False)
    trainer.run()
    trainer.prefetcher.close()
    out = tmp_path / "export"
    assert main(["export", str(cfg.train.out_dir), "--out", str(out), "--dtype", "float32"]) == 0
    assert all(stat.S_IMODE(os.stat(out / f).st_mode) == 0o644 for f in os.listdir(out))
    model = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.float32).eval()
    assert type(model).__name__ == "DFlashDraftModel" and model.block_size == cfg.drafter.block_size
    torch.manual_seed(0)
    taps = torch.randn(1, 9, 32 * len(model.target_layer_ids))
    noise = torch.randn(1, 4, 32)
    positions = torch.arange(13)[None]
    drafter = trainer.drafter.eval()
    with torch.no_grad():
        ours = drafter(noise, positions[:, 9:], drafter.fuse(taps), positions[:, :9])
        torch.testing.assert_close(model(position_ids=positions, noise_embedding=noise, target_hidden=taps), ours)

    # A serving machine has torch and transformers but not blockdraft: the folder alone must load there.
    saved = tmp_path / "inputs.pt"
    torch.save({"positions": positions, "noise": noise, "taps": taps}, saved)
    serve = (
        "import sys; sys.modules['blockdraft'] = None\n"
        "import torch; from transformers import AutoModel\n"
        f"x = torch.load({str(saved)!r})\n"
        f"m = AutoModel.from_pretrained({str(out)!r}, trust_remote_code=True, dtype=torch.float32).eval()\n"
        "with torch.no_grad():\n"
        "    y = m(position_ids=x['positions'], noise_embedding=x['noise'], target_hidden=x['taps'])\n"
        f"torch.save(y, {str(tmp_path / 'served.pt')!r})\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", serve], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    torch.testing.assert_close(torch.load(tmp_path / "served.pt"), ours)


def test_an_output_folder_that_cannot_be_made_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot create folder"):
        write_export(tmp_path / "file" / "export", {}, {}, torch.float32)


def test_a_run_folder_given_as_a_drafter_is_told_to_export_first(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match=r"is not an exported drafter .*; it is a run folder: export it first, "
                                        r"blockdraft export .*run --out DIR$"):
        load_drafter(tmp_path / "run")
    with pytest.raises(UserError, match=r"nope is not an exported drafter \(config.json \+ model.safetensors "
                                        r"expected\)$"):
        load_drafter(tmp_path / "nope")
