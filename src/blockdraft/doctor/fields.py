"""The step fields the doctor reads and the names other trainers give them.

One table, used by every reader: a log's key is matched to our field by `--map` first, then by our
own name, then by the aliases below in order, then by the same names after the key's last "/"
(`perf/tokens_per_sec`, never an `eval/` or `val/` key). Matching is case-sensitive; a W&B chart
export's "run name - " prefix is dropped before matching.
"""

from __future__ import annotations

from collections.abc import Iterable

from blockdraft.errors import UserError
from blockdraft.telemetry.log import NONFINITE

STEP_FIELDS = (
    "step", "time", "lr", "loss", "acc", "tau_est", "streak", "grad_norm", "skipped", "noise_std", "epoch",
    "epoch_progress", "progress", "tokens", "seq_len_max", "step_time", "data_wait", "queue_depth", "tok_per_s",
    "graphs_compiled", "kl", "window"
)
LIST_FIELDS = ("buckets", "acc_per_pos")
OTHER_FIELDS = ("kind", "skip_reason", NONFINITE)
HELD_OUT = ("eval", "val", "test")

ALIASES: dict[str, tuple[str, ...]] = {
    "step": (
        "global_step", "train/global_step", "trainer/global_step", "optimizer_step", "iteration", "iter", "it", "Step",
        "_step"
    ),
    "time": ("timestamp", "_timestamp", "wall_time", "walltime", "wall", "elapsed", "elapsed_s", "_runtime"),
    "loss": ("train/loss", "train_loss", "loss/train", "Loss/train", "avg_loss", "loss_avg", "running_loss"),
    "acc": (
        "accuracy", "train/acc", "train/accuracy", "avg_acc", "acc_avg", "top1", "train_acc", "mean_token_accuracy"
    ),
    "lr": ("learning_rate", "train/lr", "train/learning_rate", "lr/0", "lr_0", "optim/lr"),
    "tau_est": ("train/tau_est", "tau_train"),
    "streak": ("avg_streak", "train/streak", "streak_avg"),
    "grad_norm": ("train/grad_norm", "gradient_norm", "grad/norm", "gnorm", "total_norm"),
    "noise_std": ("noise", "noise_sigma", "noise_scale", "train/noise_std"),
    "epoch": ("train/epoch", "ep"),
    "epoch_progress": ("epoch_frac", "epoch_fraction", "train/epoch_progress"),
    "progress": ("run_progress", "train/progress"),
    "tokens": ("num_tokens", "ntokens", "train/tokens"),
    "step_time": ("iter_time", "time_per_step", "batch_time", "sec_per_step", "step_s", "train/step_time"),
    "data_wait": ("data_time", "data_s", "train/data_time", "wait_s"),
    "queue_depth": ("queue", "q", "q_pre", "prefetch_queue", "queue_size", "qsize"),
    "tok_per_s": (
        "tok_s", "tokens_per_sec", "tokens_per_second", "tok/s", "tps", "throughput", "train/tokens_per_second"
    ),
    "kl": ("train/kl", "kl_loss"),
    "window": ("n_steps", "steps_in_window", "window_steps", "num_steps", "count"),
    "skipped": ("is_skipped",),
    "seq_len_max": ("max_seq_len", "seq_len"),
}


def resolve(keys: Iterable[str], mapping: dict[str, str]) -> dict[str, str]:
    """Our field -> the log's key, for every field the log has under some name."""
    present = set(keys)
    out = {ours: theirs for ours, theirs in mapping.items() if theirs in present}
    taken = set(out.values())
    by_base: dict[str, list[str]] = {}
    for key in present:
        head, sep, base = key.rpartition("/")
        if sep and not head.lower().startswith(HELD_OUT):
            by_base.setdefault(base, []).append(key)
    for ours in STEP_FIELDS + LIST_FIELDS + OTHER_FIELDS:
        if ours in out:
            continue
        names = (ours, *ALIASES.get(ours, ()))
        exact = [name for name in names if name in present and name not in taken]
        nested = [keys[0] for name in names if len(keys := by_base.get(name, [])) == 1 and keys[0] not in taken]
        for name in exact + nested:
            out[ours] = name
            taken.add(name)
            break
    return out


def renamed(resolved: dict[str, str]) -> dict[str, str]:
    """The fields read under another name (what the report says it mapped)."""
    return {ours: theirs for ours, theirs in resolved.items() if ours != theirs}


def parse_mapping(text: str | None) -> dict[str, str]:
    """`loss=train/loss,step=global_step` -> {"loss": "train/loss", "step": "global_step"}."""
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        ours, sep, theirs = item.partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise UserError(f"--map item {item!r} is not of the form our_field=their_field")
        mapping[ours.strip()] = theirs.strip()
    return mapping
