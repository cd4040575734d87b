import json

from blockdraft.doctor.detectors import diagnose
from blockdraft.doctor.records import parse_log_bytes

from ..conftest import codes, find


def _run(lrs, config=None, extra=None):
    recs = []
    if config is not None:
        recs.append({"kind": "run_start", "step": 0, "config": config, **(extra or {})})
    recs += [{"kind": "step", "step": i + 1, "lr": lr, "loss": 1.0} for i, lr in enumerate(lrs)]
    return diagnose(parse_log_bytes("".join(json.dumps(r) + "\n" for r in recs).encode(), {}))


def _config(**optim):
    base = {"lr": 6e-4, "betas": [0.9, 0.95], "warmup_steps": 10, "schedule": "constant", "min_lr_ratio": 0.0}
    base.update(optim)
    return {"optim": base, "drafter": {"block_size": 16}, "loss": {"weighting": "exp_decay", "gamma": None}}


def test_first_update_at_peak_lr_without_config():
    """The seed incident: step 1 at 6e-4, step 2 at 6.43e-7, then the warmup."""
    lrs = [6e-4] + [6e-4 * k / 933 for k in range(1, 300)]
    found = find(_run(lrs), "warmup_first_step")
    assert found and found[0].steps == (1, 1) and found[0].severity == "warning"


def test_first_update_checked_against_config():
    good = [6e-4 * min(1, k / 10) for k in range(1, 100)]
    assert not codes(_run(good, _config(), {"total_steps": 99, "warmup_steps": 10}))
    late = [6e-4 * min(1, (k - 1) / 10) for k in range(1, 100)]
    findings = _run(late, _config(), {"total_steps": 99, "warmup_steps": 10})
    assert "warmup_first_step" in codes(findings, "warning")
    assert "lr_schedule_mismatch" not in codes(findings)


def test_lr_schedule_mismatch_long_warmup(run_factory):
    found = []
    for seed in range(4):
        run, _, findings = run_factory(seed, ("lr_schedule_mismatch",), n_steps=1500)
        found.append("lr_schedule_mismatch" in codes(findings, "warning"))
    assert all(found)


def test_lr_restart_without_config():
    lrs = [1e-3 * min(1, k / 50) for k in range(1, 1000)] + [1e-3 * min(1, k / 50) for k in range(1, 500)]
    found = find(_run(lrs), "lr_schedule_mismatch")
    assert found and found[0].steps[0] == 1000


def test_noise_warmup_that_does_nothing(run_factory):
    _, _, findings = run_factory(2, ("noise_schedule_flat",))
    assert "noise_schedule_flat" in codes(findings, "warning")


def test_gamma_and_betas(run_factory):
    _, _, findings = run_factory(4, ("loss_decay_gamma",))
    gamma = find(findings, "loss_decay_gamma")
    assert gamma and gamma[0].evidence["expected_gamma"] in (4.0, 7.0)
    _, _, findings = run_factory(4, ("optimizer_betas",))
    betas = find(findings, "optimizer_betas")
    assert betas and betas[0].severity == "warning" and betas[0].evidence["beta2"] == 0.999


def test_beta2_0999_warns_even_before_any_spike():
    """The seed incident's betas: the setting itself is the cause to fix, spikes or not (yet)."""
    findings = _run(
        [1e-4] * 50,
        _config(betas=[0.9, 0.999], schedule="constant", warmup_steps=0),
        {"total_steps": 50, "warmup_steps": 0},
    )
    betas = find(findings, "optimizer_betas")
    assert [f.severity for f in betas] == ["warning"]
    assert "spikes" not in betas[0].summary


def test_two_step_warmup_starting_at_half_peak_is_correct():
    """W=2: update 1 uses lr*1/2, exactly half the peak, and must not be flagged."""
    lrs = [5e-4, 1e-3, 1e-3, 1e-3]
    assert not codes(_run(lrs, _config(lr=1e-3, warmup_steps=2), {"total_steps": 4, "warmup_steps": 2}))


def test_an_lr_replanned_by_the_time_budget_is_no_schedule_mismatch():
    """train.max_minutes re-plans total_steps late in a run (3000 -> 2200 after update 2000): each update's
    LR is the schedule of the plan in force then, as the trainer computes it, and the doctor expects that."""
    from blockdraft.schedule import lr_curve

    def lr(k: int) -> float:
        return float(lr_curve([k], 6e-4, 100, 3000 if k <= 2000 else 2200, "cosine", 0.0)[0])

    recs = [{"kind": "run_start", "step": 0, "config": _config(schedule="cosine", warmup_steps=100),
             "total_steps": 3000, "warmup_steps": 100}]
    recs += [{"kind": "step", "step": k, "lr": lr(k), "loss": 1.0} for k in range(1, 2001)]
    recs.append({"kind": "warning", "step": 2000, "code": "schedule_planned", "severity": "info", "message": "",
                 "total_steps": 2200, "warmup_steps": 100})
    recs += [{"kind": "step", "step": k, "lr": lr(k), "loss": 1.0} for k in range(2001, 2201)]

    def findings(records):
        return diagnose(parse_log_bytes("".join(json.dumps(r) + "\n" for r in records).encode(), {}))

    assert "lr_schedule_mismatch" not in codes(findings(recs))
    bent = [dict(r, lr=r["lr"] * 1.5) if r["kind"] == "step" and 1000 < r["step"] <= 1100 else r for r in recs]
    found = find(findings(bent), "lr_schedule_mismatch")
    assert found and found[0].steps[0] == 1001  # a real departure is still caught
