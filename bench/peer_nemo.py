"""A peer trainer's DFlash hot path on the shapes and length profiles of `blockdraft bench`: NeMo AutoModel.

Issue 19 sets its throughput targets as ratios to NeMo AutoModel 0.7.0's DFlash trainer, so this runs
that trainer's own step (its `HFDFlashTargetModel` target forward, `DFlashTrainerModule` forward with
its anchor sampling, mask, drafter and decay loss, backward, grad clipping, AdamW) on a random target
of a `--target-shape`, the drafter shape of the blockdraft config, and the `blockdraft bench` length
profiles (synthetic `full` and `mix`, or `data`: the `--data` files, tokenised with the `--target`
folder's tokenizer, the same samples as ours), in each of its three padding modes:

  pad-max      every sample padded to --seq-len (its dataloader's padding="max_length", the default)
  pad-longest  the micro-batch's samples padded to its longest, then its _stack_batch (its SFT loaders'
               padding="longest"; the DFlash dataloader itself offers only max_length and packing)
  pack         its sequence packing (recipe_args.packed_sequence_size = --seq-len): samples packed
               greedily into --seq-len rows (build_packed_eagle3_dataset, _pack_collate)

A micro-batch is --micro-batch rows (samples, or packed rows) and an update `train.grad_accum`
micro-batches, as in its recipe. Samples are taken epoch after epoch, each cut to --seq-len as its
ChatDataset cuts them: a user's data shuffled each epoch, as its loader (shuffle=True) draws it;
synthetic samples, already in random order, as they are. Its anchor rule
(DFlashTrainerModule._sample_anchor_positions): per ROW, min(num_anchors, v) anchors drawn uniformly
among the v positions a <= width - B with loss_mask[a] = 1, in pack mode also with B - 1 more real
tokens of its document after a. So a packed row of several samples gets num_anchors blocks in all,
not num_anchors per sample.

Reported as `blockdraft bench --json` does, with the same field names (measure.summarize_rows):
tokens_per_s (median update, real tokens), tokens_per_s_wall, blocks_per_s and blocks_per_1k_tokens
(supervised blocks: NeMo's own valid_blocks), mfu (useful work by blockdraft.model.flops, as ours:
real tokens, the target up to its last tap; NeMo also runs the target's remaining layers, its
lm_head, and the padding, which are not counted), peak memory. data_wait_share is its collate,
which its loader runs in the training process (num_workers=0 by default). --ours also runs
`blockdraft bench` in the same process (after NeMo, with the same arguments) and adds the ratios.

Compile settings are its recipe's defaults: no `compile:` block, so the drafter and target run eager;
flex attention goes through transformers' torch.compile(flex_attention) (default dynamic: a new shape
compiles once more, marked dynamic, within torch's recompile limit) and NeMo's compiled (dynamic=True)
create_block_mask. Its target is Hugging Face's Qwen3ForCausalLM with sdpa (its `target_force_hf`
path: its own Qwen3 uses the same sdpa and torch kernels when transformer-engine is absent).

Only the modules of that hot path are imported, from the wheel installed with --no-deps: its package
__init__s (megatron-fsdp, datasets, ...) are not executed (`load_nemo`).

GPU (one H200; the carried folder .whl/ holds the nemo_automodel wheel; bench/README.md: one call
per length profile keeps each under the 10-minute limit):
  python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
  PYTHONPATH=src:/tmp/site python3 bench/peer_nemo.py --target-shape qwen3-8b --lengths mix \\
      --modes pad-longest,pack --ours --json
CPU smoke run:
  PYTHONPATH=src:/tmp/nemo-site python bench/peer_nemo.py --target-shape tiny --seq-len 256 \\
      --mix-median 120 --steps 3 --warmup 1 --ours --no-check drafter.num_layers=2 drafter.block_size=8
On your own training files (the data profile; a target folder with its tokenizer):
  PYTHONPATH=src:/tmp/site python3 bench/peer_nemo.py --target DIR --modes pad-longest,pack --ours --json \\
      --data chats.jsonl
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import statistics
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blockdraft.bench.datasets import UserData, bench_dataset, bench_profiles, prepare_user_data
from blockdraft.bench.measure import UpdateClock, nominal_peak, summarize_rows, synchronize
from blockdraft.cli import parse_with_overrides
from blockdraft.commands import bench as bench_command
from blockdraft.config import Config
from blockdraft.data.cache import Samples
from blockdraft.errors import UserError, exit_script
from blockdraft.model.flops import Dims, DraftWork, drafter_flops, target_flops
from blockdraft.model.target import resolve_mask_token, target_dtype
from blockdraft.telemetry.console import or_dash
from blockdraft.train.fp8 import require_fp8

MODES = ("pad-max", "pad-longest", "pack")
PAD_ID = 0  # any id: padding is masked out of the target's attention and of the loss
NEMO_GAMMA = 7.0  # its recipe's loss_decay_gamma default
NEMO_MAX_GRAD_NORM = 1.0  # its recipe's max_grad_norm default
NEMO_SHUFFLE_SEED = 42  # its recipe's shuffle_seed default
# Issue 19: ours over NeMo in the same call (tokens/s at full length, supervised blocks/s on the mix).
TARGETS = {("full", "pad-max", "tokens_per_s"): 1.6, ("mix", "pad-longest", "blocks_per_s"): 2.5,
           ("mix", "pack", "blocks_per_s"): 1.5}

_NEMO_PACKAGES = ("", ".components", ".components.attention", ".components.loss", ".components.datasets",
                  ".components.datasets.llm", ".components.speculative", ".components.speculative.dflash")
# Modules that the loaded files import at top level for functions the hot path never calls: stood in
# for while loading (a third-party one only when absent), then removed from sys.modules again.
_STAND_INS = {
    "datasets": ("Dataset", "DatasetDict"),  # packed_sequence.py: pack_dataset and friends
    "nemo_automodel.components.datasets.llm.chat_dataset": ("ChatDataset",),  # eagle3.py: its dataloader
}


@functools.cache
def load_nemo() -> types.SimpleNamespace:
    """NeMo's DFlash modules, without executing the package __init__s above them (they import its
    heavy declared dependencies): each parent package is an empty module with the wheel's folder as
    its __path__, so only the files named here and their own imports run. Once a process: the empty
    modules left in sys.modules have no spec to find the wheel by again."""
    spec = importlib.util.find_spec("nemo_automodel")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("nemo_automodel is not importable: pip install --no-deps its wheel into a folder on "
                        "PYTHONPATH (bench/README.md)")
    root = Path(next(iter(spec.submodule_search_locations)))
    for suffix in _NEMO_PACKAGES:
        name = "nemo_automodel" + suffix
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*suffix.split(".")[1:]))]
            sys.modules[name] = package
    stood_in = []
    for name, attrs in _STAND_INS.items():
        if name not in sys.modules and (name.startswith("nemo_automodel.") or not _findable(name)):
            module = types.ModuleType(name)
            for attr in attrs:
                setattr(module, attr, type(attr, (), {}))
            sys.modules[name] = module
            stood_in.append(name)
    try:
        mods = {short: importlib.import_module(f"nemo_automodel.components.{path}") for short, path in (
            ("core", "speculative.dflash.core"), ("draft", "speculative.dflash.draft_qwen3"),
            ("target", "speculative.dflash.target"), ("eagle3", "datasets.llm.eagle3"))}
    finally:
        for name in stood_in:
            del sys.modules[name]
    return types.SimpleNamespace(**mods, root=root, stood_in=stood_in,
                                 version=importlib.metadata.version("nemo-automodel"))


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def pins() -> list[dict[str, Any]]:
    """Its declared (non-extra) requirements against what this environment has: what differs is part of
    the result."""
    from packaging.requirements import Requirement

    out = []
    for line in importlib.metadata.requires("nemo-automodel") or []:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        try:
            present = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            present = None
        out.append({"name": req.name, "declared": str(req.specifier) or "any", "present": present,
                    "ok": present is not None and req.specifier.contains(present, prereleases=True)})
    return out


@dataclass
class Shape:
    """The drafter of the blockdraft config, in NeMo's terms."""

    num_layers: int
    block_size: int
    layer_ids: list[int]
    num_anchors: int
    mask_token_id: int


