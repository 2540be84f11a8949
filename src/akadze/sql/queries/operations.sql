-- Queries of the operations surface (akadze.control, akadze.overview,
-- akadze.retention, akadze.metrics). %(now)s is the injectable clock: NULL means
-- the database's now().

-- name: queue_pause
-- A row in queue_pauses pauses the queue for every worker: the claim reads it
-- and takes nothing. Running jobs are not touched and finish normally.
INSERT INTO akadze.queue_pauses (queue, paused_at)
VALUES (%(queue)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: queue_resume
-- Idle workers of the queue are woken at commit (the same channel the jobs
-- triggers use) instead of at their next poll.
WITH resumed AS (
    DELETE FROM akadze.queue_pauses WHERE queue = %(queue)s RETURNING queue
)
SELECT queue, pg_notify('akadze_jobs', queue) FROM resumed;

-- name: job_lock
-- The job an operator acts on, locked so that a claim or an outcome cannot
-- change it between the check of its state and the update.
SELECT
-- include: job_columns
, j.state
FROM akadze.jobs AS j
WHERE j.id = %(id)s
FOR UPDATE;

-- name: job_requeue
-- failed/cancelled -> queued, with a fresh set of attempts (attempt = 0) and the
-- same max_attempts. The errors array is kept: it is the job's history. run_count
-- is never reset: it is the fencing token, and a stale finish from a run before
-- the requeue must still be refused.
UPDATE akadze.jobs AS j
SET state = 'queued',
    attempt = 0,
    run_at = coalesce(%(now)s::timestamptz, now()),
    cancel_requested = false,
    worker_id = NULL,
    started_at = NULL,
    finished_at = NULL,
    result = NULL
WHERE j.id = %(id)s AND j.state IN ('failed', 'cancelled')
RETURNING
-- include: job_columns
, j.state;

-- name: job_retry_now
-- A queued job waiting for its run_at (a retry backoff, a delay) becomes ready
-- now. The row stays queued, so the jobs triggers do not notify: this does, and
-- idle workers of its queue are woken at commit instead of at their next poll.
WITH moved AS (
    UPDATE akadze.jobs
    SET run_at = coalesce(%(now)s::timestamptz, now())
    WHERE id = %(id)s AND state = 'queued' AND run_at > coalesce(%(now)s::timestamptz, now())
    RETURNING id, queue
)
SELECT id, pg_notify('akadze_jobs', queue) FROM moved;

-- name: job_get
SELECT
-- include: job_summary_columns
,
-- include: job_details_columns
FROM akadze.jobs AS j
WHERE id = %(id)s;

-- name: jobs_list
-- Newest first. Unset filters are NULL; psycopg sends the values with each
-- execution, so the planner folds the NULL tests away and uses the indexes that
-- the remaining predicates allow. The listing columns leave out args, result and
-- errors (see the fragment): get_job reads them, for one job.
SELECT
-- include: job_summary_columns
,
-- include: job_errors_summary
FROM akadze.jobs AS j
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(states)s::akadze.job_state[] IS NULL OR state = ANY(%(states)s::akadze.job_state[]))
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: jobs_list_meta
-- The same with a meta filter. jobs_meta_idx is partial (meta <> '{}'), so the
-- predicate is repeated here for the planner to use it: a non-empty containment
-- filter can only match a non-empty meta anyway.
SELECT
-- include: job_summary_columns
,
-- include: job_errors_summary
FROM akadze.jobs AS j
WHERE meta <> '{}'::jsonb
  AND meta @> %(meta)s::jsonb
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(states)s::akadze.job_state[] IS NULL OR state = ANY(%(states)s::akadze.job_state[]))
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: queue_state_counts
-- Jobs per queue and state. Counting finished jobs reads the whole table (they
-- are most of it); retention keeps it bounded.
SELECT queue, state::text, count(*)
FROM akadze.jobs
WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text
GROUP BY queue, state
ORDER BY queue, state;

-- name: queue_ready
-- Queued jobs per queue split into ready (run_at reached) and scheduled, and the
-- lag of the oldest ready job: how long it has been waiting past its run_at.
-- Reads the partial indexes of queued rows only.
SELECT queue,
       count(*) FILTER (WHERE run_at <= coalesce(%(now)s::timestamptz, now())) AS ready,
       count(*) FILTER (WHERE run_at > coalesce(%(now)s::timestamptz, now())) AS scheduled,
       coalesce(%(now)s::timestamptz, now())
           - min(run_at) FILTER (WHERE run_at <= coalesce(%(now)s::timestamptz, now())) AS lag
FROM akadze.jobs
WHERE state = 'queued' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
GROUP BY queue;

