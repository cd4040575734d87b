from blockdraft.doctor.detectors import diagnose

from ..conftest import codes, find, log_of, step_records


def test_checkpoint_that_held_the_loop():
    recs = step_records(400)
    for r in recs[200:]:
        r["time"] += 150.0
    recs.insert(200, {"kind": "checkpoint", "step": 200, "time": 199.5, "stall_s": 150.0, "committed": True})
    found = find(diagnose(log_of(recs)), "checkpoint_stall")
    assert found and found[0].evidence["max_stall_s"] == 150.0 and found[0].evidence["logging_only"] == 0


def test_checkpoint_where_only_logging_stopped():
    """The seed incident: training went on, the monitor was blocked, records 2001-2026 never written."""
    recs = [r for r in step_records(3000, dt=10.0) if not 2000 < r["step"] < 2027]
    recs.insert(2000, {"kind": "checkpoint", "step": 2000, "time": 19990.5, "stall_s": 0.2})
    findings = diagnose(log_of(recs))
    found = find(findings, "checkpoint_stall")
    assert found and found[0].evidence["missing_records"] == 26 and found[0].evidence["logging_only"] == 1
    assert "logging_gap" not in codes(findings)


def test_unexplained_stall_and_missing_records():
    recs = step_records(1000)
    for r in recs[500:]:
        r["time"] += 300.0
    recs = [r for r in recs if not 800 < r["step"] < 850]
    found = find(diagnose(log_of(recs)), "logging_gap")
    assert found and found[0].evidence["stalls"] == 1 and found[0].evidence["missing_records"] == 49


def test_eval_pause_is_explained():
    recs = step_records(1000)
    for r in recs[500:]:
        r["time"] += 120.0
    recs.insert(500, {"kind": "eval", "step": 500, "time": 620.0, "tau": 3.0})
    assert "logging_gap" not in codes(diagnose(log_of(recs)))


def test_window_artifact_in_a_windowed_log(run_factory):
    run, _, findings = run_factory(3, ("window_artifact",), style=None)
    found = find(findings, "window_artifact")
    assert run.style == "windowed" and found
    assert found[0].evidence["window_steps"] <= 2
    assert "loss_spike" not in codes(findings)


