import json

import numpy as np

from blockdraft.doctor import fastjson


def _lines(recs, **dump):
    return "".join(json.dumps(r, **dump) + "\n" for r in recs).encode()


def test_compact_separators_parse_in_bulk():
    recs = [{"kind": "step", "step": i, "loss": 1.5 + i, "skipped": i % 2 == 0, "kl": None} for i in range(1, 30)]
    fast, slow, count = fastjson.split_step_lines(_lines(recs, separators=(",", ":")), {})
    assert count == 29 and not slow
    assert fast.cols["loss"][:3].tolist() == [2.5, 3.5, 4.5]
    assert fast.cols["skipped"][:2].tolist() == [0.0, 1.0]
    assert np.isnan(fast.cols["kl"]).all()


def test_strings_and_nested_values_go_to_json():
    recs = [
        {"kind": "step", "step": 1, "loss": 1.0, "skip_reason": 'a "quoted": thing'},
        {"kind": "step", "step": 2, "loss": 1.0, "extra": {"a": 1}},
        {"kind": "step", "step": 3, "loss": 2.0, "skip_reason": None},
    ]
    fast, slow, _ = fastjson.split_step_lines(_lines(recs), {})
    assert sorted(i for i, _ in slow) == [0, 1]
    assert fast.lines.tolist() == [2]


def test_other_kinds_and_truncated_tail_go_to_json():
    data = _lines([{"kind": "run_start", "step": 0}, {"kind": "step", "step": 1, "loss": 1.0}])
    data += b'{"kind": "step", "step": 2, "loss": 1'
    fast, slow, count = fastjson.split_step_lines(data, {})
    assert count == 3
    assert fast.lines.tolist() == [1]
    assert sorted(i for i, _ in slow) == [0, 2]


def test_literals_keep_their_meaning():
    recs = [
        {"kind": "step", "step": i, "loss": v, "grad_norm": 0.5}
        for i, v in enumerate([float("inf"), float("-inf"), float("nan"), None, True, 2.5], start=1)
    ]
    fast, slow, _ = fastjson.split_step_lines(_lines(recs), {})
    assert not slow
    loss = fast.cols["loss"]
    assert loss[0] == np.inf and loss[1] == -np.inf and np.isnan(loss[2]) and np.isnan(loss[3])
    assert loss[4] == 1.0 and loss[5] == 2.5
    assert fast.cols["loss!nan"].tolist() == [0, 0, 1, 0, 0, 0]
