"""Typed run configuration: YAML file + dotted `key=value` overrides -> validated `Config`.

Every section forbids unknown keys, so a typo fails at start-up with one clear line instead of
being silently ignored four days into a run.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from blockdraft.device import DeviceName
from blockdraft.errors import UserError, yaml_problem
from blockdraft.model.locate import looks_like_hub_id

TrackerName = Literal["tensorboard", "wandb", "trackio", "mlflow"]

LrShape = Literal["cosine", "linear", "constant"]
LR_SHAPES: tuple[str, ...] = get_args(LrShape)  # in this order the doctor tries them, so a tie goes to the first
DataFormat = Literal["auto", "messages", "conversations", "text"]
DATA_FORMATS: tuple[str, ...] = get_args(DataFormat)  # "auto", then the record key each other format reads
BLOCK_CLASS_RATIO = 2**0.125  # a ladder of 8 block-count classes an octave: how many classes a run fits


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TargetConfig(Section):
    path: str = Field(description="Hugging Face causal-LM folder (weights + tokenizer), or a hub id in the local cache")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"


class DrafterConfig(Section):
    num_layers: int = Field(5, ge=1, le=64)
    block_size: int = Field(16, ge=2, le=64)
    target_layer_ids: list[int] | None = Field(None, description="0-based decoder layers to tap; default rule")
    num_taps: int = Field(5, ge=1, description="taps used by the default rule when target_layer_ids is unset")
    mask_token_id: int | None = Field(None, description="defaults to the tokenizer's mask token")
    intermediate_size: int | None = Field(None, ge=1, description="defaults to the target's")
    init_from_target: bool = Field(
        False, description="start layer i from the target's layer L-num_layers+i and norm from its final norm"
    )

    def tap_layers(self, num_target_layers: int) -> list[int]:
        """The layers tapped on a target this deep: target_layer_ids, or the default rule's."""
        return list(self.target_layer_ids or default_layer_ids(num_target_layers, self.num_taps))


class DataConfig(Section):
    train_files: list[str] = Field(default_factory=list)
    format: DataFormat = "auto"
    max_len: int = Field(3072, ge=8)
    overlong: Literal["truncate", "drop"] = "truncate"
    thinking: bool = False
    buckets: list[int] | Literal["auto"] = "auto"
    tokens_per_batch: int = Field(12288, ge=1, description="padded tokens per micro-batch, at most")
    batch_cost: Literal["flops", "tokens"] = Field(
        "flops", description="cut micro-batches to equal model FLOPs (ranks wait less) or to the token budget alone")
    max_same_bucket_run: int = Field(3, ge=1)
    interleave: bool = True
    prefetch_depth: int = Field(4, ge=1)
    cache_dir: str | None = None
    num_workers: int = Field(0, ge=0, description="tokenizer processes; 0 means one per core")


class LossConfig(Section):
    weighting: Literal["exp_decay", "streak", "uniform"] = Field(
        "streak", description="won bench/ablation.py beyond its spread (benchmarks/2026-11-29-h200x2-ablation.md)")
    gamma: float | None = Field(None, gt=0, description="exp_decay scale; default 7 for B=16, 4 for B=8")
    streak_floor: float = Field(0.05, ge=0, le=1)
    labels: Literal["data", "target"] = "data"
    kl_weight: float = Field(0.0, ge=0)
    kl_temperature: float = Field(1.0, gt=0)
    logits_chunk: int = Field(4096, ge=64, description="rows of [rows x vocab] logits computed at once")


class NoiseConfig(Section):
    std: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    final_std: float = Field(0.0, ge=0)


