"""The per-update compute: the fast path (flex attention over packed blocks) computes what the plain
path (dense SDPA mask) computes, and odd micro-batches do not break an update."""

import functools
from types import SimpleNamespace

import pytest
import torch

from blockdraft.errors import UserError
from blockdraft.model.drafter import flex_kernel_options
from blockdraft.model.masks import flex_block_mask
from blockdraft.train import hotpath, loop
from blockdraft.train.blocks import anchor_generator, sample_blocks
from blockdraft.train.hotpath import HotPath, Pass
from blockdraft.train.loop import Trainer
from blockdraft.train.loss import stats_vector


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_path_equals_dense_mask_path(tiny_config):
    """Forward only: flex attention has no backward on CPU (the bench checks gradients on the GPU)."""
    trainer = Trainer(tiny_config(train={"max_blocks_per_pass": 100_000}), show_console=False)  # one packed pass
    try:
        batch = trainer.hot.to_device(trainer.prefetcher.next())
    finally:
        trainer.prefetcher.close()
    plain = HotPath(trainer.target, trainer.drafter, trainer.cfg, trainer.device, fast=False)
    flex = HotPath(trainer.target, trainer.drafter, trainer.cfg, trainer.device, fast=True)
    assert (plain.attention, flex.attention) == ("sdpa", "flex")
    cfg = trainer.cfg
    (part,) = batch.passes
    blocks = sample_blocks(part.packed, cfg.drafter.block_size, cfg.train.num_anchors, trainer.drafter.mask_token_id,
                           anchor_generator(0, 1, 0, 0, trainer.device))
    assert blocks.anchors.shape[0] > 4 and len(set(blocks.doc.tolist())) > 1  # several packed sequences
    with torch.no_grad():
        a = plain.micro_stats(part, blocks, 0.0, anchor_generator(0, 1, 0, 0, trainer.device))
        b = flex.micro_stats(part, blocks, 0.0, anchor_generator(0, 1, 0, 0, trainer.device))
    torch.testing.assert_close(stats_vector(b), stats_vector(a), rtol=1e-5, atol=1e-4)


def test_the_flex_backend_setting_reaches_every_attention_layer(tiny_config, monkeypatch):
    cfg = tiny_config(train={"flex_backend": "flash"})
    with pytest.raises(UserError, match="Hopper"):  # this machine has no GPU: refused, not ignored
        Trainer(cfg, show_console=False)
    monkeypatch.setattr(hotpath, "flash_attention_problem", lambda device, head_dim, precision: None)
    trainer = Trainer(cfg, show_console=False)
    trainer.prefetcher.close()
    assert trainer.hot.flex_backend is None  # the CPU's plain path: no flex attention runs
    fast = HotPath(trainer.target, trainer.drafter, trainer.cfg, trainer.device, fast=True)
    attention = [layer.self_attn for layer in trainer.drafter.layers]
    assert fast.flex_backend == "flash" and {a.flex_backend for a in attention} == {"FLASH"}
    one_doc = torch.zeros(224, dtype=torch.long)
    mask = flex_block_mask(torch.tensor([3, 40]), one_doc[:2], one_doc, 64)
    assert flex_kernel_options(mask, 128, 352, "FLASH") == {"BACKEND": "FLASH"}
    assert flex_kernel_options(mask, 128, 352, "TRITON") == {}  # 352 keys: not whole 128-wide tiles
    triton = trainer.cfg.model_copy(update={"train": trainer.cfg.train.model_copy(update={"flex_backend": "triton"})})
    HotPath(trainer.target, trainer.drafter, triton, trainer.device, fast=True)
    assert {a.flex_backend for a in attention} == {"TRITON"}


def sm100_head_dims(head_dim: int, head_dim_v: int, major: int, alignment: int) -> None:
    """flash-attn-4 4.0.0b40's `_validate_head_dims` on SM100 for equal q and v dims, as it refuses."""
    assert major == 10 and (8 <= head_dim <= 128 or head_dim == 256) and head_dim % alignment == 0, (
        f"(head_dim, head_dim_v)=({head_dim}, {head_dim_v}) is not supported on SM100/SM110.")


