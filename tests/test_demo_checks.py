"""The demo's plan and checks (pure): they must be able to fail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from akadze.bench import demo

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
    with pytest.raises(ValueError, match="--seconds"):
        demo.make_plan(400, 1)


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
