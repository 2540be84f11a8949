-- Queries of the worker runtime (the akadze.worker package and akadze.cancellation).
-- %(now)s is the injectable clock: NULL means the database's now(), the normal case.

-- name: worker_heartbeat
-- Register or refresh this worker's lease. An upsert, so a worker whose row was
-- deleted (presumed dead while it could not reach the database) registers again;
-- "inserted" tells it so (its running jobs may have been rescued: fencing decides).
-- tasks: the names of the tasks it runs (worker_unserved_tasks, queue_unserved_tasks).
INSERT INTO akadze.workers AS w (id, host, pid, queues, tasks, lease, started_at, heartbeat_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::text[], %(tasks)s::text[],
        %(lease)s * interval '1 second',
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
-- server_started: when the server started; a new value (a crash and restart, or a
-- failover to another server) tells the worker that claims it made may have been
-- undone, even when no statement of its failed (worker_runs_lost).
ON CONFLICT (id) DO UPDATE
    SET heartbeat_at = excluded.heartbeat_at, lease = excluded.lease, queues = excluded.queues,
        tasks = excluded.tasks
RETURNING (xmax = 0) AS inserted, pg_postmaster_start_time() AS server_started;

-- name: worker_unserved_tasks
-- After a heartbeat: the tasks of ready jobs at the head of this worker's queues that
-- no live worker of the queue runs (a worker of an older akadze, tasks NULL, may run
-- anything; this worker counts as live with %(tasks)s). Every claim passes such jobs
-- over, so they stay at the head while the rest of the queue moves on: reading the
-- first %(sample)s ready jobs of each ready index (free and limited keys) in claim
-- order finds them, at a bounded cost however deep the backlog. Paused queues are
-- left out (nothing runs there anyway).
SELECT q.queue, h.task, count(*)
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    (SELECT j.task FROM akadze.jobs AS j
     WHERE j.queue = q.queue AND j.state = 'queued' AND NOT j.limited
       AND j.run_at <= coalesce(%(now)s::timestamptz, now())
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT %(sample)s)
    UNION ALL
    (SELECT j.task FROM akadze.jobs AS j
     WHERE j.queue = q.queue AND j.state = 'queued' AND j.limited
       AND j.run_at <= coalesce(%(now)s::timestamptz, now())
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT %(sample)s)
) AS h
WHERE h.task <> ALL (%(tasks)s::text[])
  AND NOT EXISTS (SELECT 1 FROM akadze.queue_pauses AS p WHERE p.queue = q.queue)
  AND NOT EXISTS (
      SELECT 1 FROM akadze.workers AS w
      WHERE w.heartbeat_at + w.lease >= coalesce(%(now)s::timestamptz, now())
        AND q.queue = ANY (w.queues)
        AND (w.tasks IS NULL OR h.task = ANY (w.tasks))
  )
GROUP BY q.queue, h.task
ORDER BY q.queue, h.task;

-- name: worker_unregister
-- The worker's row, and its reservations back to the queue (handoff.sql,
-- hand_off_take: the next jobs of its keys it held for its slots; its runs are
-- over by now, so none of them will start here).
WITH given_back AS (
    UPDATE akadze.jobs AS j
    SET state = 'queued', worker_id = NULL, claim_token = NULL
    WHERE j.state = 'reserved' AND j.worker_id = %(id)s
    RETURNING j.id
)
DELETE FROM akadze.workers WHERE id = %(id)s;

-- name: worker_runs_lost
-- After the worker's connection to the server was lost (or the server restarted):
-- which of its runs (id, claim token, run_count) the database no longer has claimed
-- by that run. A crash or a failover can undo a claim that committed asynchronously;
-- a lease that ran out meanwhile let another worker rescue the job. A row that still
-- carries the run's token is that run's, whatever its state (complete_tx may have
-- finished it already); a rescue clears the token. Runs claimed before migration 0007
-- (no token) are matched by run_count and this worker's id, as the fence does.
SELECT f.id
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(run_counts)s::integer[])
     AS f(id, claim_token, run_count)
