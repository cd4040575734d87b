"""The `eval` record built from one mode's result: the fields the run folder's readers rely on."""

from blockdraft.evaluate.runner import ModeResult


def _result(mode: str, budget: int | None) -> ModeResult:
    return ModeResult(mode=mode, budget=budget, tau=2.5, tau_hist=[0, 1, 1, 2], per_prompt=[2.5], accept_per_pos=[],
                      tokens=10, rounds=4, seconds=1.0, tokens_per_s=10.0, speedup=1.5, lossless=True)


def test_the_eval_record_holds_the_logged_fields_of_its_mode():
    record = _result("tree", 16).eval_record(3, 2.75)
    assert record == {"tau": 2.5, "tau_hist": [0, 1, 1, 2], "prompts": 3, "mode": "tree", "budget": 16,
                      "tokens": 10, "speedup": 1.5, "lossless": True, "tau_est_train": 2.75}
    assert _result("path", None).eval_record(3, None)["budget"] is None
