"""All detectors, in report order; `diagnose` runs them over one LoggedRun."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from blockdraft.doctor.context import Context
from blockdraft.doctor.detectors import batches, epochs, evals, pipeline, settings, skips, timing, training
from blockdraft.doctor.findings import Finding, rank
from blockdraft.doctor.run import LoggedRun

Detector = Callable[[Context], Iterable[Finding]]  # each yields its findings, most do one at most

DETECTORS: tuple[Detector, ...] = (
    skips.nonfinite, skips.skipped_steps,
    training.loss_spike, training.accuracy_cliff, training.plateau,
    timing.checkpoint_stall, timing.logging_gap, timing.window_artifact, timing.late_recompile,
    pipeline.queue_drain, pipeline.data_wait, pipeline.throughput_drift,
    batches.homogeneous_batches, batches.bucket_loss_modes,
    epochs.epoch_accounting,
    settings.warmup_first_step, settings.lr_schedule_mismatch, settings.noise_schedule_flat,
    settings.optimizer_betas, settings.loss_decay_gamma,
    evals.tau_gap, evals.data_repetition,
)


def diagnose(run: LoggedRun, detectors: tuple[Detector, ...] = DETECTORS) -> list[Finding]:
    """Every finding for this run, most severe first."""
    ctx = Context(run)
    return rank([finding for detect in detectors for finding in detect(ctx)])