WHERE NOT EXISTS (
    SELECT 1 FROM akadze.jobs AS j
    WHERE j.id = f.id
      AND (j.claim_token = f.claim_token
           OR (j.claim_token IS NULL AND f.claim_token IS NULL
               AND j.run_count = f.run_count AND j.worker_id = %(worker_id)s))
)
ORDER BY f.id;

-- name: worker_cancel_requested
-- The poll fallback of cancellation: this worker's running jobs someone asked to
-- cancel (reads the small partial index of running rows).
SELECT id FROM akadze.jobs
WHERE worker_id = %(worker_id)s AND state = 'running' AND cancel_requested;

-- fragment: run_fence
-- The fence of every write that ends a run: the row j is still running under the
-- claim of the run f (f.claim_token, f.run_count), so that a run that lost the job
-- (rescued, given back, cancelled, or claimed again after a crash or a failover
-- undid its claim) cannot overwrite what happened since. The token is random per
-- claim (migration 0007): a crash that undid a claim cannot hand it out again, as
-- it can run_count (the next claim recomputes the same count from the undone row).
-- A run claimed before 0007 has no token and falls back on run_count; a row that
-- has a token never matches a run without one, and the other way round.
j.state = 'running'
AND (j.claim_token = f.claim_token
     OR (j.claim_token IS NULL AND f.claim_token IS NULL AND j.run_count = f.run_count))

-- fragment: outcome_rows
-- The rows an outcome write changes, after its `unnest(...) AS f(id, claim_token,
-- run_count, ...)`, fenced as run_fence says (the same test, written out here): found by id through the primary key, whatever the table's statistics
-- say. "j.id = ANY (ids)" hands the planner the ids themselves (an index
-- condition on jobs_pkey, with the array's real length in these statements'
-- custom plans); the fence is one "(...) IS TRUE" test, which no index answers
-- and which implies no partial index's predicate. Written as a plain
-- "j.state = 'running'", a table whose statistics were taken while nothing
-- ran estimated one running row, and the plan could read the whole of a
-- running-job index and join it by hash (docs/explanation/claim.md, "Plans that
-- cannot go wrong").
WHERE j.id = ANY (%(ids)s::bigint[])
  AND j.id = f.id
  AND (j.state = 'running'
       AND (j.claim_token = f.claim_token
            OR (j.claim_token IS NULL AND f.claim_token IS NULL
                AND j.run_count = f.run_count))) IS TRUE

-- name: lock_outcome_keys
-- The limits rows of an outcome write's keys, locked in key order before its
-- statements, when the write is more than one of them in one transaction
-- (finish_succeeded, finish_jobs and give_back_jobs for a mixed batch: see
-- akadze.worker._finishes.write). The same lock as the count trigger's own
-- (migration 0017), which locks each statement's keys in key
-- order, but two statements lock two sets one after the other: a worker whose
-- succeeded runs are of key b and failed ones of key a, beside one with the
-- opposite, would each hold one row and wait for the other's (a deadlock,
-- broken after deadlock_timeout by failing one write). Taken here in one order,
-- the triggers find them held. FOR NO KEY UPDATE, the triggers' own mode: an
-- open transaction that queued a job of a key (FOR KEY SHARE) is not waited for.
SELECT 1 FROM akadze.limits l
WHERE l.key = ANY (%(keys)s::text[])
ORDER BY l.key
FOR NO KEY UPDATE;

-- name: defer_running
-- First statement of an outcome write that hands slots off (its finishes, then
-- hand_off_lock and hand_off_take, one transaction): until apply_running, the
-- count triggers keep each key's change to its running count instead of
-- writing it (migration 0021). A key handed off in the write ends one run and
-- starts one: its limits row is not written at all, where it was written twice.
SELECT set_config('akadze.running_deferred', 'on', true)

-- name: apply_running
-- Last statement of that write: the kept changes, summed per key, written to
-- the keys' limits rows where the sum is not 0 (rows the write locked already).
SELECT akadze.apply_running()

