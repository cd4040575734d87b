"""What happens around an update, one concern a hook (as OLMo-core's callbacks): the time budget,
saves, refused updates and rollback, evaluation, and the live doctor. The loop calls `on_start`
once the log is open, `on_step_end` after each step record, `on_end` after the last update; a hook
with state has `state_dict`/`load_state_dict` and is checkpointed with the trainer's other parts.
Hooks run in the order the trainer lists them."""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from blockdraft.data.prefetch import Batch
from blockdraft.doctor.live import LiveDoctor
from blockdraft.telemetry.step_record import TAU_EST_WINDOW, tau_est_over_window
from blockdraft.train.budget import TimeBudget

if TYPE_CHECKING:
    import torch

    from blockdraft.config import Config
    from blockdraft.evaluate.runner import ModeResult
    from blockdraft.model.drafter import DFlashDrafter
    from blockdraft.telemetry.console import TrainConsole
    from blockdraft.telemetry.log import RunLog
    from blockdraft.train.checkpoint import Checkpointer, LoadedCheckpoint
    from blockdraft.train.guard import StepGuard
    from blockdraft.train.state import DataFeed


class TrainingRun(Protocol):
    """What the hooks read and call of the trainer (train/loop.py's `Trainer`, which lists the hooks):
    named here so that the hooks need not import the loop that runs them."""

    cfg: Config
    device: torch.device
    total_steps: int
    warmup_steps: int
    started: float  # time.time() when the run opened
    stop_reason: str | None
    eval_prompts: list[list[int]]
    last_eval: dict[str, Any] | None
    log: RunLog
    console: TrainConsole
    checkpointer: Checkpointer
    guard: StepGuard
    feed: DataFeed
    drafter: DFlashDrafter
    parts: dict[str, Any]  # name -> a part with state_dict/load_state_dict, saved with the weights
    saves: SaveHook

    @property
    def step(self) -> int: ...

    def shorten_schedule(self, total_steps: int) -> None: ...

    def live_state(self) -> dict[str, dict[str, Any]]: ...

    def restore(self, ckpt: LoadedCheckpoint) -> None: ...

    def warn_damaged(self, message: str) -> None: ...

    def evaluate(self) -> ModeResult: ...


@dataclass
class StepEnd:
    """One loop iteration's outcome, as the hooks see it."""

    metrics: dict[str, Any]  # the step's values before logging (a NaN is still a NaN)
    micro: list[Batch]
    step_time: float
    stop: tuple[str, str] | None  # (status, reason) when every rank stops after this update

    @property
    def applied(self) -> bool:
        return not self.metrics["skipped"]

    @property
    def continues(self) -> bool:
        """An applied update and the run goes on: periodic saves and evals are due only then."""
        return self.applied and self.stop is None


class Hook:
    def __init__(self, trainer: TrainingRun) -> None:
        self.trainer = trainer

    def on_start(self) -> None: ...

    def on_step_end(self, end: StepEnd) -> None: ...

    def on_end(self) -> None: ...


class TimeBudgetHook(Hook):
    """`train.max_minutes`: the LR schedule re-planned to end when the time does (`TimeBudget`);
    and the first update's compile time shown once it is paid."""

    def __init__(self, trainer: TrainingRun, max_minutes: float | None) -> None:
        super().__init__(trainer)
        self.budget = TimeBudget(max_minutes * 60 if max_minutes else None)

    def on_step_end(self, end: StepEnd) -> None:
        t = self.trainer
        if t.step == 1 and t.device.type == "cuda":
            t.console.note(f"update 1 took {end.step_time:.0f} s (compiling the target and drafter; later updates "
                           "reuse it)", style="cyan")
        plan = self.budget.observe(t.step, end.step_time, time.time() - t.started, t.total_steps)
        if plan is None:
            return
        first = f" (update 1 took {plan.first_update_s:.0f} s)" if plan.first_update_s >= 1 else ""
        message = (f"train.max_minutes={t.cfg.train.max_minutes:g} holds {plan.total_steps} updates at "
                   f"{plan.median_update_s:.2f} s each{first}, not {t.total_steps}: the LR schedule now ends at "
                   f"update {plan.total_steps}")
        shown = abs(plan.total_steps - t.total_steps) >= 0.02 * t.total_steps  # late looks move the end little
        t.shorten_schedule(plan.total_steps)
        t.console.total = plan.total_steps
        t.log.write("warning", t.step, code="schedule_planned", severity="info", message=message,
                    total_steps=plan.total_steps, warmup_steps=t.warmup_steps, first_update_s=plan.first_update_s,
                    median_update_s=plan.median_update_s)
        if shown:
            t.console.note(message, style="cyan")

    def state_dict(self) -> dict[str, Any]:
        return self.budget.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.budget.load_state_dict(state)
        if self.budget.plan is not None:
            self.trainer.shorten_schedule(self.budget.plan.total_steps)


