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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blockdraft import __version__
from blockdraft.config import Config, default_layer_ids, dump_config, total_warmup_steps
from blockdraft.data import Batch, BatchSampler, Prefetcher, prepare_dataset
from blockdraft.evaluate.prompts import heldout_prompts
from blockdraft.evaluate.speculative import measure_tau
from blockdraft.model.drafter import DFlashDrafter, drafter_config, init_from_target
from blockdraft.model.masks import dense_mask, flex_block_mask
from blockdraft.model.target import find_mask_token_id, load_target
from blockdraft.telemetry.console import TrainConsole
from blockdraft.telemetry.log import SCHEMA, RunLog
from blockdraft.train.blocks import Blocks, sample_blocks
from blockdraft.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from blockdraft.train.loss import MicroStats, add_stats, block_loss, denominator, summarize
from blockdraft.train.schedule import build_optimizer, lr_at, noise_std_at


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from blockdraft.errors import UserError

        raise UserError("train.device=cuda but no CUDA device is visible")
    return torch.device(name)


def step_generator(seed: int, step: int, rank: int, micro: int, device: torch.device) -> torch.Generator:
    """A stateless per-(step, rank, micro-batch) RNG: resuming at step k replays the same anchors/noise."""
    g = torch.Generator(device=device)
    g.manual_seed(((seed * 1_000_003 + step) * 1_009 + rank) * 1_013 + micro)
    return g


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
        self.run_dir = Path(cfg.train.out_dir)
        self.ckpt_root = self.run_dir / "checkpoints"
        self.show_console = show_console
        self.use_bf16 = cfg.train.precision == "bf16" and self.device.type == "cuda"
        torch.manual_seed(cfg.train.seed)

        resume_from = resolve_checkpoint(self.ckpt_root) if resume and self._has_checkpoint() else None
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
        self.resumed_from: int | None = None
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_prompts = heldout_prompts(cfg.eval, tokenizer) if cfg.eval.prompts else []
        self._stop_reason: str | None = None

    def _has_checkpoint(self) -> bool:
        return any(p.name.startswith("step-") for p in self.ckpt_root.glob("step-*"))

    # ---- state -------------------------------------------------------------------------------------
    def _restore(self, path: Path) -> None:
        ckpt = load_checkpoint(path)
        self.drafter.load_state_dict(ckpt.drafter_state)
        self.optimizer.load_state_dict(ckpt.optimizer_state)
        state = ckpt.trainer_state
        self.step = int(state["step"])
        self.prefetcher.load_state_dict(state["data"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(tuple(state["rng"]["numpy"]))
        random.setstate(tuple(state["rng"]["python"]))
        self.resumed_from = self.step

    def save(self) -> dict[str, Any]:
        t0 = time.time()
        rng = {"torch": torch.get_rng_state(), "numpy": list(np.random.get_state()), "python": list(random.getstate())}
        rng["numpy"][1] = torch.from_numpy(rng["numpy"][1].astype(np.int64))
        saved = save_checkpoint(
            self.ckpt_root,
            self.step,
            {k: v.detach().cpu() for k, v in self.drafter.state_dict().items()},
            self.drafter.config.to_dict(),
            self.optimizer.state_dict(),
            {"step": self.step, "data": self.prefetcher.state_dict(), "rng": rng},
            {"step": self.step, "total_steps": self.total_steps, "config": self.cfg.model_dump(mode="json")},
            self.cfg.train.keep_last,
        )
        return {"path": str(saved.path), "stall_s": time.time() - t0, "write_s": saved.write_s,
                "bytes": saved.bytes, "committed": True}

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
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step = k
        metrics = summarize(total)
        grad_norm = float(grad_norm)
        return {
            "lr": lr,
            **metrics,
            "grad_norm": grad_norm,
            "clipped": grad_norm > cfg.optim.grad_clip,
            "skipped": False,
            "skip_reason": None,
            "noise_std": noise_std,
            "anchors": int(sum(int(b.valid.sum()) for b in blocks)),
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
        log.write("data", self.step, **self.data_report.as_record(), **self.sampler.describe())

    def evaluate(self) -> dict[str, Any]:
        ev = self.cfg.eval
        report = measure_tau(self.target, self.drafter, self.eval_prompts, ev.max_new_tokens,
                             self.tokenizer.eos_token_id, compare_with_target=True)
        return {"tau": report.tau, "tau_hist": report.tau_hist, "prompts": report.prompts, "mode": "path",
                "budget": None, "tokens": report.tokens, "speedup": report.speedup, "lossless": report.lossless}

    def _on_signal(self, signum, _frame) -> None:
        if self._stop_reason is not None:
            raise KeyboardInterrupt
        self._stop_reason = signal.Signals(signum).name

    def run(self) -> RunResult:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        log = RunLog(self.run_dir / "log.jsonl")
        self._record_start(log)
        handlers = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        t_start, last_eval, status, reason = time.time(), None, "completed", None
        console = TrainConsole(self.total_steps, cfg.train.epochs if not cfg.train.max_steps else 0,
                               enabled=self.show_console)
        try:
            with console:
                while self.step < self.total_steps:
                    t0 = time.time()
                    micro = [self._to_device(self.prefetcher.next()) for _ in range(cfg.train.grad_accum)]
                    data_wait = time.time() - t0
                    rec = self.train_step(micro)
                    step_time = time.time() - t0
                    tokens = sum(mb.real_tokens for mb in micro)
                    padded = sum(mb.padded_tokens for mb in micro)
                    last = micro[-1]
                    progress = self.step / self.total_steps
                    rec.update(
                        epoch=last.epoch, epoch_progress=last.epoch_progress, progress=progress,
                        samples=sum(len(mb.sample_ids) for mb in micro), tokens=tokens,
                        pad_frac=1.0 - tokens / max(padded, 1), buckets=[mb.bucket for mb in micro],
                        seq_len_max=max(int(mb.input_ids.shape[1]) for mb in micro),
                        step_time=step_time, data_wait=data_wait, queue_depth=self.prefetcher.queue_depth,
                        tok_per_s=tokens / max(step_time, 1e-9), mfu=None,
                        mem_gb=torch.cuda.max_memory_allocated() / 2**30 if self.device.type == "cuda" else None,
                    )
                    console.step(log.write("step", self.step, **rec))
                    out_of_time = cfg.train.max_minutes and time.time() - t_start > cfg.train.max_minutes * 60
                    if self._stop_reason or out_of_time:
                        status = "interrupted" if self._stop_reason else "completed"
                        reason = self._stop_reason or "max_minutes reached"
                        break
                    if self.step % cfg.train.save_every == 0 and self.step < self.total_steps:
                        info = self.save()
                        log.write("checkpoint", self.step, **info)
                        console.note(f"checkpoint {info['path']} ({info['stall_s']:.1f}s)", style="dim")
                    if cfg.train.eval_every and self.eval_prompts and self.step % cfg.train.eval_every == 0:
                        last_eval = self.evaluate()
                        log.write("eval", self.step, **last_eval, tau_est_train=rec["tau_est"])
                        console.note(f"eval tau {last_eval['tau']:.2f} on {last_eval['prompts']} prompts",
                                     style="cyan")
            info = self.save()
            log.write("checkpoint", self.step, **info)
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