-- name: finish_jobs
-- Many run outcomes in one statement, one array element per job. Each row is
-- fenced (run_fence). Rows that fail the fence are simply absent from RETURNING.
-- The results and errors (JSON texts) travel as binary text[] (%(name)b): in text
-- format psycopg quotes each element through a regular expression, about 5 us a
-- job's result, against a quarter of a microsecond.
--   delay NULL keeps run_at (a give-back keeps its place in the queue);
--   attempt_delta -1 refunds the attempt the claim counted (snooze, give-back);
--   error NULL leaves errors unchanged.
UPDATE akadze.jobs AS j
SET state = f.state,
    attempt = j.attempt + f.attempt_delta,
    run_at = CASE WHEN f.delay IS NULL THEN j.run_at
                  ELSE coalesce(%(now)s::timestamptz, now()) + f.delay * interval '1 second'
             END,
    result = CASE WHEN f.state = 'succeeded' THEN f.result::jsonb ELSE j.result END,
    errors = akadze.append_error(j.errors, f.error::jsonb),
    finished_at = CASE WHEN f.state IN ('succeeded', 'failed', 'cancelled')
                       THEN coalesce(%(now)s::timestamptz, now()) END,
    worker_id = CASE WHEN f.state = 'queued' THEN NULL ELSE j.worker_id END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(run_counts)s::integer[],
            %(states)s::akadze.job_state[], %(attempt_deltas)s::integer[],
            %(delays)s::float8[], %(results)b::text[], %(errors)b::text[])
     AS f(id, claim_token, run_count, state, attempt_delta, delay, result, error)
-- include: outcome_rows
RETURNING j.id;

-- name: give_back_jobs
-- Runs handed back unfinished (shutdown, self-fencing), fenced (run_fence),
-- each recorded in the job's errors (the entry made by outcomes.given_back, with
-- "spent" added). A give-back keeps the job's place (run_at) and refunds the attempt
-- the claim counted, %(cap)s times per attempt: given back once more at the same
-- attempt (a job longer than the workers' shutdown timeout, at every restart), it
-- spends the attempt, and on its last attempt it fails. The count comes from the
-- entries of this attempt already recorded (read before the update: a row that
-- changed meanwhile fails the fence anyway).
WITH f AS (
    SELECT f.id, f.claim_token, f.run_count, f.error::jsonb AS entry,
           (SELECT count(*) FROM jsonb_array_elements(j.errors) AS e
            WHERE e ->> 'error' = 'GivenBack' AND e ->> 'attempt' = j.attempt::text
           ) >= %(cap)s AS spent
    FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(run_counts)s::integer[],
                %(errors)b::text[])
         AS f(id, claim_token, run_count, error)
    JOIN akadze.jobs AS j ON j.id = f.id
    WHERE j.id = ANY (%(ids)s::bigint[])
)
UPDATE akadze.jobs AS j
SET state = CASE WHEN f.spent AND j.attempt >= j.max_attempts
                 THEN 'failed'::akadze.job_state ELSE 'queued'::akadze.job_state END,
    attempt = CASE WHEN f.spent THEN j.attempt ELSE j.attempt - 1 END,
    finished_at = CASE WHEN f.spent AND j.attempt >= j.max_attempts
                       THEN coalesce(%(now)s::timestamptz, now()) END,
    errors = akadze.append_error(j.errors, f.entry || CASE WHEN f.spent THEN jsonb_build_object(
        'spent', true,
        'message', (f.entry ->> 'message') || format(
            '; given back %%s times at this attempt: the attempt is spent', %(cap)s + 1))
        ELSE jsonb_build_object('spent', false) END),
    worker_id = NULL
FROM f
-- include: outcome_rows
RETURNING j.id, j.state;

-- name: finish_succeeded
-- The common case of finish_jobs alone (runs that returned), without the CASEs
-- and the errors append: about a third cheaper per row.
UPDATE akadze.jobs AS j
SET state = 'succeeded',
    result = f.result::jsonb,
    finished_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(run_counts)s::integer[],
            %(results)b::text[])
     AS f(id, claim_token, run_count, result)
-- include: outcome_rows
RETURNING j.id;

