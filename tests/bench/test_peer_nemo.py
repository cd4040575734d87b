"""bench/peer_nemo.py: NeMo AutoModel's DFlash step in its three padding modes, and what it counts.

The expected blocks are worked out here from the samples' lengths and prompts alone, by the anchor
rule of NeMo's DFlashTrainerModule._sample_anchor_positions: per row, min(num_anchors, v) anchors
among the v positions a <= width - B with loss_mask[a] = 1 (packed: with B - 1 more tokens of its
document after a); a block is supervised when one of its B - 1 labels is an assistant token."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("nemo_automodel") is None:
    pytest.skip("nemo_automodel is not importable (its wheel, --no-deps: bench/README.md)", allow_module_level=True)

from transformers import Qwen3Config  # noqa: E402

from blockdraft.bench.synthetic import SyntheticDataset  # noqa: E402
from blockdraft.config import build_config  # noqa: E402
from tests.conftest import TINY_TARGET  # noqa: E402

_spec = importlib.util.spec_from_file_location("peer_nemo", Path(__file__).parents[2] / "bench" / "peer_nemo.py")
peer_nemo = importlib.util.module_from_spec(_spec)
sys.modules["peer_nemo"] = peer_nemo  # its dataclasses look their module up
_spec.loader.exec_module(peer_nemo)

SEQ, ROWS, B = 256, 2, 4


@pytest.fixture(scope="module")
def nemo():
    return peer_nemo.load_nemo()


@pytest.fixture(scope="module")
def dataset():
    return SyntheticDataset("mix", SEQ, 256, 64, median=90, sigma=0.6)


def make_peer(nemo, num_anchors: int):
    hf_cfg = Qwen3Config(vocab_size=256, **TINY_TARGET)
    cfg = build_config({"target": {"path": "<random tiny>"}, "train": {"device": "cpu", "num_anchors": num_anchors}},
                       ["drafter.num_layers=1", f"drafter.block_size={B}", "drafter.target_layer_ids=[1,2]"])
    torch.manual_seed(0)
    shape = peer_nemo.drafter_shape(cfg, hf_cfg)
    return peer_nemo.Peer(nemo, hf_cfg, shape, cfg, torch.device("cpu"), "sdpa")


def rows_of(mode: str, dataset: SyntheticDataset, count: int) -> list[list[int]]:
    """Dataset indices in each row of the first `count` micro-batches (packed greedily, in order)."""
    if mode != "pack":
        return [[i] for i in range(count * ROWS)]
    rows, row, used = [], [], 0
    for i, n in enumerate(dataset.lengths.tolist()):
        if row and used + n > SEQ:
            rows.append(row)
            row, used = [], 0
        row.append(i)
        used += n
        if len(rows) == count * ROWS:
            return rows
    raise AssertionError("dataset too small")


def anchor_rule(mode: str, dataset: SyntheticDataset, row: list[int], width: int) -> tuple[int, int]:
    """(valid anchors, supervised valid anchors) of one row."""
    valid = supervised = 0
    for i in row:
        n, p = int(dataset.lengths[i]), int(dataset.prompt[i])
        if mode == "pack":  # the whole block inside the document: every label is an assistant token
            valid += max(0, n - B - p + 1)
            supervised += max(0, n - B - p + 1)
        else:  # a <= width - B, inside the sample; supervised when a + 1 is still one of its tokens
            valid += max(0, min(n - 1, width - B) - p + 1)
            supervised += max(0, min(n - 2, width - B) - p + 1)
    return valid, supervised


@pytest.mark.parametrize("mode", peer_nemo.MODES)
def test_each_mode_counts_the_real_tokens_and_the_blocks_its_anchor_rule_implies(nemo, dataset, mode):
    peer = make_peer(nemo, num_anchors=4096)  # no cap: every valid anchor is drawn, so the count is exact
    batches = list(peer_nemo.micro_batches(mode, dataset, nemo, SEQ, ROWS, 2))
    rows = rows_of(mode, dataset, 2)
    for k, batch in enumerate(batches):
        width = batch["input_ids"].shape[1]
        assert width == (SEQ if mode != "pad-longest" else max(int(dataset.lengths[i]) for r in
                                                                 rows[k * ROWS:(k + 1) * ROWS] for i in r))
        (micro,) = peer.update([batch])
        loss, _, _, blocks, labels = micro.logged
        mine = rows[k * ROWS:(k + 1) * ROWS]
        assert micro.lengths == [int(dataset.lengths[i]) for r in mine for i in r]
        assert sum(micro.lengths) == int(batch["attention_mask"].sum())
        rule = [anchor_rule(mode, dataset, r, width) for r in mine]
        assert int(micro.keep.sum()) == sum(v for v, _ in rule)
        assert blocks == sum(s for _, s in rule)
        assert 0 < labels <= blocks * (B - 1)
        assert math.isfinite(loss)


@pytest.mark.parametrize("mode", ["pad-max", "pack"])
def test_num_anchors_caps_each_row_not_each_sample(nemo, dataset, mode):
    cap = 8
    peer = make_peer(nemo, num_anchors=cap)
    batch = next(peer_nemo.micro_batches(mode, dataset, nemo, SEQ, ROWS, 1))
    rows = rows_of(mode, dataset, 1)
    if mode == "pack":
        assert max(len(r) for r in rows) > 1  # a packed row holds several samples, and still gets `cap`
    (micro,) = peer.update([batch])
    rule = [anchor_rule(mode, dataset, r, SEQ) for r in rows]
    assert int(micro.keep.sum()) == sum(min(cap, v) for v, _ in rule)
    if mode == "pack":
        assert micro.logged[3] == sum(min(cap, v) for v, _ in rule)


def test_a_measured_mode_reports_bench_fields_from_its_updates(nemo):
    peer = make_peer(nemo, num_anchors=64)
    args = argparse.Namespace(steps=2, warmup=1, seq_len=SEQ, micro_batch=ROWS, mix_median=90.0, mix_sigma=0.6)
    r = peer_nemo.measure_mode(peer, nemo, "mix", "pack", args, peak=None)
    assert (r["steps"], r["mode"], r["profile"], r["skipped_micro_batches"], r["loss_finite"]) == (2, "pack", "mix",
                                                                                                  0, True)
    assert r["blocks_per_1k_tokens"] == pytest.approx(1000 * r["blocks"] / r["tokens"])
    assert r["blocks"] <= 2 * ROWS * 64
    assert r["tokens_per_s"] > 0 and r["blocks_per_s"] > 0 and r["mfu"] is None
    assert 0 <= r["pad_frac"] < 1


def test_full_lengths_run_one_mode_and_ratios_judge_the_issue_targets():
    assert peer_nemo.runs(["full", "mix"], ["pad-max", "pack"]) == [("full", "pad-max"), ("mix", "pad-max"),
                                                                     ("mix", "pack")]
    ours = {"profiles": [{"profile": "full", "tokens_per_s": 20.0, "blocks_per_s": 4.0, "tokens_per_s_wall": 15.0,
                          "blocks_per_s_wall": 3.0}]}
    nemo_runs = [{"profile": "full", "mode": "pad-max", "tokens_per_s": 10.0, "blocks_per_s": 2.0,
                  "tokens_per_s_wall": 10.0, "blocks_per_s_wall": 2.0},
                 {"profile": "mix", "mode": "pack", "tokens_per_s": 10.0, "blocks_per_s": 2.0,
                  "tokens_per_s_wall": 10.0, "blocks_per_s_wall": 2.0}]
    (tokens, blocks) = peer_nemo.ratios(ours, nemo_runs)
    assert (tokens["ratio"], tokens["ratio_wall"], tokens["target"], tokens["met"]) == (2.0, 1.5, 1.6, False)
    assert (blocks["field"], blocks["target"], blocks["met"]) == ("blocks_per_s", None, None)


def test_a_target_is_judged_on_the_window_not_the_median_update():
    """Updates of unequal token counts at equal time: the median update's rate under-counts the work."""
    ours = {"profiles": [{"profile": "mix", "tokens_per_s": 12.0, "blocks_per_s": 2.4, "tokens_per_s_wall": 20.0,
                          "blocks_per_s_wall": 4.0}]}
    nemo_runs = [{"profile": "mix", "mode": "pack", "tokens_per_s": 10.0, "blocks_per_s": 2.0,
                  "tokens_per_s_wall": 10.0, "blocks_per_s_wall": 2.0}]
    _, blocks = peer_nemo.ratios(ours, nemo_runs)
    assert (blocks["ratio"], blocks["ratio_wall"], blocks["target"], blocks["met"]) == (1.2, 2.0, 1.5, True)


