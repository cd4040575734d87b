"""Shape classes: a bounded ladder of padded sizes, and padding that leaves the update as it was."""

import pytest
import torch

from blockdraft.train.loop import Trainer
from blockdraft.train.shapes import ShapeClasses, ladder, size_class


def test_classes_are_tile_multiples_above_the_size_and_few():
    for quantum, ratio in ((256, 2**0.5), (8, 2**0.125), (16, 1.0)):
        for n in range(1, 7000, 7):
            c = size_class(n, quantum, ratio)
            assert c >= n and c % quantum == 0
            assert c <= max(quantum, n * ratio + quantum)  # waste under one ratio step (and one quantum)
    assert ladder(2048, 256, 2**0.5) == [256, 512, 768, 1280, 2048]
    shapes = ShapeClasses.for_budget(16, 6000)
    assert shapes.block_quantum == 8 and shapes.blocks(0) == 8 and shapes.blocks(9) == 16
    assert shapes.context(1) == shapes.context(6000) == shapes.context_size == 6144  # one context length
    assert shapes.context(7000) == 7168  # a pass over the budget (one long sequence): still a tile multiple
    assert len(shapes.block_ladder(1536)) == 40


def _first_update(cfg, seed: int = 0):
    """(stats vector, gradients, the pass's (L', V')) of update 1 on the first batch."""
    trainer = Trainer(cfg, show_console=False)
    try:
        batch = trainer.hot.to_device(trainer.prefetcher.next())
    finally:
        trainer.prefetcher.close()
    torch.manual_seed(seed)
    trainer.drafter.reset_parameters()
    vector, _ = trainer.hot.accumulate([batch], step=1, rank=0, noise_std=0.1)
    shapes = [(p.packed.input_ids.shape[0], p.packed.padded_blocks, p.packed.real_tokens, p.packed.num_blocks)
              for p in batch.passes]
    return vector, [p.grad.clone() for p in trainer.drafter.parameters()], shapes


@pytest.mark.parametrize("loss", [{}, {"kl_weight": 0.5}, {"weighting": "streak"}])
def test_a_padded_pass_gives_the_loss_and_gradients_of_the_unpadded_one(tiny_config, loss):
    """fp32 on the plain path (dense mask): filler context and filler blocks change nothing, noise included."""
    base = {"noise": {"std": 0.1}, "loss": loss}
    v1, g1, s1 = _first_update(tiny_config(train={"shape_classes": False}, **base))
    v2, g2, s2 = _first_update(tiny_config(train={"shape_classes": True}, **base))
    assert all(lp == lr and vp == max(vr, 1) for lp, vp, lr, vr in s1)  # unpadded
    assert all(lp > lr and vp > vr for lp, vp, lr, vr in s2)  # padded, both dimensions
    torch.testing.assert_close(v2, v1, rtol=1e-5, atol=1e-5)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.filterwarnings("ignore")
def test_a_compiled_length_mix_compiles_nothing_after_the_shape_warm_up():
    """CPU inductor, dense mask (flex attention has no CPU backward): after `warm_up` has run the
    extreme shapes, a length mix whose noise ends at 0 compiles no graph at all (noise stays a tensor;
    classes bound the shapes; the warm-up met every graph they need)."""
    from blockdraft.bench.measure import build_models
    from blockdraft.bench.shapes import target_config
    from blockdraft.bench.synthetic import SyntheticDataset
    from blockdraft.config import build_config
    from blockdraft.data.batching import BatchSampler
    from blockdraft.data.prefetch import Prefetcher
    from blockdraft.train.hotpath import HotPath, graphs_compiled

    cfg = build_config({"target": {"path": "<tiny>"}, "drafter": {"num_layers": 1, "num_taps": 2},
                        "data": {"max_len": 256, "tokens_per_batch": 512},
                        "noise": {"std": 0.05, "schedule": "cosine", "final_std": 0.0},
                        "train": {"device": "cpu", "compile": True, "num_anchors": 16}}, [])
    device = torch.device("cpu")
    torch.manual_seed(0)
    target, drafter = build_models(cfg, target_config("tiny", None), device)
    hot = HotPath(target, drafter, cfg, device, fast=True)
    hot.attention = "sdpa"  # the dense mask is an input of the compiled forward
    assert hot.compile and hot.shapes is not None
    data = SyntheticDataset("mix", 256, 512, 500, median=90, sigma=0.7)
    counts, shapes = [], set()
    assert hot.warm_up(256) >= 4 and graphs_compiled() > 0
    assert all(p.grad is None for p in drafter.parameters())
    with Prefetcher(data, BatchSampler(data.lengths, cfg.data, seed=0), depth=2, pin_memory=False,
                    prepare=hot.prepare) as prefetcher:
        before = graphs_compiled()
        for k in range(1, 9):
            batch = hot.to_device(prefetcher.next())
            hot.accumulate([batch], k, 0, 0.05 if k < 6 else 0.0)  # the schedule's end: no noise
            drafter.zero_grad(set_to_none=True)
            counts.append(graphs_compiled() - before)
            shapes |= {(p.packed.input_ids.shape[0], p.packed.padded_blocks) for p in batch.passes}
    assert len(shapes) >= 3  # a real mix of block counts
    assert counts == [0] * 8, counts


def test_the_warm_up_leaves_the_run_as_it_was(tiny_config, monkeypatch):
    """Its passes' gradients are dropped and it draws from no RNG stream of the run: update 1 after it
    has the stats and gradients it has without it. Eager (torch.compile made the identity) to be quick:
    the warm-up's own code path is the same."""
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    cfg = tiny_config(train={"shape_classes": True}, noise={"std": 0.1})
    v1, g1, _ = _first_update(cfg)

    trainer = Trainer(cfg, show_console=False)
    try:
        batch = trainer.hot.to_device(trainer.prefetcher.next())
    finally:
        trainer.prefetcher.close()
    torch.manual_seed(0)
    trainer.drafter.reset_parameters()
    trainer.hot.compile = True  # what warm_up looks at; the tiny config runs on the CPU's plain path
    rng = torch.get_rng_state()
    assert trainer.hot.warm_up(int(trainer.dataset.lengths.max())) >= 5
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in trainer.drafter.parameters())
    vector, _ = trainer.hot.accumulate([batch], step=1, rank=0, noise_std=0.1)
    torch.testing.assert_close(vector, v1, rtol=0, atol=0)
    for a, b in zip(g1, (p.grad for p in trainer.drafter.parameters()), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_the_warm_up_meets_every_block_class_a_run_can_show(tiny_config):
    """One pass per rung of the ladder (up to max_blocks_per_pass), plus the full-length pass first."""
    from blockdraft.train.hotpath import HotPath, warmup_batches

    cfg = tiny_config(train={"shape_classes": True, "num_anchors": 24, "max_blocks_per_pass": 160},
                      data={"max_len": 96, "tokens_per_batch": 512})
    trainer = Trainer(cfg, show_console=False)
    trainer.prefetcher.close()
    hot = HotPath(trainer.target, trainer.drafter, cfg, trainer.device)
    batches = [hot.prepare(b) for b in warmup_batches(cfg, hot.shapes, hot.max_blocks, 96, 100)]
    passes = [p.packed for b in batches for p in b.passes]
    assert batches[0].input_ids.shape == (5, 96)  # the budget's rows of the longest length, first
    assert {p.input_ids.shape[0] for p in passes} == {hot.shapes.context_size}
    assert set(hot.shapes.block_ladder(160)) <= {p.padded_blocks for p in passes}
    assert max(p.padded_blocks for p in passes) <= hot.shapes.blocks(160)
