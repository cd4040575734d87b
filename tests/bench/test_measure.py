"""The bench measures what training runs: its models are built as training builds them (the drafter's
mask token is the one training resolves for the same target folder), and it times an update in
training's order."""

import json

import pytest
import torch

from blockdraft import device as device_module
from blockdraft.bench import measure, shapes
from blockdraft.bench.measure import build_models
from blockdraft.bench.shapes import target_config, target_tokenizer
from blockdraft.cli import main
from blockdraft.config import build_config
from blockdraft.errors import UserError
from blockdraft.train import hotpath

CFG = build_config({"target": {"path": "<bench>"}, "drafter": {"num_layers": 1, "target_layer_ids": [0, 2]},
                    "train": {"device": "cpu"}}, [])


@pytest.mark.parametrize("folder, mask", [("tiny_target", "<|MASK|>"), ("tiny_llama_target", "<spare>")])
def test_a_target_folder_gives_the_bench_drafter_the_mask_token_training_picks(folder, mask, request):
    path = str(request.getfixturevalue(folder))
    tokenizer = target_tokenizer(path)
    hf_cfg = target_config(None, path)
    _, drafter = build_models(CFG, hf_cfg, torch.device("cpu"), tokenizer)
    assert tokenizer.convert_ids_to_tokens(drafter.mask_token_id) == mask
    assert drafter.mask_token_id != hf_cfg.vocab_size - 1  # not just the last row


def test_a_named_shape_or_a_config_alone_has_no_tokenizer_and_masks_with_the_last_row(tmp_path):
    hf_cfg = target_config("tiny", None)
    hf_cfg.save_pretrained(tmp_path)
    assert target_tokenizer(None) is None and target_tokenizer(str(tmp_path)) is None
    _, drafter = build_models(CFG, hf_cfg, torch.device("cpu"))
    assert drafter.mask_token_id == hf_cfg.vocab_size - 1


def test_a_folder_s_tokenizer_is_read_once_a_process(tiny_target, monkeypatch):
    """`bench/peer_nemo.py --ours` asks for it for NeMo's runs and again for ours."""
    reads = []
    read = shapes.load_tokenizer
    monkeypatch.setattr(shapes, "load_tokenizer", lambda folder: reads.append(folder) or read(folder))
    target_tokenizer.cache_clear()
    assert target_tokenizer(str(tiny_target)) is target_tokenizer(str(tiny_target))
    assert reads == [str(tiny_target)]


def test_an_update_copies_its_figures_to_the_host_before_the_optimizer_steps(monkeypatch, capsys):
    """Training waits for the update's figures (the guard reads them) before AdamW steps; an update the
    bench timed the other way round would hide that wait."""
    events = []
    copy, step = hotpath.figures_to_host, torch.optim.AdamW.step

    def recorded_copy(*args):
        events.append("figures")
        return copy(*args)

    def recorded_step(self, *args, **kwargs):
        events.append("step")
        return step(self, *args, **kwargs)

    monkeypatch.setattr(hotpath, "figures_to_host", recorded_copy)
    monkeypatch.setattr(torch.optim.AdamW, "step", recorded_step)
    assert main(["bench", "--target-shape", "tiny", "--lengths", "full", "--steps", "2", "--warmup", "1",
                 "--seq-len", "64", "--micro-batch", "1", "--device", "cpu", "--no-check", "--json",
                 "train.num_anchors=4"]) == 0
    assert json.loads(capsys.readouterr().out)["profiles"][0]["steps"] == 2
    assert events == ["figures", "step"] * 3  # the warm-up update and the two measured


def test_measured_updates_wait_only_where_training_waits(monkeypatch, capsys):
    """No device synchronisation between one update and the next, as in training: an update's window
    starts at the end of the one before, so the GPU time of that one's optimizer step is paid in it
    (a synchronisation before each update would leave it out of every window)."""
    events = []
    sync, copy, step = measure.synchronize, hotpath.figures_to_host, torch.optim.AdamW.step

    def recorded(name, fn):
        def call(*args, **kwargs):
            events.append(name)
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(measure, "synchronize", recorded("sync", sync))
    monkeypatch.setattr(hotpath, "figures_to_host", recorded("figures", copy))
    monkeypatch.setattr(torch.optim.AdamW, "step", recorded("step", step))
    assert main(["bench", "--target-shape", "tiny", "--lengths", "full", "--steps", "3", "--warmup", "1",
                 "--seq-len", "64", "--micro-batch", "1", "--device", "cpu", "--no-check", "--json",
                 "train.num_anchors=4"]) == 0
    assert json.loads(capsys.readouterr().out)["profiles"][0]["steps"] == 3
    first, last = events.index("figures"), len(events) - events[::-1].index("step")
    assert events[first:last] == ["figures", "step"] * 4  # the warm-up update and the three measured
    assert "sync" in events[:first]  # the clock starts from an idle device


def test_a_target_too_big_for_the_free_memory_is_refused_before_it_is_built(monkeypatch):
    """A Qwen3-8B shape in fp32 (8.19e9 weights) on a machine with 20 GB free: one line naming both
    figures, and no memory taken (the weights are counted on the meta device)."""
    monkeypatch.setattr(device_module, "free_memory_bytes", lambda device: 20 * 10**9)
    with pytest.raises(UserError, match=r"^the target's weights in float32 take 32\.8 GB and this machine has 20\.0 GB "
                                        r"free: choose a smaller --target-shape"):
        build_models(CFG, target_config("qwen3-8b", None), torch.device("cpu"))
    build_models(CFG, target_config("tiny", None), torch.device("cpu"))  # 1.4 MB fits


def test_the_bench_refuses_a_target_that_does_not_fit_in_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(device_module, "free_memory_bytes", lambda device: 1000)
    assert main(["bench", "--target-shape", "tiny", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "the target's weights in float32 take" in err and "\n" not in err