def test_ours_runs_after_the_peer_in_one_process_and_its_ratios_come_from_that_run(capsys):
    """--ours: one report, the peer's runs, ours on the same shapes and the ratios of the two; without
    the checkpoint stall, which no ratio reads and which a 10-minute mix call has no time for."""
    rc = peer_nemo.main(["--target-shape", "tiny", "--lengths", "mix", "--seq-len", "256", "--mix-median", "120",
                         "--steps", "3", "--warmup", "1", "--modes", "pack", "--ours", "--no-check", "--device", "cpu",
                         "--json", "drafter.num_layers=2", "drafter.block_size=8", "train.num_anchors=16"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    (nemo_run,), (mine,) = report["nemo"], report["ours"]["profiles"]
    assert "checkpoint_stall" not in report["ours"]
    assert (nemo_run["mode"], mine["profile"], mine["steps"]) == ("pack", "mix", 3)
    tokens, blocks = report["ratios"]
    assert blocks["ratio_wall"] == pytest.approx(mine["blocks_per_s_wall"] / nemo_run["blocks_per_s_wall"])
    assert tokens["ratio"] == pytest.approx(mine["tokens_per_s"] / nemo_run["tokens_per_s"])


def documents(mode: str, batch: dict[str, torch.Tensor]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(ids, loss mask) of each sample in a micro-batch, in row order (a packed row's documents in turn)."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        real = int(batch["attention_mask"][r].sum())
        ids, mask = batch["input_ids"][r, :real].tolist(), batch["loss_mask"][r, :real].tolist()
        starts = (batch["position_ids"][r, :real] == 0).nonzero().flatten().tolist() if mode == "pack" else [0]
        out += [(tuple(ids[a:b]), tuple(mask[a:b])) for a, b in zip(starts, [*starts[1:], real], strict=True)]
    return out


@pytest.mark.parametrize("mode", peer_nemo.MODES)
def test_on_your_data_nemo_rows_hold_its_samples_each_once_an_epoch(nemo, tiny_chat_target, tiny_chats, tmp_path,
                                                                     mode):
    """The data profile's rows are the user's samples (ids and answer masks), every one once an epoch,
    in an order shuffled each epoch as NeMo's loader draws them; a file smaller than the run is cycled."""
    from blockdraft.config import DataConfig
    from blockdraft.data.cache import prepare_dataset
    from blockdraft.model.tokenizer import load_tokenizer

    dataset, _ = prepare_dataset(DataConfig(max_len=SEQ, cache_dir=str(tmp_path)), load_tokenizer(tiny_chat_target),
                                 files=[str(tiny_chats)])
    n = len(dataset)
    samples = sorted((tuple(ids.tolist()), tuple(mask.astype(int).tolist())) for ids, mask in map(dataset.sample,
                                                                                                  range(n)))
    batches = peer_nemo.micro_batches(mode, dataset, nemo, SEQ, ROWS, 2 * n // ROWS, peer_nemo.NEMO_SHUFFLE_SEED)
    docs = [d for batch in batches for d in documents(mode, batch)]
    assert len(docs) >= 2 * n
    assert sorted(docs[:n]) == samples and sorted(docs[n:2 * n]) == samples
    assert docs[:n] != docs[n:2 * n]  # shuffled again for the second epoch


def test_ours_and_nemo_measure_the_same_data_file_in_one_call(tiny_chat_target, tiny_chats, tmp_path, capsys):
    """--data with --ours: both trainers' data profile on the file's samples, prepared once, and their
    ratios. NeMo's measured updates (after 1 of warm-up) hold the samples its shuffled order gives."""
    from blockdraft.data.cache import TokenizedDataset

    rc = peer_nemo.main(["--target", str(tiny_chat_target), "--seq-len", "128", "--steps", "2", "--warmup", "1",
                         "--modes", "pad-longest", "--ours", "--no-check", "--device", "cpu", "--json",
                         "drafter.num_layers=2", "drafter.block_size=8", "train.num_anchors=16",
                         f"data.cache_dir={tmp_path}", "--data", str(tiny_chats)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    (nemo_run,), (mine,) = report["nemo"], report["ours"]["profiles"]
    assert (nemo_run["profile"], nemo_run["mode"], mine["profile"]) == ("data", "pad-longest", "data")
    assert report["env"]["data"] == report["ours"]["env"]["data"]
    assert report["env"]["data"]["samples_skipped"] == 1
    lengths = TokenizedDataset(Path(report["env"]["data"]["cache_path"])).lengths
    order = list(itertools.islice(peer_nemo.sample_order(len(lengths), peer_nemo.NEMO_SHUFFLE_SEED), 3 * ROWS))
    assert nemo_run["tokens"] == sum(int(lengths[i]) for i in order[ROWS:])
    assert mine["tokens"] > 0 and mine["dataset_samples"] == len(lengths)
    assert {r["profile"] for r in report["ratios"]} == {"data"} and len(report["ratios"]) == 2


def test_with_a_target_folder_nemo_s_drafter_masks_with_the_token_ours_does(tiny_chat_target):
    """The folder's tokenizer has no mask token: both drafters take its spare special token, not the
    table's last row (which a shape without a tokenizer gets)."""
    from blockdraft.bench.measure import build_models
    from blockdraft.bench.shapes import target_config, target_tokenizer

    cfg = build_config({"target": {"path": str(tiny_chat_target)}, "train": {"device": "cpu"}},
                       ["drafter.num_layers=1", f"drafter.block_size={B}"])
    hf_cfg, tokenizer = target_config("tiny", str(tiny_chat_target)), target_tokenizer(str(tiny_chat_target))
    _, ours = build_models(cfg, hf_cfg, torch.device("cpu"), tokenizer)
    theirs = peer_nemo.drafter_shape(cfg, hf_cfg, tokenizer)
    assert theirs.mask_token_id == ours.mask_token_id == tokenizer.convert_tokens_to_ids("<spare>")
    assert peer_nemo.drafter_shape(cfg, hf_cfg).mask_token_id == hf_cfg.vocab_size - 1
