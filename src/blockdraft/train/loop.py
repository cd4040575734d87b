"""The training loop: config in, run folder out.

Per optimizer update k (1-based):
  take grad_accum micro-batches (this rank's share of update k of the sampler's global plan) ->
  sample anchors for each (seeded by (seed, k, micro-batch index over all ranks, pass): any world
  size and a resume draw identical anchors) -> D = static label weight over the whole step ->
  per micro-batch: target taps (no grad) -> fuse (+ noise) -> drafter -> chunked loss / D -> backward
  -> clip -> AdamW at lr_at(k) -> one `step` record -> checkpoint / eval when due.
"""

from __future__ import annotations

import math
import os
import platform
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blockdraft import __version__
from blockdraft.config import Config, default_layer_ids, dump_config, total_warmup_steps
from blockdraft.data import Batch, BatchSampler, DataReport, Prefetcher, TokenizedDataset, data_record, prepare_dataset
from blockdraft.data.cost import dataset_costs
from blockdraft.device import pick_device
from blockdraft.doctor.live import LiveDoctor
from blockdraft.errors import UserError, make_dir
from blockdraft.evaluate.prompts import heldout_prompts
from blockdraft.evaluate.runner import evaluate as evaluate_modes
from blockdraft.model.drafter import DFlashDrafter, drafter_config, init_from_target
from blockdraft.model.target import load_target, resolve_mask_token, text_config
from blockdraft.schedule import lr_at, noise_std_at
from blockdraft.telemetry.console import TrainConsole
from blockdraft.telemetry.log import SCHEMA, RunLog
from blockdraft.telemetry.step_record import step_record
from blockdraft.telemetry.trackers import open_trackers
from blockdraft.train import distributed
from blockdraft.train.budget import TimeBudget
from blockdraft.train.checkpoint import (
    AsyncCheckpointer,
    LoadedCheckpoint,
    ShardedCheckpointer,
    Snapshot,
    Stager,
    committed_checkpoints,
    load_checkpoint,
)
from blockdraft.train.guard import StepGuard, batch_id
from blockdraft.train.hotpath import HotPath
from blockdraft.train.loss import summarize
from blockdraft.train.schedule import build_optimizer


def live_doctor(console: TrainConsole):
    """The doctor's detectors, run as the log is written: each new finding becomes a `warning`
    record and a console line, the moment it is seen."""
    doctor = LiveDoctor()

    def watch(log: RunLog, record: dict[str, Any]) -> None:
        for f in doctor.observe(record):
            log.write("warning", record["step"], code=f.code, severity=f.severity, message=f.summary,
                      advice=f.advice, steps=list(f.steps))
            console.note(f"[{f.severity}] {f.code}: {f.summary}", style="red" if f.severity == "error" else "yellow")

    return watch


@dataclass
class RunResult:
    run_dir: Path
    last_step: int
    status: str
    last_eval: dict[str, Any] | None


