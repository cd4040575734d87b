"""The time budget plans the LR schedule to end with train.max_minutes, from measured updates."""

from blockdraft.train.budget import FIRST_LOOK, TimeBudget, next_look


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
    looks = [FIRST_LOOK]
    while looks[-1] < 3000:
        looks.append(next_look(looks[-1], updates_left=100_000))
    assert looks == [10, 40, 160, 640, 2560, 10240]
    budget = TimeBudget(max_seconds=480)
    times = [120.0] + [0.3] * 160 + [0.2] * 1400  # early updates meet new shapes; later ones run faster
    plans, total = _feed(budget, times, total=100_000)
    made = [p for p in plans if p is not None]
    at_641 = next(i for i, p in enumerate(made) if p.planned_from == 641)
    assert made[at_641].median_update_s == 0.2
    assert made[at_641].total_steps > made[at_641 - 1].total_steps  # the end moved later: the time is used
    last = made[-1].planned_from
    assert total == last + int((480 - sum(times[:last])) * 0.97 / 0.2)


def _run_until_the_schedule_ends(budget, rate_at, total):
    """Feeds updates whose time is rate_at(step) until the (re-planned) schedule ends; returns the
    seconds the run took and the plans made."""
    elapsed, step, plans = 0.0, 0, []
    while step < total:
        step += 1
        t = rate_at(step)
        elapsed += t
        plan = budget.observe(step, t, elapsed, total)
        if plan is not None:
            plans.append(plan)
            total = plan.total_steps
    return elapsed, plans


def test_a_rate_that_recovers_after_the_last_4x_look_still_fills_the_budget():
    # the demo's case: the rate slowed 30% around the look at 640 measured updates, then recovered
    def rate_at(step):
        return 90.0 if step == 1 else 0.26 if 200 < step <= 700 else 0.2

    elapsed, plans = _run_until_the_schedule_ends(TimeBudget(max_seconds=540), rate_at, total=100_000)
    assert plans[-1].planned_from > 641  # a look after the last 4x one moved the end
    assert 0.95 * 540 <= elapsed <= 540
    assert next_look(640, updates_left=1400) == 640 + 700
    assert next_look(2000, updates_left=15) == 8000  # too few left to halve: no more looks before the end
