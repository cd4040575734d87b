"""`train.fp8_linears`: the drafter's linear layers multiply in FP8 while training, on the same fp32
Parameters, and nothing that decodes or saves sees anything but plain layers."""

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import Qwen3Config

from blockdraft.errors import UserError
from blockdraft.model.drafter import DFlashDrafter, drafter_config
from blockdraft.telemetry.log import read_log
from blockdraft.train import fp8, loop
from blockdraft.train.loop import Trainer


@pytest.fixture
def float8_linear() -> type:
    """torchao's FP8 layer (CI installs torchao; the test extra leaves it out, see .ci/run)."""
    return pytest.importorskip("torchao.float8.float8_linear").Float8Linear


def tiny_drafter() -> DFlashDrafter:
    torch.manual_seed(0)
    tc = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, intermediate_size=64)
    return DFlashDrafter(drafter_config(tc, 2, 4, [0, 2], 63))


def drafter_loss(drafter: DFlashDrafter) -> torch.Tensor:
    """A forward and a loss through every layer: 3 blocks of 4 after 8 context positions, the normed
    outputs [1, 12, 32] read through a fixed random direction (their mean square is 1 whatever the weights)."""
    g = torch.Generator().manual_seed(1)
    taps = torch.randn(1, 8, 2 * 32, generator=g)
    blocks = torch.randn(1, 12, 32, generator=g)
    direction = torch.randn(1, 12, 32, generator=g)
    out = drafter(blocks, torch.arange(8, 20)[None], drafter.fuse(taps), torch.arange(8)[None], None)
    return (out * direction).sum()


def test_fp8_linears_multiply_in_fp8_on_the_same_parameters(float8_linear):
    drafter = tiny_drafter()
    plain = tiny_drafter()
    linears = sum(isinstance(m, nn.Linear) for m in drafter.modules())
    params = list(drafter.named_parameters())
    assert fp8.to_fp8_linears(drafter) == linears == 15  # fc + 2 layers x (q, k, v, o, gate, up, down)
    # the same Parameter objects under the same names: AdamW and checkpoints see no change
    assert [(n, id(p)) for n, p in drafter.named_parameters()] == [(n, id(p)) for n, p in params]
    assert list(drafter.state_dict()) == list(plain.state_dict())

    loss, loss_plain = drafter_loss(drafter), drafter_loss(plain)
    loss.backward()
    loss_plain.backward()
    rel = abs(loss.item() - loss_plain.item()) / abs(loss_plain.item())
    assert 0 < rel < 0.05  # FP8's rounding, and nothing else
    for (name, p), q in zip(drafter.named_parameters(), plain.parameters(), strict=True):
        cos = torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0)
        assert cos > 0.95, name


def test_layers_whose_dims_fp8_cannot_take_stay_plain(float8_linear):
    model = nn.Sequential(nn.Linear(32, 24), nn.Linear(24, 32), nn.Linear(32, 48))
    assert fp8.to_fp8_linears(model) == 1
    assert [type(m) is float8_linear for m in model] == [False, False, True]


def test_fp8_linears_are_refused_in_one_line_where_they_cannot_run(tiny_config, monkeypatch):
    with pytest.raises(UserError, match=r"compute capability 8.9 or newer \(this device: cpu\)"):
        fp8.require_fp8(torch.device("cpu"))
    cfg = tiny_config(train={"fp8_linears": True})
    with pytest.raises(UserError, match="train.fp8_linears"):
        Trainer(cfg, show_console=False)
    assert not Path(cfg.train.out_dir).exists()  # refused before anything is made or loaded

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100
    with pytest.raises(UserError, match="compute capability 8.9"):
        fp8.require_fp8(gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(fp8.importlib.util, "find_spec", lambda name: object())  # torchao installed
    fp8.require_fp8(gpu)
    monkeypatch.setattr(fp8.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"needs torchao: pip install 'blockdraft\[fp8\]'"):
        fp8.require_fp8(gpu)


def test_the_held_out_evaluation_decodes_with_plain_layers(tiny_config, tiny_corpus, monkeypatch, float8_linear):
    """FP8 is a training arithmetic: tau is measured on the drafter as it is exported and served."""
    cfg = tiny_config(train={"max_steps": 1}, eval={"prompts": [str(tiny_corpus)], "max_prompts": 1})
    trainer = Trainer(cfg, show_console=False)
    trainer.prefetcher.close()
    fp8.to_fp8_linears(trainer.drafter)
    trainer.cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"fp8_linears": True})})
    seen = []
    monkeypatch.setattr(loop, "evaluate_modes", lambda target, drafter, *a, **k: seen.append(drafter) or ((None,), {}))
    trainer.evaluate()
    (decoder,) = seen
    assert decoder is not trainer.drafter and not any(isinstance(m, float8_linear) for m in decoder.modules())
    for (name, a), b in zip(decoder.state_dict().items(), trainer.drafter.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < fp8.FP8_MIN_CAPABILITY,
                    reason="FP8 matmuls need a GPU of compute capability 8.9 or newer")
def test_a_run_with_fp8_linears_trains_and_evaluates_on_the_gpu(tiny_config, tiny_corpus, float8_linear):
    cfg = tiny_config(train={"device": "cuda", "precision": "bf16", "fp8_linears": True, "eval_every": 3},
                      eval={"prompts": [str(tiny_corpus)], "max_prompts": 2, "max_new_tokens": 6, "prompt_tokens": 16})
    trainer = Trainer(cfg, show_console=False)
    assert sum(isinstance(m, float8_linear) for m in trainer.drafter.modules()) == 1 + 7 * cfg.drafter.num_layers
    result = trainer.run()
    records = read_log(result.run_dir / "log.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == cfg.train.max_steps and all(torch.isfinite(torch.tensor(r["loss"])) for r in steps)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [3, 6] and all(e["lossless"] for e in evals)
    assert result.status == "completed"
