"""The serving format (z-lab / vLLM / SGLang): a folder with config.json + model.safetensors.

config.json is the drafter's Qwen3Config (`drafter_config`) with an auto_map to the modeling file the
folder carries (`model/remote_code.py`, for trust_remote_code loading). model.safetensors holds
unprefixed names (fc.weight, hidden_norm.weight, layers.N...., norm.weight): no embeddings, no lm_head.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from blockdraft.errors import UserError, make_dir
from blockdraft.model.drafter import DFlashDrafter


def config_from_dict(data: dict) -> Qwen3Config:
    return Qwen3Config(**{k: v for k, v in data.items() if k != "model_type"})


def top_level_rope_theta(config: dict) -> dict:
    """`config` with rope_theta also at the top level, where readers of the older layout look."""
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_theta") is not None:
        config["rope_theta"] = rope["rope_theta"]
    return config


def write_export(out_dir: Path, config: dict, state: dict[str, torch.Tensor], dtype: torch.dtype,
                 copies: dict[str, Path] | None = None) -> Path:
    """An export folder: config.json, model.safetensors (the tensors in `dtype`) and `copies` ({name:
    source file}), each of mode 0644: a serving process under another user reads them."""
    out_dir = make_dir(Path(out_dir))
    copies = copies or {}
    for name, source in copies.items():
        shutil.copyfile(source, out_dir / name)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt"})
    for name in ("config.json", "model.safetensors", *copies):
        (out_dir / name).chmod(0o644)
    return out_dir


def save_drafter(
    state: dict[str, torch.Tensor], config: Qwen3Config | dict, out_dir: Path, dtype: torch.dtype
) -> Path:
    cfg = config if isinstance(config, Qwen3Config) else config_from_dict(config)
    cfg_dict = cfg.to_dict()
    cfg_dict["dtype"] = str(dtype).removeprefix("torch.")
    cfg_dict["auto_map"] = {"AutoModel": "modeling_dflash.DFlashDraftModel"}  # trust_remote_code loading
    here = Path(__file__).parent
    copies = {"blockdraft_drafter.py": here / "drafter.py", "modeling_dflash.py": here / "remote_code.py"}
    return write_export(out_dir, top_level_rope_theta(cfg_dict), state, dtype, copies)


def load_drafter(path: Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> DFlashDrafter:
    path = Path(path)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        hint = ""
        if (path / "checkpoints").is_dir():  # a run folder
            hint = f"; it is a run folder: export it first, blockdraft export {path} --out DIR"
        raise UserError(f"{path} is not an exported drafter (config.json + model.safetensors expected){hint}")
    try:
        cfg = config_from_dict(json.loads((path / "config.json").read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise UserError(f"{path}/config.json is not a drafter config: {exc}") from None
    if "DFlashDraftModel" not in (cfg.architectures or []) or not hasattr(cfg, "dflash_config"):
        raise UserError(f"{path}/config.json does not describe a DFlashDraftModel")
    drafter = DFlashDrafter(cfg)
    missing, unexpected = drafter.load_state_dict(load_file(path / "model.safetensors"), strict=False)
    if missing or unexpected:
        raise UserError(f"{path}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return drafter.to(device=device, dtype=dtype).eval()
