"""`--config FILE`: the run's settings from a YAML/JSON config of blockdraft or of another trainer.

The settings checks (gamma, betas, warmup, LR and noise schedules, epochs) need values a foreign log
does not carry. A key is taken when its dotted path is one of ours (`optim.lr`) or its own name is a
common alias (`learning_rate`, `adam_beta2`, `num_train_epochs`, `loss_decay_gamma`, ...); keys under
a section whose name contains "noise" are read as noise settings. What was read is reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from blockdraft.config import LR_SHAPES
from blockdraft.errors import UserError, yaml_problem

# our setting -> the leaf names other configs use for it (our own dotted path always matches)
SETTINGS: dict[str, tuple[str, ...]] = {
    "drafter.block_size": ("block_size", "block_len", "draft_block_size", "num_draft_tokens"),
    "loss.gamma": ("gamma", "loss_gamma", "loss_decay_gamma", "decay_gamma", "loss_decay"),
    "optim.lr": ("lr", "learning_rate", "max_lr", "peak_lr", "base_lr"),
    "optim.betas": ("betas", "adam_betas", "adamw_betas"),
    "optim.beta1": ("adam_beta1", "beta1"),
    "optim.beta2": ("adam_beta2", "beta2"),
    "optim.warmup_steps": ("warmup_steps", "num_warmup_steps", "warmup_iters", "lr_warmup_steps"),
    "optim.warmup_ratio": ("warmup_ratio", "warmup_frac", "warmup_fraction", "warmup_pct"),
    "optim.schedule": ("lr_scheduler_type", "lr_scheduler", "scheduler", "lr_schedule", "schedule", "decay_style"),
    "optim.min_lr_ratio": ("min_lr_ratio", "final_lr_ratio"),
    "optim.min_lr": ("min_lr", "final_lr", "lr_min"),
    "train.epochs": ("epochs", "num_epochs", "num_train_epochs", "n_epochs", "max_epochs"),
    "train.max_steps": ("max_steps", "total_steps", "train_steps", "num_training_steps", "total_iters", "max_iters"),
    "train.save_every": ("save_every", "save_steps", "checkpoint_every", "ckpt_every", "save_interval"),
    "train.grad_accum": ("grad_accum", "gradient_accumulation_steps", "accum_steps", "grad_accum_steps"),
    "train.steps_per_epoch": ("steps_per_epoch", "batches_per_epoch"),
    "noise.std": ("noise_std", "noise_sigma", "noise_std_start", "noise_start", "noise"),
    "noise.warmup_steps": ("noise_warmup_steps", "noise_warmup", "noise_warmup_iters"),
    "noise.schedule": ("noise_schedule",),
    "noise.final_std": ("noise_final_std", "noise_std_end", "noise_end", "noise_min"),
    "data.prefetch_depth": ("prefetch_depth", "prefetch_queue_size", "queue_size"),
}
NOISE_LEAVES = {  # leaf names under a section named like "noise"
    "std": "noise.std", "sigma": "noise.std", "start": "noise.std", "warmup_steps": "noise.warmup_steps",
    "warmup": "noise.warmup_steps", "schedule": "noise.schedule", "final_std": "noise.final_std",
    "end": "noise.final_std",
}


def read_config(path: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """(config in blockdraft's layout, our setting -> the key it came from) from a YAML or JSON file."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"--config {path}: no such file") from None
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"--config {path}: not YAML or JSON ({yaml_problem(exc)})") from None
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping of settings at the top level")
    found: dict[str, tuple[str, Any]] = {}
    for dotted, value in _leaves(data, ()):
        ours = _match(dotted)
        if ours is not None and ours not in found:
            found[ours] = (".".join(dotted), value)
    config: dict[str, Any] = {}
    for ours, (_, value) in found.items():
        section, key = ours.split(".")
        config.setdefault(section, {})[key] = value
    _normalise(config)
    return config, {ours: key for ours, (key, _) in found.items()}


def merge(base: dict[str, Any] | None, extra: dict[str, Any]) -> dict[str, Any]:
    """The log's own config with the file's values on top (the user named the file, so it wins)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in (base or {}).items()}
    for section, values in extra.items():
        target = out.setdefault(section, {})
        if isinstance(target, dict):
            target.update(values)
    return out


def _leaves(node: Any, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*prefix, str(key)))
    elif prefix:
        yield prefix, node


def _match(dotted: tuple[str, ...]) -> str | None:
    path = ".".join(dotted)
    if path in SETTINGS:
        return path
    leaf = dotted[-1]
    if any("noise" in part.lower() for part in dotted[:-1]) and leaf in NOISE_LEAVES:
        return NOISE_LEAVES[leaf]
    return next((ours for ours, names in SETTINGS.items() if leaf in names), None)


def _normalise(config: dict[str, Any]) -> None:
    """Bring foreign spellings to ours: beta1/beta2 to betas, min_lr to a ratio, schedule names."""
    optim = config.get("optim", {})
    if "betas" not in optim and isinstance(optim.get("beta2"), int | float):
        optim["betas"] = [float(optim.get("beta1", 0.9)), float(optim["beta2"])]
    optim.pop("beta1", None)
    optim.pop("beta2", None)
    min_lr, lr = optim.pop("min_lr", None), optim.get("lr")
    if "min_lr_ratio" not in optim and _positive(min_lr) is not None and _positive(lr):
        optim["min_lr_ratio"] = float(min_lr) / float(lr)
    if isinstance(optim.get("schedule"), str):  # "cosine_with_warmup" -> "cosine"; a shape we lack is dropped
        known = [name for name in LR_SHAPES if name in optim["schedule"].lower()]
        if known:
            optim["schedule"] = known[0]
        else:
            optim.pop("schedule")
    ratio = optim.get("warmup_ratio")
    if isinstance(ratio, int | float) and ratio > 1:
        optim["warmup_ratio"] = ratio / 100.0
    noise = config.get("noise", {})
    if isinstance(noise.get("schedule"), str):
        noise["schedule"] = "cosine" if "cos" in noise["schedule"].lower() else noise["schedule"].lower()


def _positive(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None
