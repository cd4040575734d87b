"""Training-serving parity: a checkpoint exported with `blockdraft export` and measured with
`blockdraft eval` gives the very tau, histogram, per-round acceptances and tokens that the trainer's
in-training eval logged for the same step, on the same prompts (fp32 on CPU)."""

import json

import pytest
import torch

import blockdraft.evaluate.runner as runner
from blockdraft.cli import main
from blockdraft.model.export import load_drafter
from blockdraft.telemetry.log import read_log
from blockdraft.train.checkpoint import load_checkpoint
from blockdraft.train.loop import Trainer

EVAL = {"max_prompts": 3, "max_new_tokens": 12, "prompt_tokens": 16}


def _record_generations(monkeypatch) -> list[list[tuple[list[int], list[int]]]]:
    """Every sweep's (tokens, per-round acceptance) of each prompt, as `summarize` receives them."""
    seen: list[list[tuple[list[int], list[int]]]] = []
    real = runner.summarize

    def spy(gens, refs, *args):
        seen.append([(g.tokens, g.acceptance) for g in gens])
        return real(gens, refs, *args)

    monkeypatch.setattr(runner, "summarize", spy)
    return seen


@pytest.mark.parametrize("batch_size", [1, 2])
def test_exported_drafter_measures_what_the_in_training_eval_logged(
    batch_size, tiny_config, tiny_target, tiny_corpus, tmp_path, monkeypatch, capsys
):
    cfg = tiny_config(loss={"labels": "target"}, optim={"lr": 3e-3}, train={"eval_every": 3, "max_steps": 6},
                      eval={"prompts": [str(tiny_corpus)], "batch_size": batch_size, **EVAL})
    seen = _record_generations(monkeypatch)
    run_dir = Trainer(cfg, show_console=False).run().run_dir
    logged = {r["step"]: r for r in read_log(run_dir / "log.jsonl") if r["kind"] == "eval"}
    assert list(logged) == [3, 6] and len(seen) == 2
    in_training = dict(zip(logged, seen, strict=True))
    assert any(max(acc) >= 2 for _, acc in in_training[6]), in_training[6]  # drafts accepted: tau says something

    for step, record in logged.items():
        ckpt, out = run_dir / "checkpoints" / f"step-{step:06d}", tmp_path / f"export-{step}"
        assert main(["export", str(ckpt), "--out", str(out), "--dtype", "float32"]) == 0
        exported = load_drafter(out).state_dict()
        for name, tensor in load_checkpoint(ckpt, with_training_state=False).drafter_state.items():
            assert torch.equal(exported[name], tensor), name  # the export round-trips bit for bit
        capsys.readouterr()
        seen.clear()
        argv = ["eval", "--target", str(tiny_target), "--drafter", str(out), "--prompts", str(tiny_corpus),
                "--limit", str(EVAL["max_prompts"]), "--max-new-tokens", str(EVAL["max_new_tokens"]),
                "--prompt-tokens", str(EVAL["prompt_tokens"]), "--batch-size", str(batch_size), "--json",
                "--device", "cpu"]
        assert main(argv) == 0
        report = json.loads(capsys.readouterr().out)
        assert seen == [in_training[step]]
        assert report["prompts"] == record["prompts"] == EVAL["max_prompts"]
        assert report["tau"] == record["tau"] and report["tau_hist"] == record["tau_hist"]
        assert report["tokens"] == record["tokens"] and report["lossless"] is record["lossless"] is True