-- name: finish_one
-- The same change for one job, used by complete_tx() inside the task's own
-- transaction (the task's writes commit with it, or not at all).
UPDATE akadze.jobs AS j
SET state = 'succeeded',
    result = %(result)s::jsonb,
    finished_at = coalesce(%(now)s::timestamptz, now())
FROM (VALUES (%(id)s::bigint, %(claim_token)s::bigint, %(run_count)s::integer))
     AS f(id, claim_token, run_count)
WHERE j.id = f.id AND
-- include: run_fence
RETURNING j.id;

-- name: rescue_expired
-- Lease expiry. Delete the workers whose heartbeat is older than their lease and
-- take back the running jobs of any worker that has no row any more (deleted
-- just now, or earlier by another rescuer, or never registered once the job
-- started longer than orphan_grace ago). The run is spent: back to 'queued'
-- keeping the original run_at (its place in the queue), or 'failed' on the last
-- attempt. Rows locked by a finishing worker are skipped (SKIP LOCKED); they are
-- finished, or orphans next time. The entry records which run was rescued (its
-- run_count and claim token), and the token is cleared: the rescued run is fenced
-- out even before the job is claimed again, and a worker that checks its runs after
-- reconnecting (worker_runs_lost) sees that it lost this one.
--
-- Bounded by what is lost, not by what runs: every maintenance tick of every
-- worker runs this, and a test on "running jobs whose worker has no row" read
-- every running job of the cluster (all of jobs_running_worker_idx). Instead
-- the workers that hold running jobs are listed by a skip scan of that index
-- (one probe per distinct worker_id, `holders`), and only the jobs of the
-- dead and the missing ones are read, each through the same index. The rows
-- are then locked one by one through the primary key (LATERAL) and re-checked
-- there by one "(...) IS TRUE" test (still running, for the same worker), which
-- no index answers: nothing in the statement can make the plan walk the table,
-- whatever its statistics say (docs/explanation/claim.md, "Plans that cannot
-- go wrong").
WITH RECURSIVE dead AS (
    DELETE FROM akadze.workers AS w
    WHERE w.heartbeat_at + w.lease < coalesce(%(now)s::timestamptz, now())
    RETURNING w.id
), holders AS (
    (SELECT r.worker_id FROM akadze.jobs AS r
     WHERE r.state = 'running' AND r.worker_id IS NOT NULL
     ORDER BY r.worker_id
     LIMIT 1)
    UNION ALL
    SELECT (SELECT r.worker_id FROM akadze.jobs AS r
            WHERE r.state = 'running' AND r.worker_id > h.worker_id
            ORDER BY r.worker_id
            LIMIT 1)
    FROM holders AS h
    WHERE h.worker_id IS NOT NULL
), candidates AS (
    -- The running jobs of the workers deleted just now (their rows are still
    -- visible to the rest of this statement, so the next arm skips them).
    SELECT r.id, r.worker_id
    FROM dead AS d
    CROSS JOIN LATERAL (
        SELECT r.id, r.worker_id FROM akadze.jobs AS r
        WHERE r.state = 'running' AND r.worker_id = d.id
        -- OFFSET 0: a probe per dead worker; pulled up, the arm was planned as
        -- a hash join that read every running job of the cluster.
        OFFSET 0) AS r
    UNION ALL
    -- Those of workers with no row, once started longer than orphan_grace ago.
    SELECT r.id, r.worker_id
    FROM holders AS h
    CROSS JOIN LATERAL (
        SELECT r.id, r.worker_id FROM akadze.jobs AS r
        WHERE r.state = 'running' AND r.worker_id = h.worker_id
          AND r.started_at < coalesce(%(now)s::timestamptz, now())
                             - %(orphan_grace)s * interval '1 second'
        OFFSET 0) AS r
    WHERE h.worker_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM akadze.workers AS w WHERE w.id = h.worker_id)
    UNION ALL
    -- And running jobs without a worker (never registered), as orphans.
    SELECT r.id, r.worker_id FROM akadze.jobs AS r
    WHERE r.state = 'running' AND r.worker_id IS NULL
      AND r.started_at < coalesce(%(now)s::timestamptz, now())
                         - %(orphan_grace)s * interval '1 second'
), lost AS (
    SELECT j.id
    FROM candidates AS c
    CROSS JOIN LATERAL (
        SELECT j.id FROM akadze.jobs AS j
        WHERE j.id = c.id
          AND (j.state = 'running' AND j.worker_id IS NOT DISTINCT FROM c.worker_id) IS TRUE
        FOR UPDATE SKIP LOCKED) AS j
)
UPDATE akadze.jobs AS j
SET state = CASE WHEN j.attempt >= j.max_attempts
                 THEN 'failed'::akadze.job_state ELSE 'queued'::akadze.job_state END,
    finished_at = CASE WHEN j.attempt >= j.max_attempts
                       THEN coalesce(%(now)s::timestamptz, now()) END,
    errors = akadze.append_error(j.errors, jsonb_build_object(
        'attempt', j.attempt,
        'at', coalesce(%(now)s::timestamptz, now()),
        'error', 'WorkerLost',
        'message', 'worker ' || coalesce(j.worker_id, '(none)')
                   || ' stopped renewing its lease; the run was abandoned',
        'run_count', j.run_count,
        -- as text: a 64-bit integer does not survive every JSON reader
        'claim_token', j.claim_token::text)),
    worker_id = NULL,
    claim_token = NULL
-- The ids as one array (an InitPlan): an index condition on jobs_pkey. Joined to
-- `lost` instead, a table analyzed while nothing ran was updated through a
-- sequential scan and a hash join.
WHERE j.id = ANY (ARRAY(SELECT lost.id FROM lost))
RETURNING
-- include: job_columns
, j.state;

-- name: end_unresponsive_claims
-- A maintenance step: end the sessions that hold a queue's claim turn (the advisory
-- lock of claim_start, class 6384484) while they wait for their client, inside their
-- transaction, for longer than %(after)s seconds (the lease). A claim sends its
-- statements back to back; one that waits on its client that long has a worker that
-- stopped answering without closing its connection (a partitioned network, a stopped
-- process). No server timeout ends it: in the middle of a pipeline the session is
-- 'active', not idle in a transaction. Meanwhile every other claim of the queue waits
-- for the turn, so the queue would stall for as long as the partition lasts. Ending
-- the session rolls its claim back. Real time (clock_timestamp()), not the injectable
-- clock: this is about how long a session has waited. A session of another role
-- cannot be ended without its rights (pg_signal_backend): it is left out.
SELECT a.pid, a.application_name,
       extract(epoch FROM clock_timestamp() - a.state_change)::float8 AS waited,
       pg_terminate_backend(a.pid)
