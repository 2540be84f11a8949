"""One bad job fails alone (issue 21, findings 1 and 2).

Before: a task returning a surrogate-escaped file name, or raising with a NUL in its
message, failed its whole outcome batch on the server at every retry, and a row with
args nested 5 000 deep failed every claim of its queue; in a queue of 200 good jobs
and those three, no good job succeeded in 35 s. Now each poison job ends ``failed``
with a readable error, and every other job of its batch, claim and queue goes on.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from test_outcomes_sql import running
from test_worker_support import Events, eventually, insert_job, job

from akadze import Akadze, Worker, current, outcomes
from akadze.jobs import JobState
from akadze.worker._finishes import write
from akadze.worker._refusals import refused_row, write_splitting

AT = datetime(2026, 1, 1, tzinfo=UTC)
BIG = 1024 * 1024 + 1  # one byte over the default max_result_bytes

# A constraint of the user's own, which only the database can check: results marked
# {"poison": true} are refused (CHECK violation, SQLSTATE 23514).
NO_POISON = ("ALTER TABLE akadze.jobs ADD CONSTRAINT jobs_no_poison "
             "CHECK (result IS NULL OR NOT result @> '{\"poison\": true}')")


def nested(depth: int) -> str:
    return '{"data": ' + "[" * depth + "]" * depth + "}"


# -- the batch split, statement by statement ----------------------------------------------


class Counted:
    """``_finishes.write`` on one connection, counting its calls (one statement, or one
    transaction, each)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.calls: list[int] = []

    async def __call__(self, batch: Sequence[outcomes.Finish]) -> set[int]:
        self.calls.append(len(batch))
        return await write(self.conn, batch)