def drafter_shape(cfg: Config, hf_cfg: Any, tokenizer: Any | None = None) -> Shape:
    """With a target folder's tokenizer, the mask token `blockdraft bench` and training pick from it."""
    d = cfg.drafter
    if d.intermediate_size is not None or d.init_from_target or cfg.train.anchors_per_token is not None:
        raise UserError("NeMo's DFlash drafter has no drafter.intermediate_size (it takes the target's), no "
                        "init_from_target and no train.anchors_per_token: leave them unset")
    tied = bool(getattr(hf_cfg, "tie_word_embeddings", False))
    mask, _ = resolve_mask_token(tokenizer, hf_cfg.vocab_size, tied, d.mask_token_id)
    return Shape(d.num_layers, d.block_size, d.tap_layers(hf_cfg.num_hidden_layers), cfg.train.num_anchors, mask)


@dataclass
class Micro:
    """One micro-batch of an update: its host and device tensors, what NeMo's loop logged, the anchors."""

    host: dict[str, torch.Tensor]
    batch: dict[str, torch.Tensor]
    logged: tuple[float, float, float, float, float] | None  # loss, accuracy, accept_len_sum, blocks, labels
    anchors: torch.Tensor | None
    keep: torch.Tensor | None

    @property
    def lengths(self) -> list[int]:
        """Real length of each sequence (each document of a packed row)."""
        attn = self.host["attention_mask"]
        if "doc_remaining" not in self.host:
            return attn.sum(1).tolist()
        starts = (self.host["position_ids"] == 0) & (attn == 1)
        return (self.host["doc_remaining"][starts] + 1).tolist()