class SaveHook(Hook):
    """Checkpoints every `train.save_every` updates and at the end, written in the background.
    A save's `stall_s` is its staging time plus any later wait for its write (by the next save, a
    rollback or the end of the run): the time the loop was held because of that checkpoint."""

    def on_step_end(self, end: StepEnd) -> None:
        t = self.trainer
        self.report()
        if not end.continues:
            return
        t.checkpointer.reserve(t.live_state)  # after the first update: AdamW's state exists now
        if t.step % t.cfg.train.save_every == 0 and t.step < t.total_steps:
            self.save()

    def on_end(self) -> None:
        self.save()
        self.report(wait=True)

    def save(self) -> None:
        """Start a background save; the loop is held only to finish the previous one and to stage."""
        t = self.trainer
        self.report(wait=True)
        t.checkpointer.save(t.step, t.live_state(), drafter_config=t.drafter.config.to_dict(),
                            trainer_state={name: part.state_dict() for name, part in t.parts.items()},
                            trainer_info={"step": t.step, "total_steps": t.total_steps,
                                          "skip_list": sorted(t.feed.skip_list),
                                          "config": t.cfg.model_dump(mode="json")})

    def report(self, wait: bool = False) -> None:
        """Log the in-flight save once it has finished (a `checkpoint` record at commit, or a warning)."""
        t = self.trainer
        info = t.checkpointer.poll(wait)
        if info is None:
            return
        step = info.pop("step")
        t.log.write("checkpoint", step, **info)
        if info["committed"]:
            t.console.note(f"checkpoint {info['path']} (loop held {info['stall_s']:.2f}s, "
                           f"written in {info['write_s']:.1f}s)", style="dim")
        else:
            message = f"checkpoint at step {step} failed, training goes on: {info['error']}"
            t.log.write("warning", t.step, code="checkpoint_failed", severity="warning", message=message)
            t.console.note(message, style="red")


class GuardHook(Hook):
    """An update the guard refused: logged with its batches; after `guard.max_consecutive_skips` in
    a row, back to the last committed checkpoint, with those batches on the skip list for good."""

    def on_step_end(self, end: StepEnd) -> None:
        if end.applied:
            return
        t, rec, k = self.trainer, end.metrics, self.trainer.step + 1
        ids = [mb.batch_id for mb in end.micro]
        t.log.write("skip", k, reason=rec["skip_reason"], batch_ids=ids, bucket=max(rec["buckets"]),
                    loss=rec["loss"], grad_norm=rec["grad_norm"])
        message = (f"step {k} skipped ({rec['skip_reason']}): loss {rec['loss']:.4g}, grad norm "
                   f"{rec['grad_norm']:.4g}, batches {', '.join(ids)}; no update applied")
        t.log.write("warning", k, code="step_skipped", severity="warning", message=message)
        t.console.note(message)
        if t.guard.must_roll_back:
            self.roll_back()

    def roll_back(self) -> None:
        t = self.trainer
        t.saves.report(wait=True)
        ckpt = t.checkpointer.newest(t.warn_damaged)
        if ckpt is not None:
            t.restore(ckpt)
        offenders = t.guard.end_refusals()  # after the restore, which brings the checkpoint's guard
        t.feed.skip_list.update(offenders)  # ... and its older skip list
        to_step = t.step if ckpt is not None else None
        message = (f"{t.cfg.guard.max_consecutive_skips} steps in a row were skipped: rolled back to "
                   f"{f'step {to_step}' if ckpt else 'the current weights (no checkpoint yet)'}; "
                   f"{len(offenders)} batches put on the skip list")
        t.log.write("rollback", t.step, to_step=to_step, skipped_batches=offenders,
                    skip_list=sorted(t.feed.skip_list))
        t.log.write("warning", t.step, code="rollback", severity="warning", message=message)
        t.console.note(message, style="red")