class OptimConfig(Section):
    lr: float = Field(6e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.04, ge=0, lt=1)
    warmup_steps: int | None = Field(None, ge=0, description="overrides warmup_ratio when set")
    schedule: LrShape = "cosine"
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    grad_clip: float = Field(1.0, gt=0)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class TrainConfig(Section):
    out_dir: str = "runs/run"
    epochs: float = Field(6, gt=0)
    max_steps: int | None = Field(None, ge=1, description="stop after this many updates (overrides epochs)")
    max_minutes: float | None = Field(None, gt=0, description="stop (and save) after this wall time; the final "
                                      "eval (with eval_every) comes after it")
    grad_accum: int = Field(1, ge=1)
    num_anchors: int = Field(512, ge=1, description="blocks per sequence, at most")
    anchors_per_token: float | None = Field(
        None, gt=0, description="blocks per assistant token of a sequence (rounded up, capped by num_anchors); "
        "None: num_anchors alone")
    shape_classes: bool | Literal["auto"] = Field(
        "auto", description="pad each pass's packed length to the token budget and its block count to a "
        "bounded ladder, so a length mix compiles nothing after the warm-up (auto: when the drafter is "
        "compiled); train/shapes.py")
    block_class_ratio: float = Field(BLOCK_CLASS_RATIO, ge=1, description="how many block-count classes: as "
                                     "many as a ladder of this ratio gives the run's passes, then fitted to them")
    max_blocks_per_pass: int | None = Field(
        None, ge=1, description="split a micro-batch above this many blocks; default 1536 with flex attention "
        "(GPU), num_anchors with the dense mask (CPU), whose cost grows with the square of a pass")
    seed: int = 0
    device: DeviceName = "auto"
    precision: Literal["bf16", "fp32"] = "bf16"
    compile: bool | Literal["auto"] = Field("auto", description="torch.compile target and drafter (auto: on CUDA)")
    static_graphs: bool = Field(
        False, description="with shape classes, compile the drafter's forward and backward once per block class "
        "with every size known, instead of one graph for the most frequent class and one with symbolic sizes "
        "for the others: FP8 linears lose less to symbolic sizes, but the warm-up compiles a graph per class "
        "(over 3x longer on the Qwen3-8B bench's mix; docs/training.md)")
    activation_checkpointing: bool = Field(False, description="recompute drafter layers in backward (long contexts)")
    flex_backend: Literal["auto", "triton", "flash"] = Field(
        "auto", description="the drafter's flex-attention kernels: torch's Triton ones, or FlashAttention-4's "
        "(`pip install 'blockdraft[flash]'`, a Hopper or newer GPU); auto: flash where it can run (docs/training.md)")
    target_stream: bool = Field(
        True, description="on CUDA, run the frozen target's forward on its own stream, so that the next "
        "update's can run beside this update's optimizer step: the same losses, 0.3-0.8% faster on an H100 "
        "(docs/training.md)")
    fp8_linears: bool = Field(
        False, description="the drafter's linear layers multiply in FP8 while training (torchao's float8 "
        "training, tensorwise scales; `pip install 'blockdraft[fp8]'`, a GPU of compute capability 8.9 or newer); "
        "weights, AdamW and checkpoints stay fp32 and decoding runs plain layers: 1.08x the update on the "
        "Qwen3-8B shape on an H100; held-out tau on SmolLM2-135M 0.7% lower over 6 seeds, within their spread "
        "(docs/training.md)")
    save_every: int = Field(1000, ge=1)
    keep_last: int = Field(3, ge=1)
    eval_every: int | None = Field(None, ge=1)
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="under torchrun: DDP replicates the drafter, FSDP2 shards its weights and AdamW state"
    )
    dist_timeout_s: float = Field(600.0, gt=0, description="a collective waiting this long for a rank fails the run")
    trackers: list[TrackerName] = Field(
        default_factory=list, description="experiment trackers fed from the run log (docs/trackers.md)")
    log_every_s: float = Field(30.0, gt=0, description="without a terminal, one progress line this often")


class EvalConfig(Section):
    prompts: list[str] = Field(default_factory=list, description="held-out prompt files")
    max_prompts: int = Field(16, ge=1)
    max_new_tokens: int = Field(128, ge=1)
    prompt_tokens: int = Field(256, ge=1, description="prompt length cap for raw-text prompts")
    batch_size: int = Field(1, ge=1, description="prompts decoded at once (greedy single path; pays on a GPU)")


class GuardConfig(Section):
    """The step guard (train/guard.py): a guarded step applies no update and does not advance the LR."""

    enabled: bool = True
    spike_k: float = Field(10.0, gt=0, description="spike when value > median + k * MAD of the bucket's window")
    spike_min_ratio: float = Field(3.0, ge=1, description="loss: ... and value > this many times that median")
    grad_norm_min_ratio: float = Field(
        5.0, ge=1, description="grad norm: the same ratio; healthy small batches reach 3.4x their median grad norm"
    )
    window: int = Field(200, ge=3, description="accepted steps remembered per length bucket")
    min_history: int = Field(20, ge=3, description="no spike test until a bucket has this many accepted steps")
    check_grad_norm: bool = Field(True, description="apply the spike test to the grad norm as well as the loss")
    max_consecutive_skips: int = Field(5, ge=1, description="then roll back to the last committed checkpoint")