-- name: queue_unserved_tasks
-- Ready jobs of tasks that no live worker of their queue runs, per queue and task:
-- every claim passes them over, so they would wait in silence. Only queues that some
-- live worker serves (with none at all, every ready job waits, as the ready count and
-- the lag show) and that are not paused. A worker of an older akadze (tasks NULL) may
-- run anything. Counts the ready rows per task first (one pass over the queued rows,
-- like queue_ready), then looks at the few workers per (queue, task).
WITH ready AS (
    SELECT queue, task, count(*) AS jobs
    FROM akadze.jobs
    WHERE state = 'queued' AND run_at <= coalesce(%(now)s::timestamptz, now())
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    GROUP BY queue, task
), live AS (
    SELECT w.queues, w.tasks FROM akadze.workers AS w
    WHERE w.heartbeat_at + w.lease >= coalesce(%(now)s::timestamptz, now())
)
SELECT r.queue, r.task, r.jobs
FROM ready AS r
WHERE EXISTS (SELECT 1 FROM live WHERE r.queue = ANY (live.queues))
  AND NOT EXISTS (SELECT 1 FROM live WHERE r.queue = ANY (live.queues)
                                      AND (live.tasks IS NULL OR r.task = ANY (live.tasks)))
  AND NOT EXISTS (SELECT 1 FROM akadze.queue_pauses AS p WHERE p.queue = r.queue)
ORDER BY r.queue, r.task;

-- name: queue_pauses_list
SELECT queue, paused_at FROM akadze.queue_pauses
WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text;

-- name: workers_list
-- Live and presumed-dead workers (heartbeat older than the lease) with the jobs
-- they run, counted on the small partial index of running rows.
SELECT w.id, w.host, w.pid, w.queues, w.started_at, w.heartbeat_at,
       extract(epoch FROM w.lease)::float8,
       w.heartbeat_at + w.lease >= coalesce(%(now)s::timestamptz, now()) AS alive,
       (SELECT count(*) FROM akadze.jobs AS j
        WHERE j.state = 'running' AND j.worker_id = w.id) AS running
FROM akadze.workers AS w
ORDER BY w.host, w.pid, w.id;

-- name: retention_prune_batch
-- One bounded batch: the oldest finished jobs past their retention, found on
-- jobs_finished_idx (finished_at order, finished rows only). Failed jobs have a
-- retention of their own (kept longer, for inspection). SKIP LOCKED: a row an
-- operator is requeueing right now is left for the next round. A parent is kept
-- while any of its children has not finished (a waiting child still needs it, and a
-- child reads its parents' results when it runs: parent_results); the flag keeps
-- that probe off every other row.
--
-- One pruner at a time across the cluster: each batch takes an advisory lock
-- without waiting ("akadzert" as a 64-bit number), held to the batch's COMMIT;
-- a batch that does not get it deletes nothing (and the prune stops). The lock
-- is an uncorrelated scalar subquery, so it is evaluated once, before the scan
-- (a one-time filter). Transaction-scoped, not session-level, so that it works
-- through a pooler in transaction mode.
WITH doomed AS (
    SELECT p.id FROM akadze.jobs AS p
    WHERE (SELECT pg_try_advisory_xact_lock(7019811528365142644))
      AND p.state IN ('succeeded', 'failed', 'cancelled')
      AND p.finished_at < %(cutoff)s
      AND (p.state <> 'failed' OR p.finished_at < %(failed_cutoff)s)
      AND (NOT p.dependents OR NOT EXISTS (
          SELECT 1 FROM akadze.job_dependencies AS d
          JOIN akadze.jobs AS c ON c.id = d.child_id
          WHERE d.parent_id = p.id AND c.state NOT IN ('succeeded', 'failed', 'cancelled')))
    ORDER BY p.finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM akadze.jobs AS j USING doomed WHERE j.id = doomed.id;

-- name: retention_prune_fires
-- Fire records are only needed while a fire could still be enqueued (its grace)
-- and, for overlap=False, while their job is active. Bounded and locked like
-- the jobs' batches.
WITH doomed AS (
    SELECT f.schedule, f.fire_at FROM akadze.periodic_fires AS f
    WHERE (SELECT pg_try_advisory_xact_lock(7019811528365142644))
      AND f.fire_at < %(cutoff)s
      AND NOT EXISTS (SELECT 1 FROM akadze.jobs AS j
                      WHERE j.id = f.job_id AND j.state IN ('queued', 'running'))
    LIMIT %(batch)s
)
DELETE FROM akadze.periodic_fires AS f USING doomed
WHERE f.schedule = doomed.schedule AND f.fire_at = doomed.fire_at;

-- name: metrics_finished_recent
-- Throughput: jobs that finished in the last %(window)s seconds, per queue and
-- state (jobs_finished_idx: a range scan on finished_at).
SELECT queue, state::text, count(*)
FROM akadze.jobs
WHERE state IN ('succeeded', 'failed', 'cancelled')
  AND finished_at >= coalesce(%(now)s::timestamptz, now()) - %(window)s * interval '1 second'
GROUP BY queue, state;

-- name: metrics_running_by_key
-- Running jobs per limit key, with the key's concurrency limit when it has one.
SELECT r.limit_key, r.running, l.max_running
FROM (
    SELECT limit_key, count(*) AS running FROM akadze.jobs
    WHERE state = 'running' AND limit_key IS NOT NULL
    GROUP BY limit_key
) AS r
LEFT JOIN akadze.limits AS l ON l.key = r.limit_key
UNION ALL
SELECT l.key, 0, l.max_running FROM akadze.limits AS l
WHERE l.max_running IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM akadze.jobs AS j
                  WHERE j.state = 'running' AND j.limit_key = l.key)
ORDER BY 1;

-- name: metrics_session
-- The connection `akadze metrics --serve` keeps open between scrapes: a scrape never
-- keeps a statement running longer than this (the server answers 503 instead).
SET statement_timeout = '5s'