class EvalHook(Hook):
    """Speculative decoding on the held-out prompts every `train.eval_every` updates, and after the
    last one (a run cut by `train.max_minutes` ends between multiples), unless a signal stopped it.
    Beside the measured tau it logs the training estimate over the updates before it (`tau_est_over_window`)."""

    evaluated_at: int | None = None
    last: StepEnd | None = None

    def __init__(self, trainer: TrainingRun) -> None:
        super().__init__(trainer)
        self.recent_tau_est: deque[float] = deque(maxlen=TAU_EST_WINDOW)

    def on_step_end(self, end: StepEnd) -> None:
        self.recent_tau_est.append(end.metrics["tau_est"])
        self.last, every = end, self.trainer.cfg.train.eval_every
        if end.continues and every and self.trainer.step % every == 0:
            self.evaluate()

    def on_end(self) -> None:
        end = self.last
        if end and self.trainer.cfg.train.eval_every and (end.stop is None or end.stop[0] == "completed"):
            self.evaluate()

    def evaluate(self) -> None:
        t = self.trainer
        if not t.eval_prompts or self.evaluated_at == t.step:
            return
        self.evaluated_at = t.step
        t0 = time.time()
        t.last_eval = t.evaluate().eval_record(len(t.eval_prompts), tau_est_over_window(self.recent_tau_est))
        t.log.write("eval", t.step, **t.last_eval, eval_s=time.time() - t0)
        t.console.note(f"eval tau {t.last_eval['tau']:.2f} on {t.last_eval['prompts']} prompts", style="cyan")


class LiveDoctorHook(Hook):
    """The doctor's detectors on the run's own records (rank 0), off the logging path: each update
    the records written since the last one are judged alone (non-finite values, slow checkpoints, the config
    once); the full analysis over the tail window runs at most every `every` updates and
    `min_interval_s` seconds, which bounds its share of the training thread (bench/live_doctor_cost.py).
    Each new finding becomes a `warning` record and a console line. The hook is a sink of the log that
    only queues records, to judge them after the update."""

    name = "live doctor"

    def __init__(self, trainer: TrainingRun, every: int = 50, min_interval_s: float = 30.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(trainer)
        self.every, self.min_interval_s, self.clock = every, min_interval_s, clock
        self.doctor = LiveDoctor(every=10**9)  # analyses when this hook says
        self._seen = self._last_step = 0
        self._last_time = clock()
        self._records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self._records.append(record)

    def close(self) -> None:
        pass

    def on_start(self) -> None:
        self.trainer.log.add_sink(self)

    def on_step_end(self, end: StepEnd) -> None:
        records, self._records = self._records, []
        found = [f for rec in records for f in self.doctor.ingest(rec)]
        self._seen += 1
        now = self.clock()
        if self._seen - self._last_step >= self.every and now - self._last_time >= self.min_interval_s:
            found += self.doctor.analyse()
            self._last_step, self._last_time = self._seen, now
        t = self.trainer
        for f in found:
            t.log.write("warning", t.step, code=f.code, severity=f.severity, message=f.summary, advice=f.advice,
                        steps=list(f.steps))
            t.console.note(f"[{f.severity}] {f.code}: {f.summary}", style="red" if f.severity == "error" else "yellow")


class StopOnSignal:
    """First SIGINT/SIGTERM: stop after this step and save. Second: leave at once (a save in flight
    is abandoned in its temp folder; committed checkpoints are never touched)."""

    def __init__(self, trainer: TrainingRun) -> None:
        self.trainer = trainer

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.trainer.stop_reason is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: exited at once")
        self.trainer.stop_reason = signal.Signals(signum).name

    def __enter__(self) -> StopOnSignal:
        self._saved = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)
