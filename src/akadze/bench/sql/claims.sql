-- Statements of `akadze bench claims` (src/akadze/bench/claims.py). They run
-- only in the bench's scratch database (or one given with --in-place), never in
-- production code paths. The load test checks every claim commit with the shared
-- watch (watch.sql).

-- name: bench_reset
-- An empty queue world for the next scenario. TRUNCATE rather than DELETE: the
-- next build then starts from clean tables and indexes.
TRUNCATE akadze.jobs, akadze.job_dependencies, akadze.limits, akadze.start_marks,
    akadze.queue_pauses RESTART IDENTITY

-- name: bench_stale_tables
-- --stale-stats: autovacuum leaves the queue's tables alone in the bench's
-- database, so that the statistics taken while the tables were empty stay
-- stale for the whole run, as between two autovacuum runs of a busy cluster.
ALTER TABLE akadze.jobs SET (autovacuum_enabled = false, toast.autovacuum_enabled = false);
ALTER TABLE akadze.limits SET (autovacuum_enabled = false);
ALTER TABLE akadze.start_marks SET (autovacuum_enabled = false)

-- name: bench_insert_ready
-- One segment of ready jobs, in queue order: row g (start <= g < stop) gets
-- run_at = base + g ms, so g is also its place in the queue within a priority,
-- and ids follow g (ORDER BY g). Keys: prefix || ((g / block) mod keys), i.e. the
-- keys take turns in runs of `block` rows; keys = 0 means no limit_key. A job of
-- a key with a limits row is flagged limited, as enqueue flags it.
INSERT INTO akadze.jobs (queue, task, priority, run_at, limit_key, limited, created_at)
SELECT %(queue)s, 'bench', %(priority)s,
       %(base)s::timestamptz + g * interval '1 millisecond',
       k.key, EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = k.key),
       %(base)s::timestamptz
FROM generate_series(%(start)s::int, %(stop)s::int - 1) AS g
CROSS JOIN LATERAL (
    SELECT CASE WHEN %(keys)s::int = 0 THEN NULL
                ELSE %(prefix)s || ((g / %(block)s::int) %% %(keys)s::int)::text END AS key
) k
ORDER BY g

-- name: bench_insert_load
-- The load test's queue: rows alternate between a key (k0 .. k(keys-1) in
-- turn) and no key, so both halves are spread over the whole queue. Flagged
-- limited as enqueue would flag them.
INSERT INTO akadze.jobs (queue, task, run_at, limit_key, limited, created_at)
SELECT %(queue)s, 'bench',
       %(base)s::timestamptz + g * interval '1 millisecond',
       k.key, EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = k.key),
       %(base)s::timestamptz
FROM generate_series(0, %(jobs)s::int - 1) AS g
CROSS JOIN LATERAL (
    SELECT CASE WHEN g %% 2 = 0 THEN 'k' || ((g / 2) %% %(keys)s::int)::text END AS key
) k
ORDER BY g

-- name: bench_insert_running
-- `per_key` running jobs for each of the keys prefix0 .. prefix(keys-1),
-- flagged limited when the key has a limits row, as a claim's take flags them.
INSERT INTO akadze.jobs (queue, task, state, limit_key, limited, run_count, attempt,
                         worker_id, run_at, started_at)
SELECT %(queue)s, 'bench', 'running', %(prefix)s || k::text,
       EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = %(prefix)s || k::text),
       1, 1, 'bench-busy', %(base)s::timestamptz, %(base)s::timestamptz
FROM generate_series(0, %(keys)s::int - 1) AS k,
     generate_series(1, %(per_key)s::int) AS n

-- name: bench_drain_all
-- --drained-stats: the drain that ended before the burst. Every job finishes
-- (succeeded, none queued or running), as the statistics autovacuum then takes
-- see the table; the build analyzes it next and sends the burst after. A run's
-- worker_id stays, as an outcome write leaves it (worker.sql, finish_jobs): with
-- it cleared, the statistics said no finished job had a worker, which no drain
-- leaves.
UPDATE akadze.jobs SET state = 'succeeded', finished_at = now()
WHERE state IN ('queued', 'running')