def test_periodic_pauses_without_records_are_scheduled_work():
    """A foreign log's evals every 500 steps pause training but write no record: info, not a warning."""
    recs = step_records(3000, dt=0.5)
    for r in recs:
        r["time"] += 45.0 * (r["step"] // 500)
    found = find(diagnose(log_of(recs)), "logging_gap")
    assert [f.severity for f in found] == ["info"] and found[0].evidence["period_steps"] == 500


def test_one_odd_stall_among_periodic_ones_still_warns():
    recs = step_records(3000, dt=0.5)
    for r in recs:
        r["time"] += 45.0 * (r["step"] // 500) + (120.0 if r["step"] > 1234 else 0.0)
    found = find(diagnose(log_of(recs)), "logging_gap")
    assert sorted(f.severity for f in found) == ["info", "warning"]
    warn = next(f for f in found if f.severity == "warning")
    assert warn.steps == (1234, 1235)


def test_a_resume_on_fewer_gpus_is_not_a_drift_nor_an_epoch_bug():
    """2 GPUs for 300 updates, then resumed on 1: tokens per update and epoch length halve and double
    there, for a reason the run_start records state (seen on 2x H200, 2026-11-29)."""

    def run_start(step, world):
        return {"kind": "run_start", "step": step, "time": float(step), "world_size": world,
                "batches_per_epoch": 600, "total_steps": 600,
                "config": {"train": {"grad_accum": 1, "epochs": 6, "max_steps": 600}}}

    def steps(lo, hi, world):
        return [{"kind": "step", "step": i, "time": float(i), "step_time": 0.1, "data_wait": 0.0, "loss": 1.0,
                 "tokens": 2048 * world, "epoch": 0, "epoch_progress": i * world / 600, "progress": i / 600}
                for i in range(lo, hi)]

    recs = [run_start(0, 2), *steps(1, 301, 2), run_start(300, 1), *steps(301, 601, 1)]
    found = codes(diagnose(log_of(recs)))
    assert "throughput_drift" not in found and "epoch_accounting" not in found, found
    slowing = [{**r, "step_time": 0.1 * (1 + r["step"] / 300)} if r["kind"] == "step" else r for r in recs]
    assert "throughput_drift" in codes(diagnose(log_of(slowing)))  # a real slowdown still shows through


def _with_graphs(recs: list[dict], grows_at: dict[int, int], resume_at: int | None = None) -> list[dict]:
    """graphs_compiled per record: +1 on each of the first 5 updates of a process, + grows_at[step]."""
    count, start = 0, recs[0]["step"]
    for r in recs:
        if r["step"] == resume_at:
            count, start = 0, r["step"]
        if r["step"] - start < 5:
            count += 1
        count += grows_at.get(r["step"], 0)
        r["graphs_compiled"] = count
    return recs


def test_graphs_compiled_after_warm_up_are_late_recompiles_and_explain_their_stall():
    recs = _with_graphs(step_records(600), {300: 2, 450: 1}, resume_at=400)
    for r in recs[299:]:
        r["time"] += 80.0  # the recompile's stall at step 300
    recs[299]["step_time"] = 81.0
    findings = diagnose(log_of(recs))
    (found,) = find(findings, "late_recompile")
    assert found.evidence["graphs"] == 3 and found.evidence["updates"] == 2 and found.evidence["last_step"] == 450
    assert found.evidence["lost_s"] == 80.0 and found.severity == "warning"
    assert "logging_gap" not in codes(findings)  # the stall is accounted for


def test_compiling_only_in_warm_up_is_no_finding():
    recs = _with_graphs(step_records(300), {}, resume_at=150)  # a resume compiles again in its own warm-up
    assert "late_recompile" not in codes(diagnose(log_of(recs)))


def test_after_a_logged_warm_up_a_graph_compiled_in_the_first_updates_is_already_late():
    """The trainer compiles every pass shape of its plan before update 1 and logs a `warmup` record:
    from then on any growth is a shape the warm-up missed, however early."""
    recs = step_records(300)
    for r in recs:  # 9 graphs from the warm-up, one more at update 10; the resume at 150 compiles 3 anew
        r["graphs_compiled"] = (9 + (r["step"] >= 10)) if r["step"] <= 150 else min(r["step"] - 150, 3)
    assert "late_recompile" not in codes(diagnose(log_of(recs)))  # inside the first 20 updates
    recs.insert(0, {"kind": "warmup", "step": 0, "time": -1.0, "passes": 24, "seconds": 117.0,
                    "graphs_compiled": 9})
    (found,) = find(diagnose(log_of(recs)), "late_recompile")
    assert found.steps == (10, 10) and found.evidence["graphs"] == 1
    assert found.evidence["after_logged_warmup"] == 1  # the resumed process logged none: its 3 are warm-up


def test_late_recompiles_in_a_synthetic_run(run_factory):
    run, _, findings = run_factory(4, ("late_recompile",))
    (found,) = find(findings, "late_recompile")
    assert found.severity == "warning" and found.evidence["updates"] >= 3
    assert found.steps == run.planted[0].steps and "logging_gap" not in codes(findings)


def test_a_resumed_process_compiling_more_than_the_first_is_still_in_warm_up():
    recs = step_records(300)
    for r in recs:
        r["graphs_compiled"] = min(r["step"], 3) if r["step"] <= 150 else 10 + min(r["step"] - 150, 4)
    recs.insert(150, {"kind": "run_start", "step": 150, "time": 149.5, "resumed_from": 150})
    assert "late_recompile" not in codes(diagnose(log_of(recs)))