class Config(Section):
    target: TargetConfig
    drafter: DrafterConfig = DrafterConfig()
    data: DataConfig = DataConfig()
    loss: LossConfig = LossConfig()
    noise: NoiseConfig = NoiseConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    guard: GuardConfig = GuardConfig()

    @model_validator(mode="after")
    def _taps_unique(self) -> Config:
        ids = self.drafter.target_layer_ids
        if ids is not None and (len(set(ids)) != len(ids) or any(i < 0 for i in ids)):
            raise ValueError("drafter.target_layer_ids must be distinct non-negative layer indices")
        return self


def default_gamma(block_size: int) -> float:
    """The published decay scale: 7 for B=16, 4 for B=8, interpolated linearly in between/beyond."""
    return max(1.0, 4.0 + (block_size - 8) * 3.0 / 8.0)


def default_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """Taps spread evenly from layer 1 to layer L-3; one tap uses L//2 (DFLASH.md)."""
    if num_taps == 1:
        return [num_target_layers // 2]
    lo, hi = 1, max(1, num_target_layers - 3)
    if num_taps > hi - lo + 1:
        raise UserError(
            f"drafter.num_taps={num_taps} is more than the {hi - lo + 1} layers between 1 and L-3 of a "
            f"{num_target_layers}-layer target; lower it or set drafter.target_layer_ids"
        )
    return [lo + round(i * (hi - lo) / (num_taps - 1)) for i in range(num_taps)]


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Override values are YAML scalars/lists: `lr=3e-4`, `betas=[0.9,0.95]`, `interleave=false`."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r} is not of the form section.key=value")
        node = raw
        *sections, leaf = key.split(".")
        for part in sections:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise UserError(f"override {key!r}: {part!r} is not a section")
            node = child
        try:
            node[leaf] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UserError(f"cannot parse override value {value!r}: {yaml_problem(exc)}") from None
    return raw


def build_config(raw: dict[str, Any], overrides: list[str] | None = None) -> Config:
    raw = apply_overrides(raw, overrides or [])
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc) from None


def config_error(exc: ValidationError, section: str = "") -> UserError:
    """A config's validation failure as one line naming the first bad key (`section.key` for a section
    validated on its own)."""
    errors = exc.errors()
    where = ".".join(str(p) for p in ([section] if section else []) + list(errors[0]["loc"])) or "config"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if errors[0]["type"] == "extra_forbidden":
        return UserError(f"config: unknown key {where!r}{more}")
    return UserError(f"config: {where}: {errors[0]['msg']}{more}")


# Paths a config file may hold. Relative ones are read against the file's folder, so a config works
# from any directory; paths given as overrides stay relative to the current directory.
CONFIG_PATHS = ("target.path", "data.train_files", "data.cache_dir", "train.out_dir", "eval.prompts")


def _against(text: str, base: Path, hub_id_ok: bool) -> str:
    path = Path(text).expanduser()
    if path.is_absolute() or (hub_id_ok and looks_like_hub_id(text) and not (base / path).exists()):
        return str(path)
    return os.path.normpath(base / path)


def resolve_paths(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """Make the CONFIG_PATHS of a raw config file absolute against `base`, its folder. A target that
    is no folder there but reads as a hub id (`owner/name`) is left for the hub cache lookup."""
    for dotted in CONFIG_PATHS:
        section, key = dotted.split(".")
        node = raw.get(section)
        if not isinstance(node, dict):
            continue
        value = node.get(key)
        if isinstance(value, str):
            node[key] = _against(value, base, hub_id_ok=dotted == "target.path")
        elif isinstance(value, list):
            node[key] = [_against(v, base, False) if isinstance(v, str) else v for v in value]
    return raw


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a YAML config; relative paths inside it are relative to its folder (CONFIG_PATHS)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: the top level must be a mapping of sections")
    return build_config(resolve_paths(raw, path.resolve().parent), overrides)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def total_updates(max_steps: int | None, epochs: float, updates_per_epoch: int) -> int:
    """Optimizer updates in a run: max_steps, else `epochs` epochs with a partial last epoch rounded up
    to a whole update. The trainer's length, and the doctor's for a log that does not state it."""
    return max_steps or max(1, math.ceil(epochs * updates_per_epoch))


def warmup_updates(warmup_steps: int | None, warmup_ratio: float, total_steps: int) -> int:
    """Warmup length: warmup_steps when set, else warmup_ratio of the run rounded up. Plain values, so the
    doctor applies the same rule to a foreign config."""
    return warmup_steps if warmup_steps is not None else math.ceil(warmup_ratio * total_steps)
