"""The training loop: accumulation is exact, resume continues the identical loss sequence, the run
folder and log hold what DESIGN.md promises."""

import dataclasses
import json
import statistics

import pytest
import torch

from blockdraft.data.prefetch import Batch
from blockdraft.telemetry.log import read_log
from blockdraft.telemetry.step_record import STEP_RECORD_FIELDS, TAU_EST_WINDOW, step_record
from blockdraft.train.checkpoint import MARKER, committed_checkpoints
from blockdraft.train.hooks import TrainingRun
from blockdraft.train.loop import Trainer


def _full_batch(trainer: Trainer, n: int, width: int, offset: int) -> Batch:
    rows = []
    i = offset
    while len(rows) < n:
        ids, _ = trainer.dataset.sample(i)
        if len(ids) >= width:
            rows.append(torch.tensor(ids[:width], dtype=torch.long))
        i += 1
    ids = torch.stack(rows)
    return Batch(input_ids=ids, loss_mask=torch.ones_like(ids, dtype=torch.bool),
                 lengths=torch.full((n,), width), sample_ids=list(range(n)), bucket=0, epoch=0,
                 index_in_epoch=0, epoch_progress=0.0, real_tokens=n * width, padded_tokens=n * width)


def test_two_micro_batches_equal_one_batch_of_both(tiny_config):
    # num_anchors above T-B+1 selects every candidate: both layouts see the very same blocks
    cfg = tiny_config(train={"num_anchors": 1000})
    t1, t2 = Trainer(cfg, show_console=False), Trainer(cfg, show_console=False)
    t2.drafter.load_state_dict(t1.drafter.state_dict())
    width = 40
    a, b = _full_batch(t1, 2, width, 0), _full_batch(t1, 3, width, 10)
    both = dataclasses.replace(a, input_ids=torch.cat([a.input_ids, b.input_ids]),
                               loss_mask=torch.cat([a.loss_mask, b.loss_mask]),
                               lengths=torch.cat([a.lengths, b.lengths]))
    r1 = t1.train_step([t1.hot.to_device(t1.hot.prepare(mb)) for mb in (a, b)])
    r2 = t2.train_step([t2.hot.to_device(t2.hot.prepare(both))])
    assert r1["loss"] == pytest.approx(r2["loss"], rel=1e-5)
    assert r1["loss_tokens"] == r2["loss_tokens"]
    assert r1["grad_norm"] == pytest.approx(r2["grad_norm"], rel=1e-4)
    for (name, p1), p2 in zip(t1.drafter.named_parameters(), t2.drafter.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, rtol=1e-4, atol=1e-6, msg=name)
    for t in (t1, t2):
        t.prefetcher.close()


def test_resume_continues_the_identical_loss_sequence(tiny_config, monkeypatch):
    full_cfg = tiny_config()
    full = Trainer(full_cfg, show_console=False).run()
    full_losses = [r["loss"] for r in read_log(full.run_dir / "log.jsonl") if r["kind"] == "step"]
    assert len(full_losses) == 6

    cfg = tiny_config(train={"out_dir": str(full.run_dir) + "-resumed"})
    first = Trainer(cfg, show_console=False)
    original = first.train_step

    def stop_after_three(micro):
        rec = original(micro)
        if first.step == 3:
            first.stop_reason = "SIGTERM"
        return rec

    monkeypatch.setattr(first, "train_step", stop_after_three)
    assert first.run().status == "interrupted"
    second = Trainer(cfg, resume=True, show_console=False)
    assert second.step == 3
    assert second.run().status == "completed"
    records = read_log(second.run_dir / "log.jsonl")
    resumed = [r["loss"] for r in records if r["kind"] == "step"]
    assert resumed[:3] == full_losses[:3]
    assert resumed[3:] == pytest.approx(full_losses[3:], rel=1e-6)
    starts = [r for r in records if r["kind"] == "run_start"]
    assert [s["resumed_from"] for s in starts] == [None, 3]


def test_a_step_record_off_the_definition_is_refused():
    values = dict.fromkeys(reversed(STEP_RECORD_FIELDS), 0.0)
    assert tuple(step_record(values)) == STEP_RECORD_FIELDS
    with pytest.raises(ValueError, match=r"missing \['mem_gb'\]"):
        step_record({k: v for k, v in values.items() if k != "mem_gb"})
    with pytest.raises(ValueError, match=r"not defined \['loss_ema'\]"):
        step_record({**values, "loss_ema": 1.0})


