"""Reliability under faults: real worker processes, real kills, audited promises.

The fast cases run small versions of the fault scenarios of ``akadze bench faults``
on the test server (they only kill their own worker processes and their own
backends). The long ones, including the server restarts (on a private embedded
server, never the shared one), are marked slow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from psycopg.conninfo import make_conninfo

from akadze.bench import fault_harness
from akadze.bench.fault_context import Options
from akadze.bench.fault_harness import audit, prepare
from akadze.bench.fault_outages import start_proxy
from akadze.bench.fault_scenarios import (
    SCENARIO_NAMES,
    ScenarioResult,
    run_scenario,
    scenario,
)
from akadze.bench.faults import report_text, run_all


def _check(result: ScenarioResult) -> None:
    a = result.audit
    detail = f"{result.name}: {a} notes={result.notes} logs={dict(result.logs)}"
    assert result.faults > 0, detail
    assert result.lost == 0, detail
    assert result.recovery is not None, detail
    assert a.states.get("failed", 0) == 0, detail
    assert a.violations == 0 and a.rate_violations == 0 and result.over_samples == 0, detail
    assert a.tx_wrong_effects == 0 and a.effects_of_unfinished == 0, detail
    assert a.stale_effects == 0 and a.stale_results == 0, detail
    assert a.unexplained == 0, detail
    assert result.unplanned_deaths == 0, detail
    assert result.logs["crashed"] == 0, detail
    assert all(m <= limit for m, limit in result.max_running.values()), detail


def _options(tmp_path: Path, **more: Any) -> Options:
    return Options(**{"jobs": 400, "workers": 3, "slots": 6, "seed": 7, "lease": 2.0,
                      "recovery_timeout": 60.0, "fault_seconds": 3.0, "logdir": tmp_path,
                      **more})


def _admin(server_url: str) -> str:
    return server_url


def test_kill9_of_workers_loses_nothing(server_url: str, tmp_path: Path) -> None:
    result = run_scenario(scenario("kill9"), _options(tmp_path, jobs=600), _admin(server_url))
    _check(result)
    assert result.audit.rescued > 0, "the kills should have left jobs to rescue"
    # Rescued within about a lease of the last kill, plus the backlog's own time.
    assert result.recovery is not None and result.recovery < 30


def test_terminated_backends_do_not_stop_the_workers(server_url: str, tmp_path: Path) -> None:
    result = run_scenario(scenario("terminate"), _options(tmp_path), _admin(server_url))
    _check(result)
    assert result.logs["tracebacks"] == 0, result.logs


def test_a_stopped_worker_cannot_finish_rescued_jobs(server_url: str, tmp_path: Path) -> None:
    result = run_scenario(scenario("sigstop"), _options(tmp_path, jobs=300),
                          _admin(server_url))
    _check(result)
    assert result.audit.rescued > 0, result.notes


def test_a_partitioned_worker_cannot_finish_rescued_jobs(server_url: str,
                                                        tmp_path: Path) -> None:
    """Every second worker behind a proxy that stops forwarding (closing nothing) past
    the lease: the others rescue its jobs (ending its claim that held the queue's turn)
    and finish them; when the network comes back, nothing it writes lands."""
    result = run_scenario(scenario("partition"), _options(tmp_path, jobs=600, workers=4),
                          _admin(server_url))
    _check(result)
    assert result.audit.rescued > 0, result.notes
    assert result.logs["self-fenced"] > 0, result.logs


# -- the checkers themselves can fail ---------------------------------------------------


def test_the_watch_sees_a_key_over_its_limit_and_a_bad_effect(
    conn: psycopg.Connection[Any],
) -> None:
    prepare(conn)
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key, args) "
                 "SELECT 'faults', 'fault.work', 'run2a', jsonb_build_object('n', g, 'tx', true) "
                 "FROM generate_series(1, 3) g")
    # Three jobs of a key limited to 2 start in one transaction (not a claim: a bug).
    conn.execute("UPDATE akadze.jobs SET state = 'running', run_count = 1, attempt = 1, "
                 "started_at = now(), claim_token = 1000 + id")
    ids = [int(r[0]) for r in conn.execute("SELECT id FROM akadze.jobs ORDER BY id")]
    # Two effects for one job, one for another written by a run with the same run_count
    # but another claim token (a claim a crash undid), none for the third.
    for job_id, token in ((ids[0], 1000 + ids[0]), (ids[0], 1000 + ids[0]), (ids[1], 7)):
        conn.execute("INSERT INTO akadze_fault.effects (job_id, run_count, worker, claim_token) "
                     "VALUES (%s, 1, 'w', %s)", (job_id, token))
    conn.execute("UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()")
    found = audit(conn)
    assert found.violations == 3 and found.max_over == 1
    assert found.tx_wrong_effects == 2  # ids[0] has two rows, ids[2] none
    assert found.stale_effects == 1
    assert found.unfinished == 0


def test_the_audit_sees_a_result_of_a_superseded_run(conn: psycopg.Connection[Any]) -> None:
    prepare(conn)
    # Plain jobs: each result names its run by claim token; the second names a run of
    # the same run_count that is not the one the job's row carries.
    conn.execute("INSERT INTO akadze.jobs (queue, task, args, state, run_count, attempt, "
                 "claim_token, result, finished_at) "
                 "SELECT 'faults', 'fault.work', '{\"tx\": false}', 'succeeded', 1, 1, t, "
                 "jsonb_build_object('rc', 1, 'tok', r::text), now() "
                 "FROM (VALUES (11, 11), (12, 13)) AS v(t, r)")
    found = audit(conn)
    assert found.stale_results == 1 and found.stale_effects == 0


def test_the_start_rate_check_sees_a_burst(conn: psycopg.Connection[Any]) -> None:
    prepare(conn)
    # rate15 allows 15 starts per second: 16 within one second is a violation.
    conn.execute("INSERT INTO akadze.jobs (queue, task, limit_key) "
                 "SELECT 'faults', 'fault.work', 'rate15' FROM generate_series(1, 16)")
    conn.execute("UPDATE akadze.jobs SET state = 'running', run_count = 1, attempt = 1, "
                 "started_at = now() - (id % 10) * interval '10 ms'")
    found = audit(conn)
    assert found.rate_violations >= 1 and found.rate_max_over == 1
    assert found.unfinished == 16


def test_log_counts_reads_the_worker_lines() -> None:
    text = ("... job 12 (fault.work): outcome retried discarded: the job is no longer ...\n"
            "... claim on queue 'faults' failed (QueryCanceled: canceling statement due to "
            "statement timeout); retrying in 0.10 s\n")
    found = fault_harness.log_counts(text)
    assert found["outcome discarded"] == 1 and found["statement timeout"] == 1


# -- the long runs ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_fault_scenario_on_a_private_server(name: str, tmp_path: Path) -> None:
    """Each scenario at the bench's default size (the restart one stops and crashes
    its private server)."""
    host, results, elapsed = run_all([name], Options(logdir=tmp_path))
    (result,) = results
    _check(result)
    assert "PostgreSQL" in report_text(host, Options(), results, elapsed)


def test_the_partition_proxy_leads_a_url_to_its_server(database_url: str) -> None:
    proxy, through = start_proxy(database_url)
    try:
        with psycopg.connect(through, autocommit=True) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == (
                psycopg.conninfo.conninfo_to_dict(database_url)["dbname"],)
        assert proxy.stats()[0] == 1
    finally:
        proxy.close()
    with pytest.raises(ValueError, match="TCP URL"):
        start_proxy(make_conninfo("", host="/tmp", dbname="x"))
