"""Shape classes: a bounded ladder of padded sizes, and padding that leaves the update as it was."""

import itertools
import random

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from blockdraft.data.cost import dataset_blocks
from blockdraft.train.loop import Trainer
from blockdraft.train.shapes import ShapeClasses, fit_sizes, size_class


def ladder(limit: int, quantum: int, ratio: float) -> list[int]:
    """Every class up to the first one >= limit: the most shapes sizes up to `limit` can take."""
    out = [quantum]
    while out[-1] < limit:
        out.append(size_class(out[-1] + 1, quantum, ratio))
    return out


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
    assert len(ladder(1536, shapes.block_quantum, shapes.block_ratio)) == 40  # every block class up to 1536 blocks


def _padding(counts, sizes) -> int:
    """Filler blocks when each count takes the smallest size >= it."""
    return sum(min(c for c in sizes if c >= max(n, 1)) - n for n in counts)


def test_fitted_sizes_pad_least_of_any_choice_of_as_many():
    """Against every choice of at most k sizes among the rounded counts (an optimal size sits on one),
    the largest covering them all."""
    rng = random.Random(0)
    for _ in range(200):
        quantum = rng.choice([1, 8])
        counts = [rng.randint(0, 200) for _ in range(rng.randint(1, 25))]
        k = rng.randint(1, 5)
        sizes = fit_sizes(counts, k, quantum)
        values = sorted({-(-max(n, 1) // quantum) * quantum for n in counts})
        assert len(sizes) <= k and sizes[-1] == values[-1] and all(c % quantum == 0 for c in sizes)
        best = min(_padding(counts, (*rest, values[-1]))
                   for m in range(min(k, len(values))) for rest in itertools.combinations(values[:-1], m))
        assert _padding(counts, sizes) == best
    assert fit_sizes([], 4, 8) == ()


@pytest.mark.parametrize("profile", ["full", "mix"])
def test_classes_fitted_to_the_bench_plan_pad_less_than_the_ladder_with_no_more_classes(profile):
    """The 8B bench's plans (qwen3-8b shape, 512 anchors, 2 x 3,072 tokens): at full length every pass has
    1,024 blocks, a class of its own (the ladder's is 1,072); on the chat-like mix a tenth of the
    ladder's filler blocks remains, in as many classes."""
    from blockdraft.bench.shapes import target_config
    from blockdraft.bench.synthetic import SyntheticDataset
    from blockdraft.config import build_config
    from blockdraft.data.batching import BatchSampler
    from blockdraft.data.cost import anchor_candidates, dataset_costs
    from blockdraft.train.hotpath import RunPlan, pass_blocks

    cfg = build_config({"target": {"path": "<qwen3-8b>"}, "data": {"max_len": 3072, "tokens_per_batch": 6144},
                        "train": {"num_anchors": 512}}, [])
    hf_cfg = target_config("qwen3-8b", None)
    data = SyntheticDataset(profile, 3072, hf_cfg.vocab_size, 2048)
    candidates = anchor_candidates(data, cfg.drafter.block_size)
    sampler = BatchSampler(data.lengths, cfg.data, seed=0,
                           costs=dataset_costs(data, hf_cfg, cfg, [1, 9, 17, 25, 33], candidates))
    plan = RunPlan.of(data, sampler, dataset_blocks(data, cfg, candidates), epochs=1)
    counts = [v for _, blocks in plan.rows for v in pass_blocks(blocks, 1536)]
    ladder = ShapeClasses.for_budget(16, 6144)
    fitted = ladder.fitted(counts)
    assert len(fitted.block_sizes) <= len({ladder.blocks(v) for v in counts})
    assert all(fitted.blocks(v) >= v and fitted.blocks(v) % 8 == 0 for v in counts)
    filler_ladder = sum(ladder.blocks(v) - v for v in counts) / sum(counts)
    filler_fitted = sum(fitted.blocks(v) - v for v in counts) / sum(counts)
    if profile == "full":
        assert set(counts) == {1024} and fitted.block_sizes == (1024,)
        assert filler_fitted == 0 and filler_ladder == pytest.approx(48 / 1024)
    else:
        assert filler_ladder > 0.03 and filler_fitted < filler_ladder / 4
    assert fitted.blocks(max(counts) + 1) == ladder.blocks(max(counts) + 1)  # above the plan: the ladder


def test_a_run_packs_every_pass_into_a_class_fitted_to_its_plan(tiny_config):
    """The trainer fits the classes before its prefetcher packs the first batch: every pass it deals
    takes one of them."""
    trainer = Trainer(tiny_config(train={"shape_classes": True}), show_console=False)
    try:
        sizes = trainer.hot.shapes.block_sizes
        assert sizes
        for _ in range(6):
            batch = trainer.prefetcher.next()
            assert all(p.packed.padded_blocks in sizes for p in batch.passes)
    finally:
        trainer.prefetcher.close()


def _first_update(cfg, seed: int = 0, warm_up: bool = False):
    """(stats vector, gradients, the pass's (L', V')) of update 1 on the first batch; with `warm_up`, after
    the warm-up of the plan's picks (checked to leave RNG and gradients as they were)."""
    trainer = Trainer(cfg, show_console=False)
    try:
        batch = trainer.hot.to_device(trainer.prefetcher.next())
    finally:
        trainer.prefetcher.close()
    torch.manual_seed(seed)
    trainer.drafter.reset_parameters()
    if warm_up:
        trainer.hot.compile = True  # what warm_up looks at; the tiny config runs on the CPU's plain path
        rng = torch.get_rng_state()
        picks = trainer.hot.warmup_batches(trainer.dataset, trainer.plan)
        assert trainer.hot.warm_up(picks) >= 2
        assert torch.equal(torch.get_rng_state(), rng)
        assert all(p.grad is None for p in trainer.drafter.parameters())
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
@pytest.mark.parametrize("static_graphs", [False, True])
def test_a_compiled_length_mix_compiles_nothing_after_the_shape_warm_up(static_graphs):
    """CPU inductor, dense mask (flex attention has no CPU backward): after `warm_up` has run the
    plan's picks, a length mix whose noise ends at 0 compiles no graph at all (noise stays a tensor;
    classes bound the shapes; the warm-up met every graph they need). With `train.static_graphs` the
    warm-up compiles a graph for each block class it meets, where dynamo alone shares one graph with
    symbolic sizes between the classes after the first."""
    from blockdraft.bench.measure import build_models
    from blockdraft.bench.shapes import target_config
    from blockdraft.bench.synthetic import SyntheticDataset
    from blockdraft.config import build_config
    from blockdraft.data.batching import BatchSampler
    from blockdraft.data.prefetch import Prefetcher
    from blockdraft.train.hotpath import DraftForward, HotPath, RunPlan, graphs_compiled

    cfg = build_config({"target": {"path": "<tiny>"}, "drafter": {"num_layers": 1, "num_taps": 2},
                        "data": {"max_len": 256, "tokens_per_batch": 512},
                        "noise": {"std": 0.05, "schedule": "cosine", "final_std": 0.0},
                        "train": {"device": "cpu", "compile": True, "num_anchors": 16,
                                  "static_graphs": static_graphs}}, [])
    device = torch.device("cpu")
    torch.manual_seed(0)
    torch._dynamo.reset()  # no compiled forward of an earlier test
    target, drafter = build_models(cfg, target_config("tiny", None), device)
    hot = HotPath(target, drafter, cfg, device, fast=True)
    hot.attention = "sdpa"  # the dense mask is an input of the compiled forward
    assert hot.compile and hot.shapes is not None
    data = SyntheticDataset("mix", 256, 512, 500, median=90, sigma=0.7)
    counts, shapes = [], set()
    sampler = BatchSampler(data.lengths, cfg.data, seed=0)
    plan = RunPlan.of(data, sampler, dataset_blocks(data, cfg), epochs=1)
    hot.fit_shapes(plan)
    warmup = hot.warmup_batches(data, plan)
    assert hot.warm_up(warmup) >= 3
    classes = {p.packed.padded_blocks for b in warmup for p in hot.prepare(b).passes}
    graphs = len(_debug_get_cache_entry_list(DraftForward.forward.__code__))  # the drafter's compiled forwards
    assert graphs == len(classes) if static_graphs else graphs < len(classes), (graphs, classes)
    assert all(p.grad is None for p in drafter.parameters())
    with Prefetcher(data, sampler, depth=2, pin_memory=False, prepare=hot.prepare) as prefetcher:
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
    v2, g2, _ = _first_update(cfg, warm_up=True)
    torch.testing.assert_close(v2, v1, rtol=0, atol=0)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_the_warm_up_picks_one_micro_batch_per_block_class_of_the_plan():
    """Each class the plan's passes take, most frequent first (it keeps the static graph), then the
    micro-batch with the most rows and the longest lone row, each micro-batch once."""
    from blockdraft.train.hotpath import warmup_picks

    shapes = ShapeClasses.for_budget(16, 6144)  # block classes: multiples of 8, then 2^(1/8) steps
    plan = [([3072, 3072], [512, 512]),  # 0: one pass of 1024 blocks
            ([3072, 3072], [512, 512]),  # 1: the same class again
            ([900] * 6, [400] * 6),  # 2: passes of 3, 3 rows: 1200 blocks, twice (max_blocks 1536)
            ([100] * 40, [20] * 40),  # 3: the most rows: 800 blocks in one pass
            ([3072], [7]),  # 4: a lone long row, 8 blocks
            ([200], [150]),  # 5: a shorter lone row
            ([3072, 3072], [512, 512])]
    picks = warmup_picks(plan, shapes, 1536)
    assert picks[0] == 0  # 1024 blocks: three passes; 1200-class: two; the rest one each
    assert picks[1] == 2
    assert sorted(picks) == [0, 2, 3, 4, 5]
    classes = {shapes.blocks(1024), shapes.blocks(1200), shapes.blocks(800), shapes.blocks(7), shapes.blocks(150)}
    assert len(classes) == 5


def test_a_compiled_run_logs_its_warm_up_before_update_1(tiny_config, monkeypatch):
    """`blockdraft train` warms up from its own plan and says so in the log (eager here: torch.compile
    made the identity, and the CPU's plain path told it compiles)."""
    from blockdraft.telemetry.log import read_log
    from blockdraft.train.hotpath import HotPath

    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    monkeypatch.setattr(HotPath, "warms_up", property(lambda self: self.shapes is not None))
    result = Trainer(tiny_config(train={"shape_classes": True}), show_console=False).run()
    records = read_log(result.run_dir / "log.jsonl")
    kinds = [r["kind"] for r in records]
    (warmup,) = [r for r in records if r["kind"] == "warmup"]
    assert kinds.index("warmup") < kinds.index("step") and warmup["step"] == 0
    assert warmup["passes"] >= 2 and warmup["seconds"] > 0 and "graphs_compiled" in warmup
    assert result.status == "completed"