@pytest.fixture
def hopper(monkeypatch):
    """A Hopper GPU as far as the backend's checks ask; `hopper(installed, imports, validate)` sets up
    flash-attn-4 as hotpath's importlib sees it (only there: the rest of the process imports as before),
    with `validate` as its interface's head-dim rule (none: a release without one)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def flash(installed: bool, imports: bool = True, validate=None) -> None:
        def import_module(name: str) -> SimpleNamespace:
            if not imports:
                raise ImportError("No module named 'cutlass'")
            return SimpleNamespace(_validate_head_dims=validate) if validate else SimpleNamespace()

        fake = SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: object() if installed else None),
                               import_module=import_module)
        monkeypatch.setattr(hotpath, "importlib", fake)

    return flash


def test_auto_takes_flash_attention_where_it_can_run(hopper):
    gpu = torch.device("cuda", 0)
    hopper(installed=True)
    assert hotpath.resolve_flex_backend("auto", gpu, 128, "bf16") == ("flash", None)
    assert hotpath.resolve_flex_backend("triton", gpu, 128, "bf16") == ("triton", None)
    hopper(installed=False)  # not installed: triton, nothing to say
    assert hotpath.resolve_flex_backend("auto", gpu, 128, "bf16") == ("triton", None)
    assert hotpath.resolve_flex_backend("auto", gpu, 128, "fp32") == ("triton", None)
    assert hotpath.resolve_flex_backend("auto", torch.device("cpu"), 128, "bf16") == ("triton", None)


def test_auto_says_why_an_installed_flash_attention_is_not_used(hopper, monkeypatch):
    gpu = torch.device("cuda", 0)
    hopper(installed=True, imports=False)  # the CuTe DSL's wheel missing
    backend, note = hotpath.resolve_flex_backend("auto", gpu, 128, "bf16")
    assert backend == "triton" and "No module named 'cutlass'" in note and "using triton" in note
    hopper(installed=True)
    backend, note = hotpath.resolve_flex_backend("auto", gpu, 128, "fp32")  # its kernels take no fp32
    assert backend == "triton" and "bf16 inputs, not fp32 (train.precision)" in note
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100
    backend, note = hotpath.resolve_flex_backend("auto", gpu, 128, "bf16")
    assert backend == "triton" and "Hopper or newer" in note


def test_auto_asks_flash_attention_s_own_rule_whether_it_takes_the_head_dim(hopper, monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))  # a B200
    hopper(installed=True, validate=sm100_head_dims)
    assert hotpath.resolve_flex_backend("auto", gpu, 128, "bf16") == ("flash", None)
    assert hotpath.resolve_flex_backend("auto", gpu, 256, "bf16") == ("flash", None)
    backend, note = hotpath.resolve_flex_backend("auto", gpu, 192, "bf16")
    assert backend == "triton" and "do not take the drafter's head dim 192" in note and "SM100" in note
    with pytest.raises(UserError, match="head dim 192") as refused:
        hotpath.resolve_flex_backend("flash", gpu, 192, "bf16")
    assert "\n" not in str(refused.value)


def test_the_run_says_when_an_installed_flash_attention_is_not_used(tiny_config, hopper, monkeypatch, capsys):
    hopper(installed=True, imports=False)
    monkeypatch.setattr(loop, "HotPath", functools.partial(HotPath, fast=True))  # flex attention, as on a GPU
    trainer = Trainer(tiny_config(), show_console=False)
    trainer.prefetcher.close()
    assert trainer.hot.flex_backend == "triton"
    assert "warning: train.flex_backend auto: FlashAttention-4 is installed but unused" in capsys.readouterr().err
    assert [code for code, _, _ in trainer.pending_notes] == ["flex_backend_fallback"]  # into the log at run_start


def test_flash_attention_asked_for_is_refused_in_one_line_where_it_cannot_run(hopper):
    gpu = torch.device("cuda", 0)
    hopper(installed=False)
    with pytest.raises(UserError, match="pip install flash-attn-4"):
        hotpath.resolve_flex_backend("flash", gpu, 128, "bf16")
    hopper(installed=True, imports=False)
    with pytest.raises(UserError, match="does not import .*cutlass") as refused:
        hotpath.resolve_flex_backend("flash", gpu, 128, "bf16")
    assert "\n" not in str(refused.value)


def test_a_micro_batch_without_any_anchor_adds_nothing(tiny_config):
    trainer = Trainer(tiny_config(), show_console=False)
    try:
        batch = trainer.prefetcher.next()
    finally:
        trainer.prefetcher.close()
    batch.loss_mask = torch.zeros_like(batch.loss_mask)  # e.g. only prompts: nothing to learn
    batch = trainer.hot.to_device(trainer.hot.prepare(batch))
    vector, grad_norm = trainer.hot.accumulate([batch], step=1, rank=0, noise_std=0.0)
    assert batch.passes[0].packed.num_blocks == 0
    assert vector.abs().sum().item() == 0.0 and grad_norm.item() == 0.0


def _first_update(cfg) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    """(passes, stats vector, gradients) of update 1 on the first batch, from the same initial weights."""
    trainer = Trainer(cfg, show_console=False)
    try:
        batch = trainer.hot.to_device(trainer.prefetcher.next())
    finally:
        trainer.prefetcher.close()
    torch.manual_seed(0)
    trainer.drafter.reset_parameters()
    vector, _ = trainer.hot.accumulate([batch], step=1, rank=0, noise_std=0.0)
    return len(batch.passes), vector, [p.grad.clone() for p in trainer.drafter.parameters()]


def test_a_micro_batch_split_into_passes_gives_the_same_update(tiny_config):
    """Splitting by max_blocks_per_pass changes memory, not the loss or the gradients."""
    # num_anchors above every sequence's candidates: all layouts see the very same blocks
    one, v1, g1 = _first_update(tiny_config(train={"num_anchors": 1000, "max_blocks_per_pass": 100_000}))
    many, v2, g2 = _first_update(tiny_config(train={"num_anchors": 1000, "max_blocks_per_pass": 8}))
    assert one == 1 and many > 1
    torch.testing.assert_close(v2, v1, rtol=1e-5, atol=1e-4)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


def test_activation_checkpointing_changes_memory_not_the_update(tiny_config):
    _, v1, g1 = _first_update(tiny_config(train={"activation_checkpointing": False}))
    _, v2, g2 = _first_update(tiny_config(train={"activation_checkpointing": True}))
    torch.testing.assert_close(v2, v1)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(b, a)


def test_a_placeholder_pass_adds_nothing_to_the_update(tiny_config):
    """What a rank with fewer passes runs to keep step with the others: no loss, no gradient."""
    trainer = Trainer(tiny_config(), show_console=False)
    try:
        batch = trainer.hot.to_device(trainer.prefetcher.next())
    finally:
        trainer.prefetcher.close()
    v1, _ = trainer.hot.accumulate([batch], step=1, rank=0, noise_std=0.0)
    g1 = [p.grad.clone() for p in trainer.drafter.parameters()]
    trainer.drafter.zero_grad(set_to_none=True)
    filler = Pass.placeholder(trainer.cfg.drafter.block_size, trainer.hot.shapes)
    batch.passes.append(trainer.hot.pass_to_device(filler))
    v2, _ = trainer.hot.accumulate([batch], step=1, rank=0, noise_std=0.0)
    torch.testing.assert_close(v2, v1)
    for a, b in zip(g1, [p.grad for p in trainer.drafter.parameters()], strict=True):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("cap", [1e-4, 1e4])
def test_clip_gives_clip_grad_norm_s_gradients_over_and_under_the_cap(tiny_config, cap):
    """Under the cap `clip` leaves the gradients untouched, which is what clip_grad_norm_'s factor of 1 does."""
    trainer = Trainer(tiny_config(optim={"grad_clip": cap}), show_console=False)
    try:
        batch = trainer.hot.to_device(trainer.prefetcher.next())
    finally:
        trainer.prefetcher.close()
    vector, grad_norm = trainer.hot.accumulate([batch], step=1, rank=0, noise_std=0.0)
    params = [p for p in trainer.drafter.parameters() if p.grad is not None]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(reference, params, strict=True):
        r.grad = p.grad.clone()
    expected_norm = torch.nn.utils.clip_grad_norm_(reference, cap)
    _, norm = hotpath.figures_to_host(vector, grad_norm)
    trainer.hot.clip(grad_norm, norm)
    assert norm == expected_norm.item() and (norm > cap) == (cap < 1)
    for r, p in zip(reference, params, strict=True):
        assert torch.equal(p.grad, r.grad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the target stream is a CUDA stream")
def test_the_target_stream_changes_no_update(tiny_config):
    """The target's forward on its own stream, overlapping the step before it, gives the very same
    losses and weights over updates of several passes each as the forward on the main stream. With
    Triton's attention kernels, whatever is installed: FlashAttention-4's backward with a block mask is
    not deterministic on Hopper GPUs (docs/training.md), so its runs need not repeat bit for bit."""

    def three_updates(target_stream: bool) -> tuple[list[float], list[torch.Tensor]]:
        cfg = tiny_config(train={"device": "cuda", "precision": "bf16", "target_stream": target_stream,
                                 "max_blocks_per_pass": 8, "flex_backend": "triton"})  # compiled, as on a GPU
        trainer = Trainer(cfg, show_console=False)
        try:
            batches = [trainer.prefetcher.next() for _ in range(3)]
        finally:
            trainer.prefetcher.close()
        assert (trainer.hot.target_stream is not None) == target_stream
        assert all(len(b.passes) > 1 for b in batches)
        torch.manual_seed(0)
        trainer.drafter.reset_parameters()
        losses = [trainer.train_step([trainer.hot.to_device(b)])["loss"] for b in batches]
        return losses, [p.detach().clone() for p in trainer.drafter.parameters()]

    losses, weights = three_updates(True)
    losses_main, weights_main = three_updates(False)
    assert losses == losses_main
    assert all(torch.equal(a, b) for a, b in zip(weights, weights_main, strict=True))