FROM pg_stat_activity AS a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.wait_event_type = 'Client' AND a.wait_event = 'ClientRead'
  AND a.xact_start IS NOT NULL
  AND a.state_change < clock_timestamp() - %(after)s * interval '1 second'
  AND (a.usename = current_user OR pg_has_role('pg_signal_backend', 'MEMBER'))
  AND EXISTS (SELECT 1 FROM pg_locks AS l
              WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.classid = 6384484
                AND l.objsubid = 2 AND l.granted);

-- name: maintenance_try_lock
-- One rescuer at a time across the cluster: the first statement of the rescue's
-- transaction, an advisory lock taken without waiting ("akadzemt" as a 64-bit
-- number) and held to its COMMIT. Transaction-scoped, not session-level: through
-- a pooler in transaction mode a session lock and its unlock can land on two
-- server connections (and a lock left on a pooled server connection would stop
-- every rescue). Rounds may overlap after the rescue, which every later step
-- allows.
--
-- And one round per period for the cluster (migration 0015): the lock holder
-- goes on with the round only when the last round began %(every)s seconds ago or
-- more, and marks this one begun; it prunes too when the last prune began
-- %(prune_every)s seconds ago or more. Server time (now()), not the injectable
-- clock: the period is about the server's load. A mark in the future (the
-- server's clock stepped back) does not hold rounds off. The UPDATE runs only
-- for the lock holder (the InitPlan filter is false for everyone else, who
-- touch no row), so nobody waits on the row's lock. The row is committed with
-- the rescue: a failed rescue leaves the round due.
--
-- Returns locked (the lock was free), due (go on with the round), prune, and live:
-- the workers whose lease holds, which spaces each worker's tries (a hundred
-- workers try about three times a second between them, not a hundred).
WITH turn AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(7019811528365141364) AS locked
), marked AS (
    UPDATE akadze.maintenance AS m
    SET last_round_at = now(),
        last_pruned_at = CASE
            WHEN m.last_pruned_at > now() - %(prune_every)s * interval '1 second'
                 AND m.last_pruned_at <= now()
            THEN m.last_pruned_at ELSE now() END
    WHERE (SELECT locked FROM turn)
      AND NOT (m.last_round_at > now() - %(every)s * interval '1 second'
               AND m.last_round_at <= now())
    RETURNING m.last_pruned_at = now() AS prune
)
SELECT (SELECT locked FROM turn) AS locked,
       EXISTS (SELECT 1 FROM marked) AS due,
       COALESCE((SELECT prune FROM marked), false) AS prune,
       (SELECT count(*) FROM akadze.workers w
        WHERE w.heartbeat_at + w.lease >= COALESCE(%(now)s::timestamptz, now())) AS live;

