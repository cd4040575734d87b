"""The training loop: config in, run folder out.

Per optimizer update k (1-based):
  take grad_accum micro-batches (this rank's share of update k of the sampler's global plan) ->
  sample anchors for each (seeded by (seed, k, micro-batch index over all ranks, pass): any world
  size and a resume draw identical anchors) -> D = static label weight over the whole step ->
  per micro-batch: target taps (no grad) -> fuse (+ noise) -> drafter -> chunked loss / D -> backward
  -> clip -> AdamW at lr_at(k) -> one `step` record -> the hooks (train/hooks.py): time budget,
  save, guard and rollback, eval, live doctor.

The trainer is built from parts that own their state (train/state.py, the guard, the time budget),
saved by name with the weights by the `Checkpointer`; the drafter's forward is wrapped (DDP, FSDP2)
before the step runner (`HotPath`) is built around it.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from blockdraft import __version__
from blockdraft.config import Config, dump_config, total_updates, warmup_updates
from blockdraft.data.batching import BatchSampler
from blockdraft.data.cache import prepare_dataset
from blockdraft.data.cost import anchor_candidates, dataset_blocks, dataset_costs
from blockdraft.data.prefetch import Batch, Prefetcher
from blockdraft.data.reading import check_files
from blockdraft.data.summary import data_record
from blockdraft.device import pick_device
from blockdraft.errors import UserError, make_dir
from blockdraft.evaluate.prompts import load_prompts, skip_counts
from blockdraft.evaluate.runner import ModeResult
from blockdraft.evaluate.runner import evaluate as evaluate_modes
from blockdraft.model.drafter import DFlashDrafter, drafter_config, init_from_target
from blockdraft.model.target import load_target, open_target, require_decodable, resolve_mask_token
from blockdraft.schedule import lr_at, noise_std_at
from blockdraft.telemetry.console import TrainConsole
from blockdraft.telemetry.log import SCHEMA, RunLog
from blockdraft.telemetry.step_record import step_record
from blockdraft.telemetry.trackers import open_trackers
from blockdraft.train import distributed
from blockdraft.train.checkpoint import Checkpointer, LoadedCheckpoint
from blockdraft.train.fp8 import require_fp8, to_fp8_linears
from blockdraft.train.guard import StepGuard
from blockdraft.train.hooks import (
    EvalHook,
    GuardHook,
    Hook,
    LiveDoctorHook,
    SaveHook,
    StepEnd,
    StopOnSignal,
    TimeBudgetHook,
)
from blockdraft.train.hotpath import DraftForward, HotPath, RunPlan, clipped, graphs_compiled
from blockdraft.train.loss import summarize
from blockdraft.train.optimizer import build_optimizer
from blockdraft.train.state import DataFeed, RngState, TrainState


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
        if cfg.train.fp8_linears:
            require_fp8(self.device)
        # the target's tokenizer, the data files and the held-out prompts are checked before the run folder is
        # made and before any note prints: a mistyped path or an unusable prompt file is the one line printed
        folder = open_target(cfg.target.path)
        self.tokenizer, hf_cfg = folder.tokenizer, folder.config
        text_cfg = hf_cfg.get_text_config()  # a multimodal config keeps the decoder's inside
        check_files(cfg.data.train_files)
        self.eval_prompts: list[list[int]] = []
        skipped_prompts: dict[str, int] = {}
        if cfg.eval.prompts:  # the held-out evaluation decodes with the target
            require_decodable(text_cfg, "eval.prompts")
            self.eval_prompts, skipped_prompts = load_prompts(cfg.eval.prompts, self.tokenizer, cfg.eval)
        self.run_dir = make_dir(Path(cfg.train.out_dir))
        self.show_console = show_console
        torch.manual_seed(cfg.train.seed)

        self.pending_notes: list[tuple[str, str, str]] = []  # (code, severity, message) until run_start
        self.log_open = False  # run_start written: a note goes straight into the log
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints", cfg.train.keep_last, self.rank,
                                         self.dp.ckpt_group)
        resume_from = self.checkpointer.newest(self.warn_damaged) if resume else None
        d = cfg.drafter
        layer_ids = d.tap_layers(text_cfg.num_hidden_layers)
        if skipped_prompts:
            self.note("eval_prompts_skipped", "warning", f"held-out prompt lines skipped "
                      f"({skip_counts(skipped_prompts)}); {len(self.eval_prompts)} kept")
        if text_cfg.num_hidden_layers - 1 in layer_ids:
            self.note("last_layer_tap", "warning",
                f"drafter.target_layer_ids taps the target's last layer ({text_cfg.num_hidden_layers - 1}): serving "
                "engines read it differently (vLLM before the final norm, as blockdraft trains; z-lab's reference "
                "and transformers' hidden_states[-1] after it; SGLang not at all); the default rule stops at L-3")
        mask_id, mask_note = resolve_mask_token(self.tokenizer, text_cfg.vocab_size,
                                                bool(getattr(text_cfg, "tie_word_embeddings", False)), d.mask_token_id)
        if mask_note:
            self.note("mask_token_chosen", "info", mask_note)
        with distributed.main_rank_first(self.dp.is_main):
            self.dataset, self.data_report = prepare_dataset(cfg.data, self.tokenizer)

        self.target, _, _ = load_target(folder, layer_ids, self.device, cfg.target.dtype)
        dcfg = drafter_config(text_cfg, d.num_layers, d.block_size, layer_ids, mask_id, d.intermediate_size,
                              self.target.embedding_scale)
        self.drafter = DFlashDrafter(dcfg).to(self.device)
        if d.init_from_target:
            init_from_target(self.drafter, self.target.decoder_layers, self.target.backbone.norm)
        if cfg.train.fp8_linears:
            to_fp8_linears(self.drafter)
        # wrapped before the optimizer is built (FSDP2 swaps the parameters) and before the step runner
        module, defer_sync = distributed.wrap(DraftForward(self.drafter), cfg.train.parallel, self.dp, self.device)
        self.hot = HotPath(self.target, self.drafter, cfg, self.device, module=module, defer_sync=defer_sync)
        if self.hot.flex_note:
            self.note("flex_backend_fallback", "warning", self.hot.flex_note)
        # one scan of the loss mask, for the batch costs and the warm-up's block counts
        self.anchor_scan = anchor_candidates(self.dataset, d.block_size)  # (candidates, their position sums)
        self.sampler = BatchSampler(self.dataset.lengths, cfg.data, seed=cfg.train.seed, rank=self.rank,
                                    world_size=self.world, grad_accum=cfg.train.grad_accum,
                                    costs=dataset_costs(self.dataset, text_cfg, cfg, layer_ids, self.anchor_scan))
        self.total_steps = total_updates(cfg.train.max_steps, cfg.train.epochs, self.sampler.updates_per_epoch)
        self.warmup_steps = warmup_updates(cfg.optim.warmup_steps, cfg.optim.warmup_ratio, self.total_steps)
        self.optimizer = build_optimizer(self.drafter.parameters(), cfg.optim, self.device)
        # the run's passes, for the block classes (fitted before the prefetcher packs a batch) and the warm-up
        self.plan = RunPlan.of(self.dataset, self.sampler, dataset_blocks(self.dataset, cfg, self.anchor_scan),
                               math.ceil(self.total_steps / self.sampler.updates_per_epoch)) \
            if self.hot.shapes is not None else None
        if self.plan is not None:
            self.hot.fit_shapes(self.plan)
        self.prefetcher = Prefetcher(self.dataset, self.sampler, depth=cfg.data.prefetch_depth,
                                     pin_memory=self.device.type == "cuda", prepare=self.hot.prepare)

        self.state = TrainState()
        self.feed = DataFeed(self.prefetcher, self.sampler, self.world, cfg.train.grad_accum, self.hot.to_device)
        self.guard = StepGuard(cfg.guard)
        self.budget = TimeBudgetHook(self, cfg.train.max_minutes)
        self.saves = SaveHook(self)
        self.hooks: list[Hook] = [self.budget, self.saves, GuardHook(self), EvalHook(self)]
        if self.dp.is_main:  # only rank 0 writes the run folder's files and the console
            self.hooks.append(LiveDoctorHook(self))
        self.parts = {"train": self.state, "data": self.feed, "rng": RngState(self.device), "guard": self.guard,
                      "budget": self.budget}  # what a checkpoint holds besides the weights
        self.resumed_from: int | None = None
        if resume_from is not None:
            self.restore(resume_from)
            self.resumed_from = self.step
        self.stop_reason: str | None = None  # set by a signal: every rank stops after the same update
        self.last_eval: dict[str, Any] | None = None

    @property
    def step(self) -> int:
        return self.state.step

    def note(self, code: str, severity: str, message: str) -> None:
        """A `warning` record for the log (held until run_start is written at start-up) and a line on stderr."""
        if self.log_open:
            self.log.write("warning", self.step, code=code, severity=severity, message=message)
        else:
            self.pending_notes.append((code, severity, message))
        if self.dp.is_main:
            print(f"{severity}: {message}", file=sys.stderr)

    def warn_damaged(self, message: str) -> None:
        """A damaged checkpoint passed over (at start-up, or in a rollback)."""
        self.note("checkpoint_damaged", "warning", message)

    def shorten_schedule(self, total_steps: int) -> None:
        """A shorter schedule from the time budget; the warmup already under way keeps its length."""
        self.total_steps = total_steps
        self.warmup_steps = min(self.warmup_steps, max(1, total_steps // 2))

    # ---- state -------------------------------------------------------------------------------------
    def live_state(self) -> dict[str, dict[str, Any]]:
        return distributed.state_dicts(self.drafter, self.optimizer)

    def restore(self, ckpt: LoadedCheckpoint) -> None:
        missing = sorted(set(self.parts) - set(ckpt.trainer_state))
        if missing:
            raise UserError(f"checkpoint {ckpt.path} has no {', '.join(missing)} state: written by an older blockdraft")
        distributed.load_weights(self.drafter, self.optimizer, ckpt)
        for name, part in self.parts.items():
            part.load_state_dict(ckpt.trainer_state[name])

    # ---- one update --------------------------------------------------------------------------------
    def train_step(self, micro_batches: list[Batch]) -> dict[str, Any]:
        """One update over the micro-batches, unless the guard refuses it: then weights, Adam moments
        and Adam's step count stay as they were and `self.step` (hence the LR schedule) does not move."""
        cfg, k = self.cfg, self.step + 1
        self.drafter.train()
        lr = lr_at(k, cfg.optim, self.total_steps, self.warmup_steps)
        noise_std = noise_std_at(k, cfg.noise, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        metrics = summarize(*self.hot.update_figures(micro_batches, k, self.rank, noise_std))  # the guard reads these
        grad_norm = metrics["grad_norm"]
        # the whole update's buckets: every rank keys the guard alike, so all apply or skip the update
        buckets = distributed.rank_major([mb.bucket for mb in micro_batches], self.device)
        reason = self.guard.check(max(buckets), metrics["loss"], grad_norm, [mb.batch_id for mb in micro_batches])
        if reason is None:
            self.optimizer.step()
            self.state.step = k
        self.optimizer.zero_grad(set_to_none=True)
        return {
            "lr": lr,
            **metrics,
            "clipped": clipped(grad_norm, cfg.optim.grad_clip),
            "skipped": reason is not None,
            "skip_reason": reason,
            "noise_std": noise_std,
            "buckets": buckets,
        }

    def step_once(self) -> StepEnd:
        """Micro-batches, the update, its `step` record; whether the run stops after it."""
        t0 = time.time()
        micro = self.feed.next_update(self._skip_listed)
        data_wait = time.time() - t0
        rec = self.train_step(micro)
        step_time = time.time() - t0
        out_of_time = self.deadline is not None and time.time() > self.deadline
        # one all-reduce: the update's counts over all ranks, and whether a rank must stop (a signal
        # or the clock seen by one rank stops all of them after the same update)
        signalled, timed_out, tokens, padded, samples = distributed.sum_over_ranks(
            [self.stop_reason is not None, out_of_time, sum(mb.real_tokens for mb in micro),
             sum(mb.padded_tokens for mb in micro), sum(len(mb.sample_ids) for mb in micro)], self.device)
        last = micro[-1]
        if not rec["skipped"]:
            self.state.tokens += tokens
            self.state.epoch = last.epoch
        rec.update(
            epoch=last.epoch, epoch_progress=last.epoch_progress, progress=self.step / self.total_steps,
            samples=samples, tokens=tokens, pad_frac=1.0 - tokens / max(padded, 1),
            seq_len_max=max(int(mb.input_ids.shape[1]) for mb in micro),
            step_time=step_time, data_wait=data_wait, queue_depth=self.prefetcher.queue_depth,
            tok_per_s=tokens / max(step_time, 1e-9), mfu=None,
            mem_gb=torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
            graphs_compiled=graphs_compiled(),
        )
        # a guarded step is logged under the update number it would have had
        self.console.step(self.log.write("step", self.step + rec["skipped"], **step_record(rec)))
        stop = None
        if signalled:
            stop = ("interrupted", self.stop_reason or "signal on another rank")
        elif timed_out:
            stop = ("completed", "max_minutes reached")
        return StepEnd(rec, micro, step_time, stop)

    def _warm_up(self) -> None:
        """The graphs of every pass shape the run's plan holds, compiled before update 1 (`HotPath.warm_up`)."""
        if not self.hot.warms_up:
            return
        t0 = time.time()
        batches = self.hot.warmup_batches(self.dataset, self.plan)
        passes = self.hot.warm_up(batches)
        if passes:
            self.log.write("warmup", self.step, passes=passes, seconds=time.time() - t0,
                           graphs_compiled=graphs_compiled())

    def _skip_listed(self, batch: Batch) -> None:
        self.log.write("skip", self.step + 1, reason="skip_list", batch_ids=[batch.batch_id], bucket=batch.bucket,
                       loss=None, grad_norm=None)

    def evaluate(self) -> ModeResult:
        """Speculative decoding on the held-out prompts. Every rank runs the same evaluation (no rank
        waits for another; rank 0 logs it); under FSDP2 with a whole drafter gathered from the shards, with
        FP8 linears on a plain copy, which decodes as the export will."""
        ev = self.cfg.eval
        drafter = self.drafter
        sharded = self.dp.distributed and self.cfg.train.parallel == "fsdp"
        if sharded or self.cfg.train.fp8_linears:
            state = distributed.full_drafter_state(self.drafter) if sharded else self.drafter.state_dict()
            drafter = DFlashDrafter(self.drafter.config).to(self.device)
            drafter.load_state_dict(state)
        (path,), _ = evaluate_modes(self.target, drafter, self.eval_prompts, ev.max_new_tokens,
                                    self.tokenizer.eos_token_id, budgets=[], batch_size=ev.batch_size)
        return path

    # ---- the run -----------------------------------------------------------------------------------
    def _open_run(self) -> None:
        """config.yaml, the console and the log (rank 0's; the others write to /dev/null), the hooks'
        start, then the records every run begins with."""
        cfg, main = self.cfg, self.dp.is_main
        if main:
            (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        self.console = TrainConsole(self.total_steps, cfg.train.epochs if not cfg.train.max_steps else 0,
                                    enabled=self.show_console and main, log_every_s=cfg.train.log_every_s)
        self.log = RunLog(self.run_dir / "log.jsonl" if main else Path(os.devnull),
                          sinks=open_trackers(cfg.train.trackers, self.run_dir) if main else ())
        self.started = time.time()
        self.deadline = self.started + cfg.train.max_minutes * 60 if cfg.train.max_minutes else None
        for hook in self.hooks:
            hook.on_start()
        self.log.write(
            "run_start", self.step, schema=SCHEMA, config=cfg.model_dump(mode="json"),
            versions={"blockdraft": __version__, "torch": torch.__version__, "python": platform.python_version()},
            world_size=self.world, device=str(self.device), flex_backend=self.hot.flex_backend,
            resumed_from=self.resumed_from,
            total_steps=self.total_steps, warmup_steps=self.warmup_steps,
            batches_per_epoch=self.sampler.updates_per_epoch,
            drafter_params=sum(p.numel() for p in self.drafter.parameters()),
            target_layer_ids=self.drafter.target_layer_ids, mask_token_id=self.drafter.mask_token_id,
        )
        self.log.write("data", self.step, **data_record(self.data_report, self.sampler))
        self.log_open = True
        for code, severity, message in self.pending_notes:
            self.log.write("warning", self.step, code=code, severity=severity, message=message)
        if self.feed.world_note:
            self.log.write("warning", self.step, code="world_size_changed", severity="info",
                           message=self.feed.world_note)

    def run(self) -> RunResult:
        self._open_run()
        status, reason = "completed", None
        try:
            with self.console, StopOnSignal(self):
                self._warm_up()
                while self.step < self.total_steps:
                    end = self.step_once()
                    for hook in self.hooks:
                        hook.on_step_end(end)
                    if end.stop:
                        status, reason = end.stop
                        break
                for hook in self.hooks:
                    hook.on_end()
        except BaseException as exc:
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            self.log.write("run_end", self.step, status=status, reason=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.prefetcher.close()
        self.log.write("run_end", self.step, status=status, reason=reason, elapsed_s=time.time() - self.started)
        self.log.close()
        return RunResult(self.run_dir, self.step, status, self.last_eval)
