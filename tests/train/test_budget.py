"""The time budget plans the LR schedule to end with train.max_minutes, once, from measured updates."""

from blockdraft.train.budget import TimeBudget


def _feed(budget, times, total, start_elapsed=0.0):
    elapsed, plans = start_elapsed, []
    for step, t in enumerate(times, start=1):
        elapsed += t
        plans.append(budget.observe(step, t, elapsed, total))
    return plans


def test_a_slow_first_update_then_a_measured_rate_shortens_the_schedule():
    budget = TimeBudget(max_seconds=240, measure=10)
    plans = _feed(budget, [141.0] + [0.25] * 20, total=10_000)
    made = [p for p in plans if p is not None]
    assert len(made) == 1 and plans.index(made[0]) == 10  # after update 11: the first plus 10 measured
    plan = made[0]
    assert plan.first_update_s == 141.0 and plan.median_update_s == 0.25
    # 240 s - 143.5 s spent leaves 96.5 s: 0.97 * 96.5 / 0.25 = 374 more updates after update 11
    assert plan.total_steps == 11 + 374


def test_no_plan_when_the_time_holds_the_schedule_or_there_is_no_budget():
    assert all(p is None for p in _feed(TimeBudget(max_seconds=3600), [1.0] * 30, total=100))
    assert all(p is None for p in _feed(TimeBudget(max_seconds=None), [1.0] * 30, total=10**6))


def test_the_plan_survives_a_resume():
    budget = TimeBudget(max_seconds=100, measure=3)
    _feed(budget, [10.0, 1.0, 1.0, 1.0], total=1000)
    resumed = TimeBudget(max_seconds=100, measure=3)
    resumed.load_state_dict(budget.state_dict())
    assert resumed.plan == budget.plan and resumed.plan.total_steps < 1000
    assert resumed.observe(5, 1.0, 20.0, 1000) is None  # planned once: a resumed run keeps its schedule