-- name: job_for_cancel
-- Lock the job whose cancellation is requested, to decide between the queued and
-- the running case without racing a claim.
SELECT
-- include: job_columns
, j.state
FROM akadze.jobs AS j
WHERE j.id = %(id)s
FOR UPDATE;

-- name: cancel_queued
UPDATE akadze.jobs AS j
SET state = 'cancelled',
    cancel_requested = true,
    finished_at = coalesce(%(now)s::timestamptz, now()),
    errors = akadze.append_error(j.errors, jsonb_build_object(
        'attempt', j.attempt, 'at', coalesce(%(now)s::timestamptz, now()),
        'error', 'Cancelled', 'message', 'cancelled before it ran'))
-- a reserved job too: its worker starts it only if the write that records the
-- start finds it still reserved (start_reserved); else it stops that run
WHERE j.id = %(id)s AND j.state IN ('queued', 'waiting', 'reserved')
RETURNING j.id;

-- name: cancel_running
-- A running job is told: the flag is what the worker's poll reads, and the
-- notification (delivered at commit) is the fast path.
WITH flagged AS (
    UPDATE akadze.jobs SET cancel_requested = true
    WHERE id = %(id)s AND state = 'running'
    RETURNING id
)
SELECT id, pg_notify('akadze_cancel', id::text) FROM flagged;

-- name: worker_running_in_queue
-- After a claim failed, what the database says this worker runs in one queue: a
-- claim whose commit went through while its reply was lost (a killed connection)
-- left jobs running for this worker that it never started. The worker gives
-- those back.
SELECT
-- include: job_columns
FROM akadze.jobs AS j
WHERE j.worker_id = %(worker_id)s AND j.state = 'running' AND j.queue = %(queue)s;

