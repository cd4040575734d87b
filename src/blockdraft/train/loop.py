"""The training loop: config in, run folder out.

Per optimizer update k (1-based):
  take grad_accum micro-batches -> sample anchors for each (seeded by (seed, k, rank, micro): a
  resume replays identical anchors) -> D = static label weight over the whole step ->
  per micro-batch: target taps (no grad) -> fuse (+ noise) -> drafter -> chunked loss / D -> backward
  -> clip -> AdamW at lr_at(k) -> one `step` record -> checkpoint / eval when due.
"""

from __future__ import annotations

import dataclasses
import math
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
from blockdraft.data import Batch, BatchSampler, Prefetcher, data_record, prepare_dataset
from blockdraft.doctor.live import LiveDoctor
from blockdraft.errors import UserError, make_dir
from blockdraft.evaluate.prompts import heldout_prompts
from blockdraft.evaluate.runner import evaluate as evaluate_modes
from blockdraft.model.drafter import DFlashDrafter, drafter_config, init_from_target
from blockdraft.model.masks import dense_mask, flex_block_mask
from blockdraft.model.target import find_mask_token_id, load_target
from blockdraft.telemetry.console import TrainConsole
from blockdraft.telemetry.log import SCHEMA, RunLog
from blockdraft.train.blocks import Blocks, sample_blocks
from blockdraft.train.checkpoint import (
    AsyncCheckpointer,
    LoadedCheckpoint,
    Snapshot,
    Stager,
    committed_checkpoints,
    load_checkpoint,
)
from blockdraft.train.guard import StepGuard, batch_id
from blockdraft.train.loss import MicroStats, add_stats, block_loss, denominator, summarize
from blockdraft.train.schedule import build_optimizer, lr_at, noise_std_at


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device=cuda but no CUDA device is visible")
    return torch.device(name)