-- name: bench_insert_limits
-- A concurrency limit on each of the keys prefix0 .. prefix(keys-1).
INSERT INTO akadze.limits (key, max_running)
SELECT %(prefix)s || k::text, %(max_running)s::int
FROM generate_series(0, %(keys)s::int - 1) AS k

-- name: bench_restore
-- Undo one claim exactly (the bench's claims commit, like a worker's): the
-- claimed rows go back to queued with their counters as they were, and their
-- start marks go away.
WITH marks AS (
    DELETE FROM akadze.start_marks WHERE job_id = ANY (%(ids)s::bigint[])
)
UPDATE akadze.jobs
SET state = 'queued', run_count = run_count - 1, attempt = attempt - 1,
    worker_id = NULL, started_at = NULL
WHERE id = ANY (%(ids)s::bigint[]) AND state = 'running'

-- name: bench_load_complete
-- The load test's outcome write, fenced like a worker's: a row is finished only
-- while it is still running under the run_count it was claimed with.
UPDATE akadze.jobs j
SET state = 'succeeded', finished_at = now()
FROM unnest(%(ids)s::bigint[], %(run_counts)s::int[]) AS c(id, run_count)
WHERE j.id = c.id AND j.run_count = c.run_count AND j.state = 'running'

-- name: bench_load_over_limit
-- One consistent sample (one snapshot): keys running more jobs than max_running.
SELECT j.limit_key, count(*) AS running, l.max_running
FROM akadze.jobs j
JOIN akadze.limits l ON l.key = j.limit_key
WHERE j.state = 'running' AND l.max_running IS NOT NULL
GROUP BY j.limit_key, l.max_running
HAVING count(*) > l.max_running

-- name: bench_load_progress
SELECT count(*) FILTER (WHERE state = 'succeeded') AS completed,
       count(*) FILTER (WHERE run_count > 0) AS claimed,
       count(*) FILTER (WHERE run_count > 1) AS claimed_twice
FROM akadze.jobs
WHERE queue = %(queue)s

-- name: bench_plain_claim
-- The floor the claim is compared with: the plain claim of a queue without
-- limits or fairness, one statement: the first `slots` ready rows in queue order
-- (the free and the limited ready indexes of migration 0005 merged, `slots`
-- entries from each), FOR UPDATE SKIP LOCKED, marked running. Not exact for any
-- queue with limits or fair turns; timed only to show what a claim of 20 costs
-- on this host at all. Written out rather than through akadze.ready_window: this
-- statement runs with custom plans (no claim_start before it), and the inlined
-- function's body was planned again at every execution (1.7 ms instead of 1.0).
WITH picked AS (
    SELECT j.id
    FROM akadze.jobs j
    WHERE j.id IN (
        SELECT h.id FROM (
            (SELECT c.id, c.priority, c.run_at FROM akadze.jobs c
             WHERE c.queue = %(queue)s AND c.state = 'queued' AND NOT c.limited
               AND c.run_at <= now()
             ORDER BY c.priority DESC, c.run_at, c.id LIMIT %(slots)s)
            UNION ALL
            (SELECT c.id, c.priority, c.run_at FROM akadze.jobs c
             WHERE c.queue = %(queue)s AND c.state = 'queued' AND c.limited
               AND c.run_at <= now()
             ORDER BY c.priority DESC, c.run_at, c.id LIMIT %(slots)s)
            ORDER BY 2 DESC, 3, 1
            LIMIT %(slots)s) h)
      AND j.state = 'queued'
    FOR UPDATE SKIP LOCKED
)
UPDATE akadze.jobs j
SET state = 'running', run_count = j.run_count + 1, attempt = j.attempt + 1,
    worker_id = 'bench', started_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING
-- include: job_columns
