"""The time budget plans the LR schedule to end with train.max_minutes, from measured updates."""

from blockdraft.train.budget import FIRST_LOOK, TimeBudget, is_look


def _feed(budget, times, total):
    elapsed, plans = 0.0, []
    for step, t in enumerate(times, start=1):
        elapsed += t
        plan = budget.observe(step, t, elapsed, total)
        plans.append(plan)
        total = plan.total_steps if plan else total
    return plans, total


def test_a_slow_first_update_then_a_measured_rate_shortens_the_schedule():
    budget = TimeBudget(max_seconds=240)
    plans, total = _feed(budget, [141.0] + [0.25] * 20, total=10_000)
    made = [(i + 1, p) for i, p in enumerate(plans) if p is not None]
    assert len(made) == 1 and made[0][0] == FIRST_LOOK + 1  # after the first update plus 10 measured
    plan = made[0][1]
    assert plan.first_update_s == 141.0 and plan.median_update_s == 0.25
    # 240 s - 143.5 s spent leaves 96.5 s: 0.97 * 96.5 / 0.25 = 374 more updates after update 11
    assert total == plan.total_steps == 11 + 374


def test_a_later_look_corrects_a_rate_slowed_by_recompiles():
    budget = TimeBudget(max_seconds=600)
    times = [14.0] + [0.5] * 10 + [0.25] * 200  # recompiles for new shapes, then the steady rate
    plans, total = _feed(budget, times, total=100_000)
    made = [p for p in plans if p is not None]
    assert len(made) >= 2 and made[1].total_steps > made[0].total_steps
    assert made[-1].median_update_s == 0.25
    elapsed_at_last_look = sum(times[: made[-1].planned_from])
    assert total == made[-1].planned_from + int((600 - elapsed_at_last_look) * 0.97 / 0.25)


def test_never_longer_than_configured_and_no_plan_without_a_budget():
    plans, total = _feed(TimeBudget(max_seconds=3600), [1.0] * 99, total=100)
    assert all(p is None for p in plans) and total == 100
    plans, _ = _feed(TimeBudget(max_seconds=None), [1.0] * 200, total=10**6)
    assert all(p is None for p in plans)


def test_the_plan_survives_a_resume():
    budget = TimeBudget(max_seconds=100)
    _feed(budget, [10.0] + [1.0] * 10, total=1000)
    resumed = TimeBudget(max_seconds=100)
    resumed.load_state_dict(budget.state_dict())
    assert resumed.plan == budget.plan and resumed.plan.total_steps < 1000
    assert all(resumed.observe(k, 1.0, 20.0, 1000) is None for k in range(12, 200))  # no new looks


def test_looks_are_spaced_4x_and_a_late_look_lengthens_a_plan_made_on_slow_early_updates():
    assert [n for n in range(1, 3000) if is_look(n)] == [10, 40, 160, 640, 2560]
    budget = TimeBudget(max_seconds=480)
    times = [120.0] + [0.3] * 160 + [0.2] * 1400  # early updates meet new shapes; later ones run faster
    plans, total = _feed(budget, times, total=100_000)
    made = [p for p in plans if p is not None]
    assert made[-1].planned_from == 641 and made[-1].median_update_s == 0.2
    assert made[-1].total_steps > made[-2].total_steps  # the end moved later: the time is used
    assert total == 641 + int((480 - sum(times[:641])) * 0.97 / 0.2)
