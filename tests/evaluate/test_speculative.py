"""Speculative decoding is lossless: its output equals target-only greedy decoding token for token,
with an untrained drafter (everything rejected) and a trained one (multi-token acceptances)."""

import json

import pytest
import torch

from blockdraft.cli import main
from blockdraft.evaluate.speculative import measure_tau, speculative_greedy, target_greedy
from blockdraft.model.export import load_drafter
from blockdraft.model.target import load_target
from blockdraft.train.loop import Trainer


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(2, 200, (n,), generator=g).tolist() for n in (5, 9, 17)]


def test_untrained_drafter_output_equals_target_greedy(tiny_config, prompts):
    trainer = Trainer(tiny_config(train={"max_steps": 1}), show_console=False)
    for p in prompts:
        ref = target_greedy(trainer.target, p, 24, eos_id=None)
        spec = speculative_greedy(trainer.target, trainer.drafter, p, 24, eos_id=None)
        assert spec.tokens == ref.tokens
        assert all(1 <= a <= trainer.drafter.block_size for a in spec.acceptance)
    trainer.prefetcher.close()


def test_trained_drafter_accepts_blocks_and_stays_lossless(tiny_config, prompts, tmp_path):
    # The random tiny target's greedy output loops; a drafter trained on such text with the target's
    # own argmax as labels accepts several tokens per round, exercising the accept/crop/bonus bookkeeping.
    trainer = Trainer(tiny_config(train={"max_steps": 1}), show_console=False)
    corpus = tmp_path / "loops.jsonl"
    tok = trainer.tokenizer
    with corpus.open("w") as fh:
        for seed in range(40):
            p = torch.randint(2, 200, (6,), generator=torch.Generator().manual_seed(seed)).tolist()
            ids = p + target_greedy(trainer.target, p, 58, eos_id=None).tokens
            fh.write(json.dumps({"text": tok.decode(ids)}) + "\n")
    trainer.prefetcher.close()
    cfg = tiny_config(data={"train_files": [str(corpus)]}, loss={"labels": "target"},
                      optim={"lr": 3e-3}, train={"max_steps": 60, "num_anchors": 32, "save_every": 1000},
                      drafter={"num_layers": 1, "block_size": 4})
    result = Trainer(cfg, show_console=False).run()
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "x"), "--dtype", "float32"]) == 0
    drafter = load_drafter(tmp_path / "x")
    target, _, _ = load_target(cfg.target.path, drafter.target_layer_ids, torch.device("cpu"))
    report = measure_tau(target, drafter, prompts, 40, eos_id=None)
    assert report.lossless is True
    assert sum(report.tau_hist[2:]) > 0, report.tau_hist  # rounds that accepted drafted tokens