class Trainer:
    def __init__(self, cfg: Config, resume: bool = False, show_console: bool = True) -> None:
        self.cfg = cfg
        self.dp, self.device = distributed.init(pick_device(cfg.train.device), cfg.train.dist_timeout_s)
        self.rank, self.world = self.dp.rank, self.dp.size
        self.run_dir = make_dir(Path(cfg.train.out_dir))
        self.ckpt_root = self.run_dir / "checkpoints"
        self.show_console = show_console
        torch.manual_seed(cfg.train.seed)

        self._startup_warnings: list[str] = []
        self._world_note: str | None = None  # set by a resume at another world size
        resume_from = self._newest_readable_checkpoint() if resume else None
        _, tokenizer, hf_cfg = load_target(cfg.target.path, None, self.device)
        self.tokenizer = tokenizer
        d = cfg.drafter
        text_cfg = text_config(hf_cfg)
        layer_ids = d.target_layer_ids or default_layer_ids(text_cfg.num_hidden_layers, d.num_taps)
        self._setup_notes: list[tuple[str, str, str]] = []  # (code, severity, message) for the log
        if text_cfg.num_hidden_layers - 1 in layer_ids:
            self._setup_notes.append(("last_layer_tap", "warning",
                f"drafter.target_layer_ids taps the target's last layer ({text_cfg.num_hidden_layers - 1}): serving "
                "engines read it differently (vLLM before the final norm, as blockdraft trains; z-lab's reference "
                "and transformers' hidden_states[-1] after it; SGLang not at all); the default rule stops at L-3"))
        mask_id, mask_note = resolve_mask_token(tokenizer, text_cfg.vocab_size,
                                                bool(getattr(text_cfg, "tie_word_embeddings", False)), d.mask_token_id)
        if mask_note:
            self._setup_notes.append(("mask_token_chosen", "info", mask_note))
        self.dataset, self.data_report = self._prepare_data(tokenizer)

        self.target, _, _ = load_target(cfg.target.path, layer_ids, self.device, cfg.target.dtype)
        dcfg = drafter_config(text_cfg, d.num_layers, d.block_size, layer_ids, mask_id, d.intermediate_size,
                              self.target.embedding_scale)
        self.drafter = DFlashDrafter(dcfg).to(self.device)
        if d.init_from_target:
            init_from_target(self.drafter, self.target.decoder_layers, self.target.backbone.norm)
        self.hot = HotPath(self.target, self.drafter, cfg, self.device)
        self.hot.module, self.hot.defer_sync = distributed.wrap(self.hot.module, cfg.train.parallel, self.dp,
                                                                self.device)  # before the optimizer (FSDP2)
        self.sampler = BatchSampler(self.dataset.lengths, cfg.data, seed=cfg.train.seed, rank=self.rank,
                                    world_size=self.world, grad_accum=cfg.train.grad_accum,
                                    costs=dataset_costs(self.dataset, hf_cfg, cfg, layer_ids))
        per_epoch = max(1, self.sampler.batches_per_epoch // cfg.train.grad_accum)
        self.total_steps = cfg.train.max_steps or max(1, math.ceil(cfg.train.epochs * per_epoch))
        self.warmup_steps = total_warmup_steps(cfg.optim, self.total_steps)
        self.budget = TimeBudget(cfg.train.max_minutes * 60 if cfg.train.max_minutes else None)
        self.optimizer = build_optimizer(self.drafter.parameters(), cfg.optim, self.device)
        self.prefetcher = Prefetcher(self.dataset, self.sampler, depth=cfg.data.prefetch_depth,
                                     pin_memory=self.device.type == "cuda", prepare=self.hot.prepare)
        self.step = 0
        self.guard = StepGuard(cfg.guard)
        self.skip_list: set[str] = set()
        self._skipped_run: list[str] = []  # batch ids of the current run of consecutive guarded steps
        self.stager = Stager()
        self._staging_reserved = False
        self.checkpointer = (
            ShardedCheckpointer(self.ckpt_root, cfg.train.keep_last, self.rank, self.dp.ckpt_group)
            if self.dp.distributed else AsyncCheckpointer(self.ckpt_root, cfg.train.keep_last)
        )
        self.resumed_from: int | None = None
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_prompts = heldout_prompts(cfg.eval, tokenizer) if cfg.eval.prompts else []
        self._stop_reason: str | None = None

    def _prepare_data(self, tokenizer: Any) -> tuple[TokenizedDataset, DataReport]:
        """Rank 0 tokenises and fills the cache while the other ranks wait; then they read it."""
        if not self.dp.is_main:
            distributed.barrier()
        prepared = prepare_dataset(self.cfg.data, tokenizer)
        if self.dp.is_main:
            distributed.barrier()
        return prepared

    def _apply_plan(self, total_steps: int) -> None:
        """A shorter schedule from the time budget; the warmup already under way keeps its length."""
        self.total_steps = total_steps
        self.warmup_steps = min(self.warmup_steps, max(1, total_steps // 2))

    def _plan_time(self, log: RunLog, console: TrainConsole, update_s: float, elapsed_s: float) -> None:
        """Compilation shown once it is paid; the schedule fitted to the time budget when a look says so."""
        if self.step == 1 and self.device.type == "cuda":
            console.note(f"update 1 took {update_s:.0f} s (compiling the target and drafter; later updates reuse it)",
                         style="cyan")
        plan = self.budget.observe(self.step, update_s, elapsed_s, self.total_steps)
        if plan is None:
            return
        message = (f"train.max_minutes={self.cfg.train.max_minutes:g} holds {plan.total_steps} updates at "
                   f"{plan.median_update_s:.2f} s each (update 1 took {plan.first_update_s:.0f} s), not "
                   f"{self.total_steps}: the LR schedule now ends at update {plan.total_steps}")
        self._apply_plan(plan.total_steps)
        console.total = plan.total_steps
        log.write("warning", self.step, code="schedule_planned", severity="info", message=message,
                  total_steps=plan.total_steps, warmup_steps=self.warmup_steps, first_update_s=plan.first_update_s,
                  median_update_s=plan.median_update_s)
        console.note(message, style="cyan")

    def _newest_readable_checkpoint(self) -> LoadedCheckpoint | None:
        """The newest committed checkpoint that loads; a damaged one is reported and passed over."""
        for path in reversed(committed_checkpoints(self.ckpt_root)):
            try:
                return load_checkpoint(path)
            except UserError as exc:
                self._startup_warnings.append(f"{exc}; trying the previous checkpoint")
                print(f"warning: {exc}; trying the previous checkpoint", file=sys.stderr)
        if self._startup_warnings:
            raise UserError(f"no readable checkpoint under {self.ckpt_root}")
        return None

    # ---- state -------------------------------------------------------------------------------------
    def _restore(self, ckpt: LoadedCheckpoint) -> None:
        distributed.load_weights(self.drafter, self.optimizer, ckpt)
        state = ckpt.trainer_state
        self.step = int(state["step"])
        saved_world = int(state.get("world_size", 1))
        self.prefetcher.load_state_dict(self.sampler.carry_over(state["data"], saved_world))
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(tuple(state["rng"]["numpy"]))
        random.setstate(tuple(state["rng"]["python"]))
        if "cuda" in state["rng"] and self.device.type == "cuda":  # this device's: the world size may differ
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        self.skip_list = set(state.get("skip_list", []))
        if "guard" in state:
            self.guard.load_state_dict(state["guard"])
        if "budget" in state:
            self.budget.load_state_dict(state["budget"])
            if self.budget.plan is not None:
                self._apply_plan(self.budget.plan.total_steps)
        if saved_world != self.world:
            self._world_note = (
                f"checkpoint written by {saved_world} ranks, resumed on {self.world}: weights, optimizer, step and "
                f"LR schedule continue exactly; the batch plan continues with the same update if world_size x "
                f"grad_accum is unchanged, else from the same fraction of epoch {state['data']['epoch']}; the skip "
                f"list ({len(self.skip_list)} batches of the old plan) is dropped")
            self.skip_list.clear()
        self.resumed_from = self.step

    def snapshot(self) -> Snapshot:
        """A consistent copy of the training state in host memory, taken between two updates."""
        rng = {"torch": torch.get_rng_state(), "numpy": list(np.random.get_state()), "python": list(random.getstate())}
        rng["numpy"][1] = torch.from_numpy(rng["numpy"][1].astype(np.int64))
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        trainer_state = {"step": self.step, "data": self.prefetcher.state_dict(), "rng": rng,
                         "skip_list": sorted(self.skip_list), "world_size": self.world,
                         "budget": self.budget.state_dict(), "guard": self.guard.state_dict()}
        if self.dp.distributed:  # live shards: the ShardedCheckpointer stages them itself
            model, optim = distributed.state_dicts(self.drafter, self.optimizer)
        else:
            staged = self.stager.stage(self._live_state())
            model, optim = staged["model"], staged["optim"]
        return Snapshot(
            self.step,
            model,
            self.drafter.config.to_dict(),
            optim,
            trainer_state,
            {"step": self.step, "total_steps": self.total_steps, "skip_list": sorted(self.skip_list),
             "config": self.cfg.model_dump(mode="json")},
        )

    def _live_state(self) -> dict[str, Any]:
        return {"model": self.drafter.state_dict(), "optim": self.optimizer.state_dict()}

    def save(self, log: RunLog, console: TrainConsole) -> None:
        """Start a background save; the loop is held only to finish the previous one and to stage.
        A save's `stall_s` is its staging time plus any later wait for its write (by the next save,
        a rollback or the end of the run): the time the loop was held because of that checkpoint."""
        self.report_saves(log, console, wait=True)
        t0 = time.perf_counter()
        snap = self.snapshot()
        self.checkpointer.submit(snap, time.perf_counter() - t0)

    def report_saves(self, log: RunLog, console: TrainConsole, wait: bool = False) -> None:
        """Log the in-flight save once it has finished (a `checkpoint` record at commit, or a warning)."""
        info, waited = self.checkpointer.poll(wait)
        if info is None:
            return
        info["stall_s"] += waited
        step = int(Path(info["path"]).name.split("-")[1])
        log.write("checkpoint", step, **info)
        if info["committed"]:
            console.note(f"checkpoint {info['path']} (loop held {info['stall_s']:.2f}s, "
                         f"written in {info['write_s']:.1f}s)", style="dim")
        else:
            message = f"checkpoint at step {step} failed, training goes on: {info['error']}"
            log.write("warning", self.step, code="checkpoint_failed", severity="warning", message=message)
            console.note(message, style="red")

    def train_step(self, micro_batches: list[Batch]) -> dict[str, Any]:
        """One update over the micro-batches, unless the guard refuses it: then weights, Adam moments
        and Adam's step count stay as they were and `self.step` (hence the LR schedule) does not move."""
        cfg, k = self.cfg, self.step + 1
        self.drafter.train()
        lr = lr_at(k, cfg.optim, self.total_steps, self.warmup_steps)
        noise_std = noise_std_at(k, cfg.noise, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        vector, grad_norm = self.hot.accumulate(micro_batches, k, self.rank, noise_std)
        host = torch.cat([grad_norm.detach().float().reshape(1), vector]).cpu().tolist()  # the step's one sync
        metrics = summarize(host[1:], host[0])  # the guard decides on these floats
        grad_norm = metrics["grad_norm"]
        # the whole update's buckets: every rank keys the guard alike, so all apply or skip the update
        buckets = distributed.rank_major([mb.bucket for mb in micro_batches], self.device)
        reason = self.guard.check(max(buckets), metrics["loss"], grad_norm)
        if reason is None:
            self.optimizer.step()
            self.step = k
        self.optimizer.zero_grad(set_to_none=True)
        return {
            "lr": lr,
            **metrics,
            "clipped": grad_norm > cfg.optim.grad_clip,
            "skipped": reason is not None,
            "skip_reason": reason,
            "noise_std": noise_std,
            "buckets": buckets,
        }

    # ---- the run -----------------------------------------------------------------------------------
    def _record_start(self, log: RunLog) -> None:
        log.write(
            "run_start", self.step, schema=SCHEMA, config=self.cfg.model_dump(mode="json"),
            versions={"blockdraft": __version__, "torch": torch.__version__, "python": platform.python_version()},
            world_size=self.world, device=str(self.device), resumed_from=self.resumed_from,
            total_steps=self.total_steps, warmup_steps=self.warmup_steps,
            batches_per_epoch=self.sampler.batches_per_epoch // self.cfg.train.grad_accum,
            drafter_params=sum(p.numel() for p in self.drafter.parameters()),
            target_layer_ids=self.drafter.target_layer_ids, mask_token_id=self.drafter.mask_token_id,
        )
        log.write("data", self.step, **data_record(self.data_report, self.sampler))

    def evaluate(self) -> dict[str, Any]:
        """Speculative decoding on the held-out prompts. Every rank runs the same evaluation (no rank
        waits for another; rank 0 logs it); under FSDP2 with a whole drafter gathered from the shards."""
        ev = self.cfg.eval
        drafter = self.drafter
        if self.dp.distributed and self.cfg.train.parallel == "fsdp":
            drafter = DFlashDrafter(self.drafter.config).to(self.device)
            drafter.load_state_dict(distributed.full_drafter_state(self.drafter))
        (path,), _ = evaluate_modes(self.target, drafter, self.eval_prompts, ev.max_new_tokens,
                                    self.tokenizer.eos_token_id, budgets=[], batch_size=ev.batch_size)
        return {"tau": path.tau, "tau_hist": path.tau_hist, "prompts": len(self.eval_prompts), "mode": "path",
                "budget": None, "tokens": path.tokens, "speedup": path.speedup, "lossless": path.lossless}

    def _on_signal(self, signum, _frame) -> None:
        """First SIGINT/SIGTERM: stop after this step and save. Second: leave at once (a save in
        flight is abandoned in its temp folder; committed checkpoints are never touched)."""
        if self._stop_reason is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: exited at once")
        self._stop_reason = signal.Signals(signum).name

    def _next_micro_batches(self, log: RunLog) -> list[Batch]:
        """The step's micro-batches; batches on the skip list (a rollback's offenders) are passed over."""
        micro: list[Batch] = []
        while len(micro) < self.cfg.train.grad_accum:
            batch = self.prefetcher.next()
            bid = batch_id(batch.epoch, batch.index_in_epoch)
            if bid in self.skip_list:
                log.write("skip", self.step + 1, reason="skip_list", batch_ids=[bid], bucket=batch.bucket,
                          loss=None, grad_norm=None)
                continue
            micro.append(self.hot.to_device(batch))
        return micro

    def _guarded(self, log: RunLog, console: TrainConsole, rec: dict[str, Any], micro: list[Batch]) -> None:
        """Record a guarded step; after max_consecutive_skips of them, roll back."""
        ids = [batch_id(mb.epoch, mb.index_in_epoch) for mb in micro]
        self._skipped_run += ids
        k = self.step + 1
        log.write("skip", k, reason=rec["skip_reason"], batch_ids=ids, bucket=max(rec["buckets"]),
                  loss=rec["loss"], grad_norm=rec["grad_norm"])
        message = (f"step {k} skipped ({rec['skip_reason']}): loss {rec['loss']:.4g}, grad norm "
                   f"{rec['grad_norm']:.4g}, batches {', '.join(ids)}; no update applied")
        log.write("warning", k, code="step_skipped", severity="warning", message=message)
        console.note(message)
        if self.guard.must_roll_back:
            self._roll_back(log, console)

    def _roll_back(self, log: RunLog, console: TrainConsole) -> None:
        """Return to the last committed checkpoint and never train on the offending batches again."""
        self.report_saves(log, console, wait=True)
        offenders = list(self._skipped_run)
        self._skipped_run.clear()
        ckpt = self._newest_readable_checkpoint()
        if ckpt is not None:
            self._restore(ckpt)
        self.guard.reset_skips()  # after the restore, which brings the checkpoint's windows
        self.skip_list.update(offenders)  # after the restore, which brings the checkpoint's older list
        to_step = self.step if ckpt is not None else None
        message = (f"{self.cfg.guard.max_consecutive_skips} steps in a row were skipped: rolled back to "
                   f"{f'step {to_step}' if ckpt else 'the current weights (no checkpoint yet)'}; "
                   f"{len(offenders)} batches put on the skip list")
        log.write("rollback", self.step, to_step=to_step, skipped_batches=offenders, skip_list=sorted(self.skip_list))
        log.write("warning", self.step, code="rollback", severity="warning", message=message)
        console.note(message, style="red")

    def run(self) -> RunResult:
        cfg = self.cfg
        main = self.dp.is_main  # only rank 0 writes the run folder's files and the console
        if main:
            (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        console = TrainConsole(self.total_steps, cfg.train.epochs if not cfg.train.max_steps else 0,
                               enabled=self.show_console and main, log_every_s=cfg.train.log_every_s)
        log = RunLog(self.run_dir / "log.jsonl" if main else Path(os.devnull),
                     watcher=live_doctor(console) if main else None,
                     sinks=open_trackers(cfg.train.trackers, self.run_dir) if main else ())
        self._record_start(log)
        for message in self._startup_warnings:
            log.write("warning", self.step, code="checkpoint_damaged", severity="warning", message=message)
        for code, severity, message in self._setup_notes:
            log.write("warning", self.step, code=code, severity=severity, message=message)
            if main:
                print(f"{severity}: {message}", file=sys.stderr)
        if self._world_note:
            log.write("warning", self.step, code="world_size_changed", severity="info", message=self._world_note)
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        t_start, last_eval, status, reason = time.time(), None, "completed", None
        try:
            with console:
                while self.step < self.total_steps:
                    t0 = time.time()
                    micro = self._next_micro_batches(log)
                    data_wait = time.time() - t0
                    rec = self.train_step(micro)
                    step_time = time.time() - t0
                    out_of_time = cfg.train.max_minutes and time.time() - t_start > cfg.train.max_minutes * 60
                    # one all-reduce: the update's counts over all ranks, and whether a rank must stop (a
                    # signal or the clock seen by one rank stops all of them after the same update)
                    signalled, timed_out, tokens, padded, samples = distributed.sum_over_ranks(
                        [self._stop_reason is not None, bool(out_of_time), sum(mb.real_tokens for mb in micro),
                         sum(mb.padded_tokens for mb in micro), sum(len(mb.sample_ids) for mb in micro)], self.device)
                    last = micro[-1]
                    rec.update(
                        epoch=last.epoch, epoch_progress=last.epoch_progress, progress=self.step / self.total_steps,
                        samples=samples, tokens=tokens,
                        pad_frac=1.0 - tokens / max(padded, 1),
                        seq_len_max=max(int(mb.input_ids.shape[1]) for mb in micro),
                        step_time=step_time, data_wait=data_wait, queue_depth=self.prefetcher.queue_depth,
                        tok_per_s=tokens / max(step_time, 1e-9), mfu=None,
                        mem_gb=torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
                    )
                    # a guarded step is logged under the update number it would have had
                    console.step(log.write("step", self.step + rec["skipped"], **step_record(rec)))
                    self._plan_time(log, console, step_time, time.time() - t_start)
                    self.report_saves(log, console)
                    if rec["skipped"]:
                        self._guarded(log, console, rec, micro)
                    else:
                        self._skipped_run.clear()
                    if signalled or timed_out:
                        status = "interrupted" if signalled else "completed"
                        reason = (self._stop_reason or "signal on another rank") if signalled else "max_minutes reached"
                        break
                    if rec["skipped"]:
                        continue
                    if not self._staging_reserved and not self.dp.distributed:  # AdamW's state exists now
                        self.stager.reserve(self._live_state())
                        self._staging_reserved = True
                    if self.step % cfg.train.save_every == 0 and self.step < self.total_steps:
                        self.save(log, console)
                    if cfg.train.eval_every and self.eval_prompts and self.step % cfg.train.eval_every == 0:
                        t_eval = time.time()
                        last_eval = self.evaluate()
                        log.write("eval", self.step, **last_eval, tau_est_train=rec["tau_est"],
                                  eval_s=time.time() - t_eval)
                        console.note(f"eval tau {last_eval['tau']:.2f} on {last_eval['prompts']} prompts",
                                     style="cyan")
                self.save(log, console)
                self.report_saves(log, console, wait=True)
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            reason = f"{type(exc).__name__}: {exc}"
            log.write("run_end", self.step, status=status, reason=reason)
            raise
        finally:
            self.prefetcher.close()
            for s, h in handlers.items():
                signal.signal(s, h)
        log.write("run_end", self.step, status=status, reason=reason, elapsed_s=time.time() - t_start)
        log.close()
        return RunResult(self.run_dir, self.step, status, last_eval)