-- name: worker_queue_ready
-- The idle claim loop's look before it claims (akadze.worker._claims): might a claim
-- of the queue take or sweep anything now? One autocommit read, no lock, no turn: an
-- idle worker that finds nothing does not take the queue's claim turn at all, so a
-- hundred idle workers polling (or woken by a notification that another worker
-- serves) leave the turn to the claims that take something.
--
-- It must never say "nothing" when a claim would take or sweep something; saying
-- "something" for nothing only costs the claim it would have made anyway. So it
-- ignores the tasks filter, limits and fair turns, and asks only: is the queue not
-- paused, and does it hold a queued job with run_at <= now? That covers every row a
-- claim can take (claim_take: queued, run_at <= now) and every row its sweep can
-- cancel (claim_sweep re-checks run_at <= now too: a cancel-requested or expired
-- row is swept only once it is due, and it is still queued until then).
--
-- Bounded whatever the queue holds: a queue of a million jobs scheduled for
-- tomorrow must not be read here. The ready indexes (jobs_ready_free_idx,
-- jobs_ready_limited_idx: the queued rows, split by `limited`, which is NOT NULL,
-- so together they hold every queued row) are in (queue, priority DESC, run_at, id)
-- order, so the first entry of each priority level is the level's earliest run_at:
-- the level holds a due job exactly when that entry is due. `heads` walks the
-- levels from the top (a skip scan: one probe per level, each "priority < the last
-- one" LIMIT 1) and stops at the first level whose head is due. A queue whose jobs
-- are all due is answered by the first probe; one of future jobs costs one probe
-- per distinct priority (two for the usual single level) plus one that finds none.
--
-- Plans that cannot go wrong on stale statistics (docs/explanation/claim.md): each
-- probe has no filter at all (the due test is made on the row it returns, in the
-- recursion, not in the probe's WHERE), so an index path in queue order reads one
-- entry, and the only index whose predicate and order fit is the ready index of
-- its part; the ORDER BY ... LIMIT 1 is what a sequential scan would have to sort
-- for, and it costs more than a one-entry probe at any estimate of the table's
-- size. EXPLAINed on a table analyzed while empty and on one of 100 000 rows: the
-- same plan, Index Only Scans with LIMIT 1 (tests/test_worker_ready_check.py
-- checks the plan).
--
-- peers: when asked (the loop asks once per refresh interval, not every look), how
-- many live workers serve the queue (this one included), to spread their wake-ups
-- (akadze.worker._wakeup.wake_delay). Evaluated only when asked: an InitPlan under a
-- CASE runs when first needed. The workers table is small (a row per worker); a scan.
--
-- due_in: when nothing is ready, the seconds from the server's now (not the
-- worker's clock: skew does not matter) until the queue's next queued job becomes
-- due, NULL when the queue holds none (or is paused: resume_queue notifies). When
-- no head is due the recursion has walked every level, and each level's head is
-- its earliest run_at, so the least head is the queue's earliest queued run_at. A
-- listening worker waits for it instead of polling (akadze.worker._wakeup): every
-- statement that leaves a job queued notifies, so what is queued now and what the
-- notifications bring are all that can become claimable.
WITH RECURSIVE free_heads AS (
    (SELECT j.priority, j.run_at
     FROM akadze.jobs AS j
     WHERE j.queue = %(queue)s AND j.state = 'queued' AND NOT j.limited
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT 1)
    UNION ALL
    SELECT n.priority, n.run_at
    FROM free_heads AS h
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at
        FROM akadze.jobs AS j
        WHERE j.queue = %(queue)s AND j.state = 'queued' AND NOT j.limited
          AND j.priority < h.priority
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT 1) AS n
    WHERE h.run_at > coalesce(%(now)s::timestamptz, now())
), limited_heads AS (
    (SELECT j.priority, j.run_at
     FROM akadze.jobs AS j
     WHERE j.queue = %(queue)s AND j.state = 'queued' AND j.limited
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT 1)
    UNION ALL
    SELECT n.priority, n.run_at
    FROM limited_heads AS h
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at
        FROM akadze.jobs AS j
        WHERE j.queue = %(queue)s AND j.state = 'queued' AND j.limited
          AND j.priority < h.priority
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT 1) AS n
    WHERE h.run_at > coalesce(%(now)s::timestamptz, now())
)
-- The queue's pause and its earliest head are read once; ready and due_in both
-- follow from them (some head is due exactly when the least head is).
SELECT NOT q.paused AND coalesce(q.next_at <= coalesce(%(now)s::timestamptz, now()), false)
           AS ready,
       CASE WHEN %(peers)s::boolean THEN
           (SELECT count(*) FROM akadze.workers AS w
            WHERE %(queue)s = ANY (w.queues)
              AND w.heartbeat_at + w.lease >= coalesce(%(now)s::timestamptz, now()))
       END AS peers,
       CASE WHEN NOT q.paused THEN
           extract(epoch FROM q.next_at - coalesce(%(now)s::timestamptz, now()))::float8
       END AS due_in
FROM (SELECT EXISTS (SELECT 1 FROM akadze.queue_pauses AS p
                     WHERE p.queue = %(queue)s) AS paused,
             (SELECT min(h.run_at)
              FROM (SELECT f.run_at FROM free_heads AS f
                    UNION ALL
                    SELECT l.run_at FROM limited_heads AS l) AS h) AS next_at) AS q;