def test_run_folder_and_records(tiny_config):
    cfg = tiny_config()
    result = Trainer(cfg, show_console=False).run()
    run = result.run_dir
    assert (run / "config.yaml").is_file()
    ckpts = committed_checkpoints(run / "checkpoints")
    assert [c.name for c in ckpts] == ["step-000003", "step-000006"]
    assert all((c / MARKER).is_file() for c in ckpts)
    assert (run / "checkpoints" / "latest").resolve() == ckpts[-1].resolve()
    lines = (run / "log.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "run_start" and kinds[1] == "data" and kinds[-1] == "run_end"
    assert records[0]["flex_backend"] is None  # the CPU's dense attention: no flex kernels ran
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    required = {"lr", "loss", "loss_tokens", "acc", "acc_per_pos", "streak", "tau_est", "grad_norm", "clipped",
                "skipped", "skip_reason", "noise_std", "epoch", "epoch_progress", "progress", "samples", "tokens",
                "pad_frac", "buckets", "seq_len_max", "anchors", "step_time", "data_wait", "queue_depth",
                "tok_per_s", "mfu", "mem_gb", "time"}
    for r in steps:
        assert required <= r.keys()
        assert tuple(r)[3:] == STEP_RECORD_FIELDS  # after kind, time, step: the definition readers import
        assert len(r["acc_per_pos"]) == cfg.drafter.block_size - 1
        assert r["tau_est"] == pytest.approx(1 + r["streak"])
    assert steps[0]["lr"] == pytest.approx(cfg.optim.lr / 2)  # warmup_steps=2: update 1 uses peak/2
    assert steps[1]["lr"] == pytest.approx(cfg.optim.lr)
    assert records[-1]["status"] == "completed"


def test_in_training_eval_writes_measured_tau_beside_tau_est(tiny_config, tiny_corpus):
    cfg = tiny_config(train={"eval_every": 3}, eval={"prompts": [str(tiny_corpus)], "max_prompts": 2,
                                                      "max_new_tokens": 6, "prompt_tokens": 16})
    result = Trainer(cfg, show_console=False).run()
    records = read_log(result.run_dir / "log.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [3, 6]
    for e in evals:
        assert 1.0 <= e["tau"] <= cfg.drafter.block_size and e["prompts"] == 2 and e["mode"] == "path"
        assert e["lossless"] is True and e["eval_s"] >= 0
        assert sum(e["tau_hist"]) > 0
        # the training estimate over the updates before the eval, not one batch's
        before = [r["tau_est"] for r in records[: records.index(e)] if r["kind"] == "step"]
        assert e["tau_est_train"] == pytest.approx(statistics.median(before[-TAU_EST_WINDOW:]))


def test_skipped_held_out_prompt_lines_are_counted_in_the_log(tiny_config, tiny_corpus, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("{not json\n" + tiny_corpus.read_text().splitlines()[0] + "\n[1, 2]\n")
    cfg = tiny_config(train={"max_steps": 1}, eval={"prompts": [str(prompts)], "max_new_tokens": 4})
    result = Trainer(cfg, show_console=False).run()
    (note,) = [r for r in read_log(result.run_dir / "log.jsonl") if r.get("code") == "eval_prompts_skipped"]
    assert note["kind"] == "warning" and note["severity"] == "warning"
    assert "malformed_json: 1" in note["message"] and "not_an_object: 1" in note["message"]
    assert note["message"].endswith("; 1 kept")


def test_the_trainer_has_everything_the_hooks_read_of_it(tiny_config):
    trainer = Trainer(tiny_config(train={"max_steps": 1}), show_console=False)
    trainer.run()
    members = set(TrainingRun.__annotations__) | {n for n in vars(TrainingRun) if not n.startswith("_")}
    assert {"step", "log", "evaluate", "saves"} <= members
    assert [n for n in sorted(members) if not hasattr(trainer, n)] == []


def test_a_run_ending_between_eval_multiples_is_evaluated_at_its_last_update(tiny_config, tiny_corpus):
    """A time-budgeted run stops at an update the user could not choose: its final tau is still measured."""
    cfg = tiny_config(train={"eval_every": 3, "max_steps": 5}, eval={"prompts": [str(tiny_corpus)], "max_prompts": 2,
                                                                    "max_new_tokens": 6, "prompt_tokens": 16})
    result = Trainer(cfg, show_console=False).run()
    evals = [r for r in read_log(result.run_dir / "log.jsonl") if r["kind"] == "eval"]
    assert [e["step"] for e in evals] == [3, 5]
    assert result.last_eval["tau"] == evals[-1]["tau"]


def test_noise_applied_to_the_features_follows_the_schedule(tiny_config, monkeypatch):
    """The std of what is actually added to the fused features equals the logged noise_std, every step."""
    from blockdraft.schedule import noise_std_at

    cfg = tiny_config(noise={"std": 0.5, "warmup_steps": 2, "schedule": "cosine", "final_std": 0.1},
                      train={"max_steps": 5, "save_every": 100})
    trainer = Trainer(cfg, show_console=False)
    seen, taps = [], []
    real_forward, real_module = trainer.drafter.forward, trainer.hot.module.forward

    def remember(packed_taps, *args):
        taps.append(packed_taps)
        return real_module(packed_taps, *args)

    def spy(block_embeds, block_positions, ctx, ctx_positions, mask=None, cache=None):
        clean = trainer.drafter.fuse(taps[-1])
        seen.append((trainer.step + 1, float((ctx - clean).detach().std())))  # every pass of the update
        return real_forward(block_embeds, block_positions, ctx, ctx_positions, mask, cache)

    monkeypatch.setattr(trainer.drafter, "forward", spy)
    monkeypatch.setattr(trainer.hot.module, "forward", remember)
    logged = [trainer.train_step([trainer.hot.to_device(trainer.prefetcher.next())])["noise_std"] for _ in range(5)]
    expected = [noise_std_at(k, cfg.noise, trainer.total_steps) for k in range(1, 6)]
    assert logged == pytest.approx(expected)
    assert expected[0] == pytest.approx(0.25) and expected[-1] == pytest.approx(0.1)
    assert sorted({k for k, _ in seen}) == [1, 2, 3, 4, 5]
    for k, std in seen:
        assert std == pytest.approx(expected[k - 1], rel=0.05)
    trainer.prefetcher.close()


def test_gamma_far_from_the_block_size_default_is_warned_at_start(tiny_config):
    """The seed's gamma 4 at B=16 (default 7): a `warning` record before training gets far."""
    cfg = tiny_config(drafter={"block_size": 16}, loss={"weighting": "exp_decay", "gamma": 4.0}, data={"max_len": 64},
                      train={"max_steps": 3, "save_every": 100})
    result = Trainer(cfg, show_console=False).run()
    warnings = [r for r in read_log(result.run_dir / "log.jsonl") if r["kind"] == "warning"]
    assert any(w["code"] == "loss_decay_gamma" and w["step"] <= 2 for w in warnings), warnings