class Peer:
    """NeMo's trainer pieces, built as its recipe builds them (TrainDFlashRecipe.setup), and its step."""

    def __init__(self, nemo: types.SimpleNamespace, hf_cfg, shape: Shape, cfg: Config, device: torch.device,
                 attention: str) -> None:
        from transformers import AutoModelForCausalLM

        dtype = target_dtype("auto", device)  # bf16 on a GPU: NeMo's compute_dtype and ours
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype, attn_implementation="sdpa")
        model.requires_grad_(False)
        self.target = nemo.target.HFDFlashTargetModel(model, target_layer_ids=shape.layer_ids)
        dflash_config = {"block_size": shape.block_size, "mask_token_id": shape.mask_token_id,
                         "target_layer_ids": shape.layer_ids, "output_multiplier": 1.0,
                         "final_logit_softcapping": None, "input_embedding_scale": 1.0}
        self.draft_config = nemo.draft.build_qwen3_dflash_draft_config(
            hf_cfg, num_draft_layers=shape.num_layers, num_target_layers=hf_cfg.num_hidden_layers,
            block_size=shape.block_size, dflash_config=dflash_config, attention_backend=attention)
        draft = nemo.draft.Qwen3DFlashDraftModel(self.draft_config).to(device=device, dtype=dtype)
        self.trainer = _recording(nemo.core.DFlashTrainerModule)(
            draft_model=draft, target_lm_head=model.get_output_embeddings(),
            target_embed_tokens=model.get_input_embeddings(), mask_token_id=shape.mask_token_id,
            block_size=shape.block_size, attention_backend=attention, num_anchors=shape.num_anchors,
            loss_decay_gamma=NEMO_GAMMA, loss_type="dflash").to(device)
        self.optimizer = torch.optim.AdamW([p for p in self.trainer.parameters() if p.requires_grad],
                                           lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                           weight_decay=cfg.optim.weight_decay)
        self.no_valid_anchors = nemo.core.NoValidAnchorsError
        self.hf_cfg, self.shape, self.device, self.grad_accum = hf_cfg, shape, device, cfg.train.grad_accum

    def features(self, batch: dict[str, torch.Tensor]):
        """Its frozen target forward: every layer and the lm_head, the tapped layers kept by hooks."""
        packing = {k: batch[k] for k in ("position_ids", "seq_lens", "doc_remaining") if k in batch}
        return self.target.generate_batch(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                          loss_mask=batch["loss_mask"], **packing)

    def update(self, host_batches: list[dict[str, torch.Tensor]]) -> list[Micro]:
        """One optimizer step over grad_accum micro-batches, as run_train_validation_loop does (its
        per-micro-batch .item() logging included, the LR scheduler's host-side multiplier left out)."""
        micro = []
        for host in host_batches:
            batch = {k: v.to(self.device, non_blocking=True) for k, v in host.items()}
            tb = self.features(batch)
            try:
                metrics = self.trainer(input_ids=tb.input_ids, hidden_states=tb.hidden_states,
                                       loss_mask=tb.loss_mask, position_ids=tb.position_ids, seq_lens=tb.seq_lens,
                                       doc_remaining=tb.doc_remaining)
            except self.no_valid_anchors:
                micro.append(Micro(host, batch, None, None, None))
                continue
            (metrics.loss / self.grad_accum).backward()
            logged = (metrics.loss.detach().item(), metrics.accuracy.detach().item(),
                      float(metrics.accept_len_sum), float(metrics.valid_blocks), float(metrics.valid_tokens))
            micro.append(Micro(host, batch, logged, *self.trainer.drawn))
        torch.nn.utils.clip_grad_norm_(self.trainer.parameters(), NEMO_MAX_GRAD_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return micro

    def context_seen(self, m: Micro) -> float:
        """Sum over its supervised blocks of the context positions each sees (its anchor's position in
        its document), for the drafter's FLOPs; NeMo's own target gathering decides supervision."""
        ids, mask = m.batch["input_ids"], m.batch["loss_mask"]
        _, _, block_mask = self.trainer._build_block_targets(ids, mask, m.anchors, m.keep, ids.shape[1])
        supervised = block_mask[:, :, 1:].sum(-1) > 0
        pos = m.batch.get("position_ids")
        at = m.anchors if pos is None else torch.gather(pos, 1, m.anchors)
        return float((at * supervised).sum())


def _recording(cls: type) -> type:
    class Recording(cls):
        """NeMo's trainer module, keeping the anchors it draws: the accounting reads them."""

        def _sample_anchor_positions(self, *args, **kwargs):
            self.drawn = super()._sample_anchor_positions(*args, **kwargs)
            return self.drawn

    return Recording


def sample_order(size: int, shuffle_seed: int | None) -> Iterator[int]:
    """Sample indices epoch after epoch: in dataset order, or shuffled each epoch (seeded)."""
    for epoch in itertools.count():
        yield from (range(size) if shuffle_seed is None else
                    np.random.default_rng((shuffle_seed, epoch)).permutation(size).tolist())


def micro_batches(mode: str, dataset: Samples, nemo: types.SimpleNamespace, seq_len: int, rows: int,
                  count: int, shuffle_seed: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """`count` micro-batches of `rows` rows, the samples in `sample_order`, each cut to `seq_len` (its
    ChatDataset's truncation), collated by NeMo's own collate functions from the Python lists its
    datasets yield (collation happens when each is drawn, as in its loader)."""
    samples = ((ids[:seq_len].tolist(), mask[:seq_len].astype(int).tolist())
               for ids, mask in map(dataset.sample, sample_order(len(dataset), shuffle_seed)))
    if mode == "pack":
        need, total, chosen = (count * rows + 1) * seq_len, 0, []
        for ids, mask in samples:  # enough tokens for count * rows full packs, and one more
            chosen.append({"input_ids": ids, "loss_mask": mask})
            total += len(ids)
            if total >= need:
                break
        packs = nemo.eagle3.build_packed_eagle3_dataset(chosen, packed_sequence_size=seq_len, pad_token_id=PAD_ID)
        groups = (packs[i * rows:(i + 1) * rows] for i in range(count))
        collate = nemo.eagle3._pack_collate
    else:
        groups = ([next(samples) for _ in range(rows)] for _ in range(count))
        groups = (_padded(g, seq_len if mode == "pad-max" else max(len(ids) for ids, _ in g)) for g in groups)
        collate = nemo.eagle3._stack_batch
    yield from map(collate, groups)


def _padded(group: list[tuple[list[int], list[int]]], width: int) -> list[dict[str, list[int]]]:
    """What its ChatDataset yields for one sample (unshifted, as the DFlash recipe asks) padded to width."""
    return [{"input_ids": ids + [PAD_ID] * (width - len(ids)), "loss_mask": mask + [0] * (width - len(ids)),
             "attention_mask": [1] * len(ids) + [0] * (width - len(ids))} for ids, mask in group]


def measure_mode(peer: Peer, nemo: types.SimpleNamespace, profile: str, mode: str, args: argparse.Namespace,
                 peak: float | None, data: UserData | None = None) -> dict[str, Any]:
    """One NeMo padding mode on one length profile's samples (`data`: the prepared `--data` files, for the
    data profile), taken from `bench_dataset` as ours are."""
    from blockdraft.train.hotpath import graphs_compiled

    device, shape, grad_accum = peer.device, peer.shape, peer.grad_accum
    dataset = bench_dataset(profile, args, peer.hf_cfg.vocab_size, grad_accum, data)
    updates = args.warmup + args.steps
    batches = micro_batches(mode, dataset, nemo, args.seq_len, args.micro_batch, updates * grad_accum,
                            NEMO_SHUFFLE_SEED if profile == "data" else None)
    t_dims, d_dims = Dims.of(peer.hf_cfg), Dims.of(peer.draft_config)
    layers_run, vocab = max(shape.layer_ids) + 1, peer.hf_cfg.vocab_size
    rows, kept, skipped, anchors = [], [], 0, []
    clock = UpdateClock(device)  # its updates timed as ours are
    for k in range(1, updates + 1):
        if k == args.warmup + 1:
            graphs_before = graphs_compiled()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        host = [next(batches) for _ in range(grad_accum)]
        wait = time.perf_counter() - t0
        micro = peer.update(host)
        step_time = clock.lap()
        if k <= args.warmup:
            continue
        done = [m for m in micro if m.logged is not None]
        skipped += len(micro) - len(done)
        lengths = [n for m in micro for n in m.lengths]
        blocks, labels = sum(m.logged[3] for m in done), sum(m.logged[4] for m in done)
        fl_d = sum(drafter_flops(DraftWork(sum(m.lengths), int(m.logged[3]), peer.context_seen(m), 0), d_dims,
                                 shape.num_layers, len(shape.layer_ids), shape.block_size, vocab) for m in done)
        fl_d += 2 * 2 * labels * d_dims.hidden * vocab  # lm_head: forward + input gradient, as measure.py
        loss = statistics.mean(m.logged[0] for m in done) if done else math.nan
        anchors.append(sum(int(m.keep.sum()) for m in done))
        rows.append({"update": k, "step_time": step_time, "wait": wait, "tokens": sum(lengths),
                     "padded": sum(m.host["input_ids"].numel() for m in micro), "blocks": blocks,
                     "graphs": graphs_compiled(), "passes": len(micro), "samples": len(lengths),
                     "flops_target": target_flops(lengths, t_dims, layers_run), "flops_drafter": fl_d, "loss": loss})
        if len(kept) < 4:
            kept.append([m.batch for m in micro])
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    result = summarize_rows(rows, time_target(peer, kept), peak, 1, graphs_before)
    result.update(profile=profile, mode=mode, peak_mem_gb=mem, micro_batches_per_step=grad_accum,
                  rows_per_micro_batch=args.micro_batch, samples_per_step=statistics.mean(r["samples"] for r in rows),
                  anchors_drawn_per_step=statistics.mean(anchors), skipped_micro_batches=skipped)
    return result


def time_target(peer: Peer, kept: list[list[dict[str, torch.Tensor]]]) -> float:
    """Median seconds of its target forward alone over one update's micro-batches."""
    times = []
    for micro in kept:
        synchronize(peer.device)
        t0 = time.perf_counter()
        for batch in micro:
            peer.features(batch)
        synchronize(peer.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def runs(profiles: list[str], modes: list[str]) -> list[tuple[str, str]]:
    """Full-length samples make the same batches in every mode (one sample fills a row): full runs
    the first mode asked for, the mix each."""
    return [(p, m) for p in profiles for m in (modes[:1] if p == "full" else modes)]


def ratios(ours: dict[str, Any], peer: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours over each NeMo run of the same length profile, beside the issue's targets where it sets one.

    Each ratio is given at the median update (`ratio`) and over the measured window (`ratio_wall`), and a
    target is judged on the window: a median update's rate pairs the median tokens per update with the
    median time, which under-counts a run whose updates hold unequal numbers of tokens at equal cost
    (cost-balanced batching: ours on the mix by about a quarter, `rate_wall_over_median`), while the window's
    rate is its work over its time, stalls included (`time_wall_over_median` says whether there were any)."""
    by_profile = {r["profile"]: r for r in ours["profiles"]}
    out = []
    for r in peer:
        mine = by_profile.get(r["profile"])
        if mine is None or "error" in r:
            continue
        for field in ("tokens_per_s", "blocks_per_s"):
            ratio = mine[field] / r[field] if r[field] else None
            wall = f"{field}_wall"
            ratio_wall = mine[wall] / r[wall] if r[wall] else None
            target = TARGETS.get((r["profile"], r["mode"], field))
            out.append({"profile": r["profile"], "nemo_mode": r["mode"], "field": field, "ours": mine[field],
                        "nemo": r[field], "ratio": ratio, "ours_wall": mine[wall], "nemo_wall": r[wall],
                        "ratio_wall": ratio_wall, "target": target,
                        "met": None if target is None or ratio_wall is None else ratio_wall >= target})
    return out


def row(r: dict[str, Any], trainer: str) -> None:
    """One measured run's line, NeMo's or ours: the same fields (measure.summarize_rows)."""
    print(f"{r['profile']:8} {trainer:12} {r['tokens_per_s']:10,.0f} {r['tokens_per_s_wall']:10,.0f} "
          f"{r['blocks_per_s']:10,.0f} {r['blocks_per_1k_tokens']:9.0f} {r['pad_frac']:6.1%} "
          f"{or_dash(r['mfu'], '.1%'):>6} {or_dash(r['mfu_wall'], '.1%'):>8} {or_dash(r['peak_mem_gb'], '.1f'):>8} "
          f"{r['graphs_compiled']:6} {r['slow_steps']:4}")


def render(report: dict[str, Any]) -> None:
    env = report["env"]
    print(f"NeMo AutoModel {env['nemo_version']} DFlash on {env['device_name']}, target {env['target']}: "
          f"drafter {env['drafter']}, attention {env['attention']}, torch {env['torch']}, "
          f"transformers {env['transformers']}")
    if "data" in env:
        print(bench_command.data_line(env["data"]))
    print(f"{'lengths':8} {'mode':12} {'tokens/s':>10} {'wall':>10} {'blocks/s':>10} {'blocks/1k':>9} "
          f"{'pad':>6} {'MFU':>6} {'MFU wall':>8} {'peak GB':>8} {'graphs':>6} {'slow':>4}")
    for r in report["nemo"]:
        if "error" in r:
            print(f"{r['profile']:8} {r['mode']:12} {r['error']}")
            continue
        row(r, r["mode"])
    for r in report.get("ours", {}).get("profiles", []):
        row(r, "blockdraft")
    for r in report.get("ratios", []):
        target = "" if r["target"] is None else f" (target {r['target']}x: {'met' if r['met'] else 'NOT met'})"
        print(f"ours / NeMo {r['nemo_mode']} on {r['profile']}, {r['field']}: {r['ratio_wall']:.2f}x over the "
              f"window, {r['ratio']:.2f}x at the median update{target}")


def main(argv: list[str] | None = None) -> int:
    import transformers

    from blockdraft.bench.shapes import target_config, target_tokenizer
    from blockdraft.device import pick_device

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_command.add_arguments(p)
    p.add_argument("--modes", default=",".join(MODES), help=f"NeMo padding modes: {', '.join(MODES)}")
    p.add_argument("--attention", default="auto", choices=["auto", "flex_attention", "sdpa"],
                   help="its drafter's attention backend (auto: flex_attention on CUDA, its default; sdpa on CPU)")
    p.add_argument("--ours", action="store_true", help="then `blockdraft bench` with the same arguments, and ratios")
    p.add_argument("--recompile-limit", type=int, default=None,
                   help="torch._dynamo's, for NeMo's runs (default: torch's own, which its recipe keeps without a "
                        "compile: block; its compile: block raises it to 256)")
    args = parse_with_overrides(p, argv)
    profiles = bench_profiles(args)
    modes = [s.strip() for s in args.modes.split(",") if s.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise UserError(f"--modes takes some of {', '.join(MODES)}, not {args.modes!r}")
    cfg = bench_command.bench_config(args)
    device = pick_device(cfg.train.device)
    gpu = device.type == "cuda"
    args.steps = args.steps if args.steps is not None else (100 if gpu else 20)  # as `blockdraft bench`
    args.warmup = args.warmup if args.warmup is not None else (12 if gpu else 6)
    attention = args.attention if args.attention != "auto" else ("flex_attention" if gpu else "sdpa")
    if args.ours and cfg.train.fp8_linears:  # refused before NeMo's minutes, not after them
        require_fp8(device)
    if args.recompile_limit is not None:
        torch._dynamo.config.recompile_limit = args.recompile_limit
    nemo = load_nemo()
    hf_cfg = target_config(args.target_shape, args.target)
    tokenizer = target_tokenizer(args.target)
    shape = drafter_shape(cfg, hf_cfg, tokenizer)
    data = prepare_user_data(args, cfg, tokenizer, hf_cfg.vocab_size)  # once: NeMo's and ours
    torch.manual_seed(cfg.train.seed)
    peer = Peer(nemo, hf_cfg, shape, cfg, device, attention)
    peak = nominal_peak(device, args.peak_tflops)
    env = {
        "target": args.target or args.target_shape, "nemo_version": nemo.version, "nemo_root": str(nemo.root),
        "stood_in": nemo.stood_in, "pins": pins(), "torch": torch.__version__, "transformers": transformers.__version__,
        "device_name": torch.cuda.get_device_name(device) if gpu else "cpu", "attention": attention,
        "drafter": f"{shape.num_layers} layers, B={shape.block_size}, taps {shape.layer_ids}, "
                   f"{shape.num_anchors} anchors per row",
        "dtype": "bf16 weights, no autocast" if gpu else "fp32", "compile": "recipe default: none (flex_attention "
        "and create_block_mask compiled by transformers and NeMo)", "seq_len": args.seq_len,
        "micro_batch": args.micro_batch, "grad_accum": cfg.train.grad_accum, "peak_tflops": peak,
        "mix": {"median": args.mix_median, "sigma": args.mix_sigma, "max": args.seq_len},
        "recompile_limit": torch._dynamo.config.recompile_limit, "date": time.strftime("%Y-%m-%d"),
    }
    if data is not None:
        env["data"] = data.describe()
    t0 = time.perf_counter()
    report: dict[str, Any] = {"env": env, "nemo": []}
    for profile, mode in runs(profiles, modes):
        try:
            result = measure_mode(peer, nemo, profile, mode, args, peak, data)
        except torch.OutOfMemoryError as exc:  # e.g. flex attention run eager past the recompile limit
            result = {"profile": profile, "mode": mode, "error": f"out of memory: {str(exc).splitlines()[0]}"}
            peer.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        print(f"peer_nemo: {profile} {mode} after {time.perf_counter() - t0:.0f}s: {json.dumps(result)}",
              file=sys.stderr, flush=True)
        report["nemo"].append(result)
    del peer
    if gpu:
        torch.cuda.empty_cache()
    if args.ours:
        report["ours"] = bench_command.measure(args, stall=False, data=data)
        report["ratios"] = ratios(report["ours"], report["nemo"])
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        render(report)
    return 0


if __name__ == "__main__":
    exit_script(main)