async def test_a_batch_the_database_refuses_is_split_so_only_the_bad_rows_fail(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    conn.execute(NO_POISON)
    jobs = [running(conn, insert_job(conn, "t")) for _ in range(100)]
    batch = [outcomes.Finish(j, outcomes.SUCCEEDED, JobState.SUCCEEDED,
                             result=json.dumps({"n": i})) for i, j in enumerate(jobs)]
    # What the worker no longer sends, sent anyway (another version, a bug): texts that
    # jsonb refuses, and a result that a constraint refuses.
    batch[10].result = '"report-\\udcff.txt"'
    batch[50] = outcomes.Finish(jobs[50], outcomes.FAILED, JobState.FAILED,
                                error='{"message": "bad\\u0000input"}')
    batch[51] = outcomes.Finish(jobs[51], outcomes.RETRIED, JobState.QUEUED, delay=5.0,
                                error='{"message": "\\ud800"}')
    batch[90].result = '{"poison": true}'
    bad = {jobs[i].id for i in (10, 50, 51, 90)}

    counted = Counted(aconn)
    accepted, replaced = await write_splitting(counted, batch, AT)

    assert accepted == {j.id for j in jobs}
    assert {refused.job.id for refused, _ in replaced} == bad
    # Four bad rows among 100: a bounded number of statements, not one per row.
    assert len(counted.calls) <= 1 + 4 * 2 * math.ceil(math.log2(100)) + 4
    rows = {j.id: job(conn, j.id) for j in jobs}
    good = [rows[j.id] for j in jobs if j.id not in bad]
    assert {r["state"] for r in good} == {"succeeded"}
    assert [r["result"] for r in good][:3] == [{"n": 0}, {"n": 1}, {"n": 2}]
    messages = {}
    for job_id in bad:
        row = rows[job_id]
        assert (row["state"], row["result"], row["attempt"]) == ("failed", None, 1)
        entry = row["errors"][-1]
        assert entry["error"] == "UnstorableOutcome"
        messages[job_id] = entry["message"]
    assert "PostgreSQL refused it: 22P05 unsupported Unicode escape sequence" in (
        messages[jobs[50].id])
    assert "(succeeded) could not be stored" in messages[jobs[10].id]
    assert "(retried) could not be stored" in messages[jobs[51].id]
    assert "23514" in messages[jobs[90].id] and "jobs_no_poison" in messages[jobs[90].id]


async def test_trouble_is_not_split_and_a_refused_failure_is_raised(
    conn: psycopg.Connection[Any], aconn: psycopg.AsyncConnection[Any]
) -> None:
    jobs = [running(conn, insert_job(conn, "t")) for _ in range(4)]
    batch = [outcomes.Finish(j, outcomes.SUCCEEDED, JobState.SUCCEEDED) for j in jobs]
    calls: list[int] = []

    async def broken(part: Sequence[outcomes.Finish]) -> set[int]:
        calls.append(len(part))
        raise psycopg.OperationalError("the connection was lost")

    with pytest.raises(psycopg.OperationalError):
        await write_splitting(broken, batch, AT)
    assert calls == [4]  # retried whole by the flusher, later
    # A refusal of the failure too (here: no job may fail at all) is not the row's data:
    # it is raised, and the flusher retries the batch as for trouble.
    conn.execute("ALTER TABLE akadze.jobs ADD CONSTRAINT jobs_never_fail "
                 "CHECK (state <> 'failed')")
    batch[2] = outcomes.Finish(jobs[2], outcomes.FAILED, JobState.FAILED)
    with pytest.raises(psycopg.errors.CheckViolation):
        await write_splitting(Counted(aconn), batch, AT)
    assert job(conn, jobs[2].id)["state"] == "running"
    assert job(conn, jobs[0].id)["state"] == "succeeded"  # written in its half


def test_which_errors_refuse_a_row() -> None:
    assert refused_row(psycopg.errors.UntranslatableCharacter())
    assert refused_row(psycopg.errors.InvalidTextRepresentation())
    assert refused_row(psycopg.errors.CheckViolation())
    assert refused_row(psycopg.errors.StatementTooComplex())  # 54001, too deep
    assert refused_row(psycopg.errors.ProgramLimitExceeded())
    assert refused_row(psycopg.DataError("PostgreSQL text fields cannot contain NUL"))
    assert refused_row(UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed"))
    for trouble in (psycopg.OperationalError("lost"), psycopg.errors.AdminShutdown(),
                    psycopg.errors.QueryCanceled(), psycopg.errors.SerializationFailure(),
                    psycopg.errors.DeadlockDetected(), psycopg.errors.UndefinedTable(),
                    psycopg.errors.InsufficientPrivilege(), psycopg.InterfaceError(),
                    OSError(), RuntimeError()):
        assert not refused_row(trouble), trouble


# -- the poison batch, through a worker ---------------------------------------------------


async def test_poison_jobs_fail_alone_and_every_good_job_succeeds(
    app: Akadze, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(NO_POISON)

    @app.task("good")
    async def good(n: int) -> dict[str, int]:
        return {"n": n}

    @app.task("surrogate", max_attempts=1)
    def surrogate() -> str:
        return "report-\udcff.txt"  # os.listdir's name for an undecodable byte

    @app.task("nul_error", max_attempts=1)
    async def nul_error() -> None:
        raise ValueError("bad\x00input")

    @app.task("oversized", max_attempts=1)
    async def oversized() -> str:
        return "x" * BIG

    @app.task("nested", max_attempts=1)
    async def nested_task(data: Any) -> None:
        raise AssertionError("must not run")

    @app.task("refused", max_attempts=1)
    async def refused() -> dict[str, bool]:
        return {"poison": True}

    @app.task("complete_tx_surrogate", max_attempts=1)
    async def complete_tx_surrogate() -> None:
        async with current().complete_tx(result={"name": "\udcff"}):
            raise AssertionError("must not be reached")

    poison_tasks = ["surrogate", "nul_error", "oversized", "refused", "complete_tx_surrogate"]
    good_ids: list[int] = []
    poison: dict[str, int] = {}
    for n in range(200):
        good_ids.append(insert_job(conn, "good", {"n": n}))
        if n % 30 == 5 and poison_tasks:
            name = poison_tasks.pop(0)
            poison[name] = insert_job(conn, name, max_attempts=1)
        if n == 100:  # written by SQL, as other tools could: jsonb takes it
            row = conn.execute("INSERT INTO akadze.jobs (queue, task, args, max_attempts) "
                               "VALUES ('default', 'nested', %s::jsonb, 1) RETURNING id",
                               (nested(5_000),)).fetchone()
            assert row is not None
            poison["nested"] = int(row[0])
    assert len(poison) == 6

    def finished() -> bool:
        row = conn.execute("SELECT count(*) FROM akadze.jobs WHERE state IN "
                           "('queued', 'running')").fetchone()
        return row is not None and row[0] == 0

    events = Events()
    began = time.monotonic()
    async with Worker(app, slots=20, poll_interval=0.5, on_event=events) as worker:
        await eventually(finished, within=60, what="every job to finish")
    took = time.monotonic() - began

    states = {int(r[0]): str(r[1]) for r in conn.execute(
        "SELECT id, state::text FROM akadze.jobs")}
    assert [job_id for job_id in good_ids if states[job_id] != "succeeded"] == []
    assert job(conn, good_ids[-1])["result"] == {"n": 199}
    errors = {}
    for name, job_id in poison.items():
        # Not SELECT *: the nested row's args are still nested too deep to read.
        found = conn.execute("SELECT state::text, result, errors -> -1, attempt "
                             "FROM akadze.jobs WHERE id = %s", (job_id,)).fetchone()
        assert found is not None
        assert found[:2] == ("failed", None) and found[3] == 1, name
        errors[name] = found[2]
    assert errors["surrogate"]["error"] == "UnstorableResult"
    assert "lone surrogate" in errors["surrogate"]["message"]
    assert (errors["nul_error"]["error"], errors["nul_error"]["message"]) == (
        "ValueError", "bad\\x00input")
    assert "bad\\x00input" in errors["nul_error"]["traceback"]
    assert errors["oversized"]["error"] == "UnstorableResult"
    assert f"the result is {BIG + 2} bytes as JSON; at most 1048576 (max_result_bytes)" in (
        errors["oversized"]["message"])
    assert errors["nested"]["error"] == "InvalidArguments"
    assert "nested too deeply" in errors["nested"]["message"]
    assert errors["refused"]["error"] == "UnstorableOutcome"
    assert "jobs_no_poison" in errors["refused"]["message"]
    assert "Failing row" not in errors["refused"]["message"]  # the detail quotes the row
    assert errors["complete_tx_surrogate"]["error"] == "UnstorableResult"
    assert worker.counts["succeeded"] == 200 and worker.counts["failed"] == 6
    # Every claim went through: none failed on the nested row.
    assert "claimed" in events.kinds()
    print(f"poison batch: 206 jobs finished in {took:.2f} s")