def step_generator(seed: int, step: int, rank: int, micro: int, device: torch.device) -> torch.Generator:
    """A stateless per-(step, rank, micro-batch) RNG: resuming at step k replays the same anchors/noise."""
    g = torch.Generator(device=device)
    g.manual_seed(((seed * 1_000_003 + step) * 1_009 + rank) * 1_013 + micro)
    return g


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
        self.device = pick_device(cfg.train.device)
        self.rank, self.world = 0, 1
        self.run_dir = make_dir(Path(cfg.train.out_dir))
        self.ckpt_root = self.run_dir / "checkpoints"
        self.show_console = show_console
        self.use_bf16 = cfg.train.precision == "bf16" and self.device.type == "cuda"
        torch.manual_seed(cfg.train.seed)

        self._startup_warnings: list[str] = []
        resume_from = self._newest_readable_checkpoint() if resume else None
        _, tokenizer, hf_cfg = load_target(cfg.target.path, None, self.device)
        self.tokenizer = tokenizer
        self.dataset, self.data_report = prepare_dataset(cfg.data, tokenizer)

        d = cfg.drafter
        layer_ids = d.target_layer_ids or default_layer_ids(hf_cfg.num_hidden_layers, d.num_taps)
        self.target, _, _ = load_target(cfg.target.path, layer_ids, self.device, cfg.target.dtype)
        mask_id = find_mask_token_id(tokenizer, self.target.embed_tokens.weight.shape[0], d.mask_token_id)
        dcfg = drafter_config(hf_cfg, d.num_layers, d.block_size, layer_ids, mask_id, d.intermediate_size)
        self.drafter = DFlashDrafter(dcfg).to(self.device)
        if d.init_from_target:
            init_from_target(self.drafter, self.target.decoder_layers, self.target.backbone.norm)
        self.sampler = BatchSampler(self.dataset.lengths, cfg.data, seed=cfg.train.seed, rank=self.rank,
                                    world_size=self.world)
        per_epoch = max(1, self.sampler.batches_per_epoch // cfg.train.grad_accum)
        self.total_steps = cfg.train.max_steps or max(1, math.ceil(cfg.train.epochs * per_epoch))
        self.warmup_steps = total_warmup_steps(cfg.optim, self.total_steps)
        self.optimizer = build_optimizer(self.drafter.parameters(), cfg.optim, self.device)
        self.prefetcher = Prefetcher(self.dataset, self.sampler, depth=cfg.data.prefetch_depth,
                                     pin_memory=self.device.type == "cuda")
        self.step = 0
        self.guard = StepGuard(cfg.guard)
        self.skip_list: set[str] = set()
        self._skipped_run: list[str] = []  # batch ids of the current run of consecutive guarded steps
        self.stager = Stager()
        self.checkpointer = AsyncCheckpointer(self.ckpt_root, cfg.train.keep_last)
        self.resumed_from: int | None = None
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_prompts = heldout_prompts(cfg.eval, tokenizer) if cfg.eval.prompts else []
        self._stop_reason: str | None = None

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
        self.drafter.load_state_dict(ckpt.drafter_state)
        self.optimizer.load_state_dict(ckpt.optimizer_state)
        state = ckpt.trainer_state
        self.step = int(state["step"])
        self.prefetcher.load_state_dict(state["data"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(tuple(state["rng"]["numpy"]))
        random.setstate(tuple(state["rng"]["python"]))
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        self.skip_list = set(state.get("skip_list", []))
        self.resumed_from = self.step

    def snapshot(self) -> Snapshot:
        """A consistent copy of the training state in host memory, taken between two updates."""
        rng = {"torch": torch.get_rng_state(), "numpy": list(np.random.get_state()), "python": list(random.getstate())}
        rng["numpy"][1] = torch.from_numpy(rng["numpy"][1].astype(np.int64))
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        trainer_state = {"step": self.step, "data": self.prefetcher.state_dict(), "rng": rng,
                         "skip_list": sorted(self.skip_list)}
        return Snapshot(
            self.step,
            self.stager.stage(self.drafter.state_dict()),
            self.drafter.config.to_dict(),
            self.stager.stage(self.optimizer.state_dict()),
            trainer_state,
            {"step": self.step, "total_steps": self.total_steps, "skip_list": sorted(self.skip_list),
             "config": self.cfg.model_dump(mode="json")},
        )

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

    def _to_device(self, batch: Batch) -> Batch:
        """Pinned host tensors -> device, asynchronously (the copy overlaps the previous step's tail)."""
        move = {f: getattr(batch, f).to(self.device, non_blocking=True) for f in ("input_ids", "loss_mask", "lengths")}
        return dataclasses.replace(batch, **move)

    # ---- one update --------------------------------------------------------------------------------
    def _forward_micro(self, batch: Batch, blocks: Blocks, noise_std: float, gen: torch.Generator) -> MicroStats:
        cfg, n = self.cfg, batch.input_ids.shape[0]
        ids = batch.input_ids
        t = ids.shape[1]
        need_final = cfg.loss.kl_weight > 0 or cfg.loss.labels == "target"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16):
            taps, final = self.target.features(ids, final_hidden=need_final)
            ctx = self.drafter.fuse(taps)  # [n, T, H]
            if noise_std > 0:
                ctx = ctx + noise_std * torch.randn(ctx.shape, generator=gen, device=ctx.device, dtype=ctx.dtype)
            a, b = blocks.tokens.shape[1:]
            embeds = self.target.embed_tokens(blocks.tokens.view(n, a * b))  # [n, Q, H]
            if self.device.type == "cuda":
                mask = flex_block_mask(blocks.anchors, t, b)
            else:
                mask = dense_mask(blocks.anchors, t, b)
            ctx_pos = torch.arange(t, device=ids.device).expand(n, t)
            hidden = self.drafter(embeds, blocks.positions.view(n, a * b), ctx, ctx_pos, mask)
            hidden = hidden.view(n, a, b, -1)[:, :, 1:]  # [n, A, B-1, H]: position 0 has no loss
            target_hidden = None
            if need_final:
                before = blocks.positions[:, :, :-1].clamp(max=t - 1)  # the target predicts x_{p+1} at p
                target_hidden = torch.gather(
                    final, 1, before.reshape(n, -1, 1).expand(-1, -1, final.shape[-1])
                ).view(n, a, b - 1, -1)
            return block_loss(hidden, self.target.lm_head.weight, blocks.labels, blocks.label_mask,
                              blocks.valid, cfg.loss, target_hidden)

    def train_step(self, micro_batches: list[Batch]) -> dict[str, Any]:
        """One update over the micro-batches, unless the guard refuses it: then weights, Adam moments
        and Adam's step count stay as they were and `self.step` (hence the LR schedule) does not move."""
        cfg, k = self.cfg, self.step + 1
        self.drafter.train()
        blocks, gens = [], []
        for i, mb in enumerate(micro_batches):
            g = step_generator(cfg.train.seed, k, self.rank, i, self.device)
            blocks.append(sample_blocks(mb.input_ids, mb.loss_mask, mb.lengths, cfg.drafter.block_size,
                                        cfg.train.num_anchors, self.drafter.mask_token_id, g))
            gens.append(g)
        denom = sum(denominator(b.label_mask, cfg.loss) for b in blocks).clamp(min=1e-6)
        lr = lr_at(k, cfg.optim, self.total_steps, self.warmup_steps)
        noise_std = noise_std_at(k, cfg.noise, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total: MicroStats | None = None
        for mb, bl, g in zip(micro_batches, blocks, gens, strict=True):
            stats = self._forward_micro(mb, bl, noise_std, g)
            (stats.weighted_loss / denom).backward()
            total = add_stats(total, stats)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), cfg.optim.grad_clip)
        metrics = summarize(total, grad_norm)  # the step's one host sync; the guard decides on these floats
        grad_norm = metrics["grad_norm"]
        bucket = max(mb.bucket for mb in micro_batches)
        reason = self.guard.check(bucket, metrics["loss"], grad_norm)
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
        ev = self.cfg.eval
        (path,), _ = evaluate_modes(self.target, self.drafter, self.eval_prompts, ev.max_new_tokens,
                                    self.tokenizer.eos_token_id, budgets=[])
        return {"tau": path.tau, "tau_hist": path.tau_hist, "prompts": len(self.eval_prompts), "mode": "path",
                "budget": None, "tokens": path.tokens, "speedup": path.speedup, "lossless": path.lossless}

    def _on_signal(self, signum, _frame) -> None:
        if self._stop_reason is not None:
            raise KeyboardInterrupt
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
            micro.append(self._to_device(batch))
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
        self.guard.consecutive = 0
        ckpt = self._newest_readable_checkpoint()
        if ckpt is not None:
            self._restore(ckpt)
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
        (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        console = TrainConsole(self.total_steps, cfg.train.epochs if not cfg.train.max_steps else 0,
                               enabled=self.show_console)
        log = RunLog(self.run_dir / "log.jsonl", watcher=live_doctor(console))
        self._record_start(log)
        for message in self._startup_warnings:
            log.write("warning", self.step, code="checkpoint_damaged", severity="warning", message=message)
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
                    tokens = sum(mb.real_tokens for mb in micro)
                    padded = sum(mb.padded_tokens for mb in micro)
                    last = micro[-1]
                    rec.update(
                        epoch=last.epoch, epoch_progress=last.epoch_progress, progress=self.step / self.total_steps,
                        samples=sum(len(mb.sample_ids) for mb in micro), tokens=tokens,
                        pad_frac=1.0 - tokens / max(padded, 1), buckets=[mb.bucket for mb in micro],
                        seq_len_max=max(int(mb.input_ids.shape[1]) for mb in micro),
                        step_time=step_time, data_wait=data_wait, queue_depth=self.prefetcher.queue_depth,
                        tok_per_s=tokens / max(step_time, 1e-9), mfu=None,
                        mem_gb=torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
                    )
                    # a guarded step is logged under the update number it would have had
                    console.step(log.write("step", self.step + rec["skipped"], **rec))
                    self.report_saves(log, console)
                    if rec["skipped"]:
                        self._guarded(log, console, rec, micro)
                    else:
                        self._skipped_run.clear()
                    out_of_time = cfg.train.max_minutes and time.time() - t_start > cfg.train.max_minutes * 60
                    if self._stop_reason or out_of_time:
                        status = "interrupted" if self._stop_reason else "completed"
                        reason = self._stop_reason or "max_minutes reached"
                        break
                    if rec["skipped"]:
                        continue
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
            status, reason = "failed", f"{type(exc).__name__}: {exc}"
            log.write("run_end", self.step, status=status, reason=reason)
            raise
        finally:
            self.prefetcher.close()
            for s, h in handlers.items():
                signal.signal(s, h)
        log.write("run_end", self.step, status=status, reason=reason, elapsed_s=time.time() - t_start)
        log.close()
        return RunResult(self.run_dir, self.step, status, last_eval)
