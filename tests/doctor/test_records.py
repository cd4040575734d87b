import json
import math

import numpy as np
import pytest

from blockdraft.doctor import records
from blockdraft.doctor.fields import parse_mapping
from blockdraft.doctor.readers import load_run
from blockdraft.doctor.records import parse_log_bytes
from blockdraft.doctor.run import MIXED_BUCKET
from blockdraft.errors import UserError
from tests.doctor import synthetic

from .conftest import write_records


def _step(step: int, **extra) -> dict:
    rec = {
        "kind": "step",
        "time": 1000.0 + step,
        "step": step,
        "lr": 1e-4,
        "loss": 2.0,
        "acc": 0.1,
        "buckets": [step % 3],
    }
    rec.update(extra)
    return rec


def test_run_folder_means_its_log(tmp_path):
    write_records(tmp_path / "log.jsonl", [_step(i) for i in range(1, 6)])
    run = load_run(tmp_path)
    assert len(run.steps) == 5
    assert run.steps.steps.tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("make", ["missing", "empty_dir", "empty_file", "garbage"])
def test_user_errors(tmp_path, make):
    target = tmp_path / "x"
    if make == "empty_dir":
        target.mkdir()
    elif make == "empty_file":
        target.write_text("")
    elif make == "garbage":
        target.write_text("not json\nstill not\n")
    with pytest.raises(UserError):
        load_run(target)


def test_truncated_last_line_is_dropped_not_fatal(tmp_path):
    path = write_records(tmp_path / "log.jsonl", [_step(i) for i in range(1, 5)])
    with path.open("a") as fh:
        fh.write('{"kind": "step", "step": 5, "loss": 1.')
    run = load_run(path)
    assert len(run.steps) == 4
    assert run.truncated_tail and run.bad_lines == 0


def test_bad_line_in_the_middle_is_counted(tmp_path):
    lines = [json.dumps(_step(i)) for i in range(1, 5)]
    lines.insert(2, "{oops")
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    run = load_run(path)
    assert len(run.steps) == 4 and run.bad_lines == 1


def test_missing_fields_are_nan_columns():
    data = "".join(json.dumps({"kind": "step", "step": i, "loss": 1.0}) + "\n" for i in range(1, 4)).encode()
    run = parse_log_bytes(data, {})
    assert run.steps.has("loss") and not run.steps.has("acc")
    assert np.isnan(run.steps.get("queue_depth")).all()


def test_foreign_log_with_map_and_aliases():
    recs = [{"global_step": i, "train/loss": 3.0 - i * 0.01, "learning_rate": 1e-4} for i in range(1, 50)]
    data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    run = parse_log_bytes(data, parse_mapping("loss=train/loss,step=global_step"))
    assert len(run.steps) == 49
    assert run.steps.get("loss")[0] == pytest.approx(2.99)
    assert run.steps.get("lr")[0] == pytest.approx(1e-4)  # alias learning_rate -> lr


@pytest.mark.parametrize("text", ["loss", "=x", "loss="])
def test_bad_mapping_is_a_user_error(text):
    with pytest.raises(UserError):
        parse_mapping(text)


def test_bulk_and_record_paths_agree():
    """The JSONL bulk decoder and the record path (live doctor, foreign readers) build the same table."""
    run = synthetic.generate(1, anomalies=["nonfinite", "skipped_steps"], n_steps=1500, style="ours")
    recs = run.records
    for r in recs[100:110]:
        if r["kind"] == "step":
            r["buckets"] = [1, 2, 2]
    data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    bulk = parse_log_bytes(data, {})
    each = records.run_from_records([json.loads(line) for line in data.splitlines()])
    assert len(bulk.steps) == len(each.steps) == 1500
    assert set(bulk.steps.cols) == set(each.steps.cols)
    for name in bulk.steps.cols:
        np.testing.assert_array_equal(bulk.steps.get(name), each.steps.get(name), err_msg=name)
    np.testing.assert_array_equal(bulk.steps.bucket, each.steps.bucket)
    np.testing.assert_array_equal(bulk.steps.bucket_seq, each.steps.bucket_seq)
    assert bulk.steps.skip_reasons == each.steps.skip_reasons
    assert (bulk.steps.bucket == MIXED_BUCKET).sum() >= 1
    assert bulk.steps.nonfinite("loss").sum() == each.steps.nonfinite("loss").sum() >= 1


def test_nan_literal_counts_as_nonfinite_but_null_does_not():
    data = (json.dumps(_step(1, loss=math.nan)) + "\n" + json.dumps(_step(2, loss=None)) + "\n").encode()
    run = parse_log_bytes(data, {})
    assert run.steps.nonfinite("loss").tolist() == [True, False]


def test_resume_starts_a_new_segment():
    recs = [_step(i) for i in range(1, 11)] + [{"kind": "run_start", "time": 2000, "step": 0, "resumed_from": 6}]
    recs += [_step(i) for i in range(7, 12)]
    data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    run = parse_log_bytes(data, {})
    assert run.steps.segment.tolist() == [0] * 10 + [1] * 5


def test_our_writers_null_plus_nonfinite_list_counts_as_nonfinite():
    """The trainer writes NaN/Inf as null and names the fields in `nonfinite` (compact separators)."""
    recs = [_step(i) for i in range(1, 6)]
    recs[2].update(loss=None, grad_norm=None, nonfinite=["loss", "grad_norm"], skipped=True)
    data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs).encode()
    run = parse_log_bytes(data, {})
    assert run.steps.nonfinite("loss").tolist() == [False, False, True, False, False]
    assert run.steps.nonfinite("grad_norm").sum() == 1 and run.steps.nonfinite("acc").sum() == 0


def test_a_guarded_step_shares_its_number_without_splitting_the_run():
    recs = [_step(i) for i in (1, 2, 3, 3, 4, 5)]
    data = "".join(json.dumps(r) + "\n" for r in recs).encode()
    assert parse_log_bytes(data, {}).steps.segment.tolist() == [0] * 6


def test_iso_times_and_per_gpu_queue_dicts_are_read():
    recs = [
        {"iter": i, "avg_loss": 2.0, "timestamp": f"2026-11-29T10:{i:02d}:00Z", "queue": {"gpu0": 40, "gpu1": 10}}
        for i in range(3)
    ]
    run = parse_log_bytes("".join(json.dumps(r) + "\n" for r in recs).encode(), {})
    assert np.diff(run.steps.get("time")).tolist() == [60.0, 60.0]
    assert run.steps.get("queue_depth").tolist() == [50.0, 50.0, 50.0]
    assert run.mapped == {"step": "iter", "time": "timestamp", "loss": "avg_loss", "queue_depth": "queue"}
