import math

import pytest

from blockdraft.doctor.findings import Finding, rank


def test_unknown_code_or_severity_is_refused():
    with pytest.raises(ValueError):
        Finding("made_up", "warning", (1, 2), "x")
    with pytest.raises(ValueError):
        Finding("plateau", "fatal", (1, 2), "x")


def test_rank_by_severity_then_size():
    a = Finding("plateau", "info", (1, 2), "a", weight=9)
    b = Finding("loss_spike", "warning", (5, 6), "b", weight=1)
    c = Finding("nonfinite", "error", (9, 9), "c", weight=0)
    d = Finding("data_wait", "warning", (3, 4), "d", weight=3)
    assert [f.summary for f in rank([a, b, c, d])] == ["c", "d", "b", "a"]


def test_evidence_is_json_safe():
    f = Finding("plateau", "info", (1, 2), "x", evidence={"a": math.nan, "b": True, "c": 1.23456789})
    assert f.to_dict()["evidence"] == {"a": None, "b": 1, "c": 1.234568}
