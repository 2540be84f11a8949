"""The demo's plan and checks (pure): they must be able to fail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from akadze.bench import demo_plan as demo

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_plan_sizes_the_workload() -> None:
    plan = demo.make_plan(400, 10, run_id="abc")
    assert plan.queue == "demo-abc"
    names = [t.name for t in plan.tenants]
    assert names == ["acme", "globex", "hooli", "initech", "umbrella"]
    sizes = {t.name: t.jobs for t in plan.tenants}
    assert sizes["acme"] > 3 * sizes["hooli"]  # very different sizes
    initech, umbrella = plan.tenants[3], plan.tenants[4]
    assert initech.max_running == demo.MAX_RUNNING and initech.max_starts is None
    assert umbrella.max_starts and umbrella.window == 1.0
    # the limited tenants can finish their backlog within the busy part of the budget
    busy = plan.seconds * demo.BUSY_FRACTION
    assert initech.jobs * plan.duration / initech.max_running <= busy
    assert umbrella.jobs / umbrella.max_starts <= busy
    assert plan.tenants[0].flaky > 0 and plan.tenants[1].urgent > 0
    assert plan.total == sum(t.jobs + t.urgent for t in plan.tenants)
    assert all(t.key.startswith("demo-abc:") for t in plan.tenants)
    with pytest.raises(ValueError, match="--jobs"):
        demo.make_plan(10, 10)
    with pytest.raises(ValueError, match="--jobs"):
        demo.make_plan(demo.MAX_JOBS + 1, 10)
    with pytest.raises(ValueError, match="--seconds"):
        demo.make_plan(400, 1)
    with pytest.raises(ValueError, match="--seconds"):
        demo.make_plan(400, demo.MAX_SECONDS + 1)


@pytest.mark.parametrize("jobs", [100, 101, 250, 1000, 2400, 100_000])
def test_every_plan_can_be_judged_fairly(jobs: int) -> None:
    plan = demo.make_plan(jobs, demo.default_seconds(jobs), run_id="abc")
    unlimited = [t for t in plan.tenants if not t.limited]
    # the first unlimited tenant to run out has started all its jobs: more than the
    # check's minimum, so only a starved tenant can fall below it
    assert all(t.jobs > demo.MIN_FAIR_STARTS for t in unlimited)
    # the urgent batch is spread evenly over the unlimited tenants (it shifts no share)
    assert len({t.urgent for t in unlimited}) == 1 and unlimited[0].urgent > 0
    assert all(t.urgent == 0 for t in plan.tenants if t.limited)


def test_the_default_budget_shrinks_for_a_small_backlog() -> None:
    assert demo.default_seconds(None) == demo.DEFAULT_SECONDS
    assert demo.default_seconds(100) == demo.MIN_SECONDS
    assert demo.default_seconds(400) == 10
    assert demo.default_seconds(10**6) == demo.DEFAULT_SECONDS


def test_max_in_window_is_a_sliding_window() -> None:
    w = timedelta(seconds=1)
    assert demo.max_in_window([], w) == 0
    assert demo.max_in_window([at(0), at(0.5), at(0.99)], w) == 3
    assert demo.max_in_window([at(0), at(1.0), at(2.0)], w) == 1  # (s - w, s]
    assert demo.max_in_window([at(0.9), at(0), at(1.5), at(1.8)], w) == 3


def _row(tenant: str, start: float, *, task: str = "demo.work", priority: int = 0,
         state: str = "succeeded", attempt: int = 1, errors: int = 0,
         created: float = 0.0) -> demo.JobRow:
    failed = tuple(at(start - 0.5 * (i + 1)) for i in range(errors))
    return demo.JobRow(tenant, task, priority, state, attempt, failed, at(created),
                       at(start), at(start + 0.1))


def _fair_rows(plan: demo.Plan, starved: str | None = None) -> list[demo.JobRow]:
    rows = []
    for tenant in plan.tenants:
        n = tenant.jobs if tenant.name != starved else 2
        for i in range(n):
            rows.append(_row(tenant.name, i * 0.01 + (50 if tenant.name == starved else 0)))
    acme = plan.tenants[0].name
    rows.append(_row(acme, 1.0, task="demo.flaky", attempt=2, errors=1))
    rows.append(_row("globex", 3.0, priority=10, created=2.9))
    return rows


def test_a_fair_run_passes_and_a_starved_tenant_fails() -> None:
    plan = demo.make_plan(400, 10, run_id="x")
    peaks = demo.Peaks(snapshots=10, running={"initech": 2}, starts_in_window={"umbrella": 1})
    fair = demo.evaluate(plan, _fair_rows(plan), peaks, 5.0)
    checks = {c.name: c for c in fair.checks}
    assert checks["fair share"].ok, checks["fair share"].detail
    assert checks["retries resolved"].ok
    assert checks["urgent first"].ok

    starved = demo.evaluate(plan, _fair_rows(plan, starved="globex"), peaks, 5.0)
    assert not {c.name: c for c in starved.checks}["fair share"].ok
    assert not starved.ok


def test_an_exceeded_limit_fails() -> None:
    plan = demo.make_plan(400, 10, run_id="x")
    umbrella = plan.tenants[4]
    assert umbrella.max_starts is not None
    rows = _fair_rows(plan)
    ok = demo.evaluate(plan, rows, demo.Peaks(running={"initech": 2}), 5.0)
    names = {c.name: c.ok for c in ok.checks}
    assert names["initech max_running 2"]
    over_running = demo.evaluate(plan, rows, demo.Peaks(running={"initech": 3}), 5.0)
    assert not {c.name: c.ok for c in over_running.checks}["initech max_running 2"]
    over_bodies = demo.evaluate(plan, rows, demo.Peaks(bodies={"initech": 3}), 5.0)
    assert not {c.name: c.ok for c in over_bodies.checks}["initech max_running 2"]
    # umbrella's jobs all started within 0.01 s of each other: far above its rate
    name = f"umbrella max_starts {umbrella.max_starts}/1s"
    assert umbrella.jobs > umbrella.max_starts
    assert not {c.name: c.ok for c in ok.checks}[name]
    spread = [r for r in rows if r.tenant != "umbrella"] + [
        _row("umbrella", i * 1.0 / umbrella.max_starts + 0.001) for i in range(umbrella.jobs)
    ]
    assert {c.name: c.ok for c in demo.evaluate(plan, spread, demo.Peaks(), 5.0).checks}[name]


def test_unresolved_retries_and_unfinished_jobs_fail() -> None:
    plan = demo.make_plan(400, 10, run_id="x")
    rows = _fair_rows(plan)
    rows[-2] = _row("acme", 1.0, task="demo.flaky", state="failed", attempt=4, errors=4)
    result = demo.evaluate(plan, rows, demo.Peaks(), 5.0)
    checks = {c.name: c.ok for c in result.checks}
    assert not checks["retries resolved"]
    assert not checks["all jobs done"]


def _counted(plan: demo.Plan, starts: dict[str, tuple[int, int]]) -> demo.Check:
    """The fairness check of a run in which each unlimited tenant made ``starts[name] =
    (backlog starts, urgent starts)`` before hooli (the smallest) ran out."""
    rows = []
    for tenant in plan.tenants:
        backlog, urgent = starts.get(tenant.name, (5, 0))
        # hooli's last start (2.0) ends the contended period; the others' come before it
        rows += [_row(tenant.name, 2.0 if tenant.name == "hooli" and i == backlog - 1
                      else 1.0 + i * 0.01) for i in range(backlog)]
        rows += [_row(tenant.name, 1.5 + i * 0.01, priority=10, created=1.4)
                 for i in range(urgent)]
        if tenant.name != "hooli":  # the rest of its backlog, after hooli's last start
            rows += [_row(tenant.name, 9.0 + i * 0.01) for i in range(tenant.jobs - backlog)]
    result = demo.evaluate(plan, rows, demo.Peaks(), 10.0)
    return {c.name: c for c in result.checks}["fair share"]


def test_urgent_starts_count_toward_their_tenant_share() -> None:
    # The run: globex's urgent jobs took its turns; counted, the shares are fair.
    plan = demo.make_plan(100, 5, run_id="x")
    hooli = next(t for t in plan.tenants if t.name == "hooli")
    check = _counted(plan, {"acme": (12, 0), "globex": (9, 3), "hooli": (hooli.jobs, 0)})
    assert check.ok, check.detail
    assert "globex 12" in check.detail


def test_the_fairness_detail_never_contradicts_its_verdict() -> None:
    plan = demo.make_plan(100, 5, run_id="x")
    hooli = next(t for t in plan.tenants if t.name == "hooli")
    # 10/15 is 0.667: below 0.67, so it must not be shown as 0.67
    failing = _counted(plan, {"acme": (15, 0), "globex": (10, 0), "hooli": (hooli.jobs, 0)})
    assert not failing.ok
    assert "least/most 0.66, needs >= 0.67" in failing.detail
    # acme got the most: the detail states its share, it does not claim it got no more
    most = _counted(plan, {"acme": (16, 0), "globex": (hooli.jobs, 0), "hooli": (hooli.jobs, 0)})
    assert most.ok, most.detail
    assert "no more than" not in most.detail
    assert "acme holds 54% of their backlog and was enqueued first: it got 40%" in most.detail
    # the minimum is stated, and applied
    assert f"at least {demo.MIN_FAIR_STARTS} each" in most.detail
    starved = _counted(plan, {"acme": (9, 0), "globex": (9, 0), "hooli": (hooli.jobs - 3, 0)})
    assert not starved.ok
