-- Queries of `akadze bench limits-busy` (akadze.bench.limits_busy).

-- name: limits_busy_reset
TRUNCATE akadze.jobs, akadze.job_dependencies, akadze.workers, akadze.limits, akadze.start_marks

-- name: limits_busy_insert
-- %(count)s jobs of task %(task)s, the i-th of key %(prefix)s || (i %% %(keys)s):
-- the keys interleaved in queue order, as a mixed burst arrives. limited = true:
-- the keys' limits rows exist already (as enqueue would set it).
INSERT INTO akadze.jobs (queue, task, args, limit_key, limited)
SELECT 'default', %(task)s, jsonb_build_object('seconds', %(seconds)s::float8),
       %(prefix)s || (i %% %(keys)s)::text, true
FROM generate_series(0, %(count)s - 1) AS i

-- name: limits_busy_drained
-- Many keys, --drained-stats: a drain that has ended, for the statistics a
-- queue's table has between two bursts (autovacuum analyzes it after the
-- drain): %(count)s jobs of the keys, every one succeeded, none queued or
-- running. The run analyzes the table, deletes them (as pruning would) and
-- then enqueues its burst, with no ANALYZE after it.
INSERT INTO akadze.jobs (queue, task, args, limit_key, limited, state, attempt,
                         run_count, worker_id, started_at, finished_at, result)
SELECT 'default', %(task)s, jsonb_build_object('seconds', %(seconds)s::float8),
       %(prefix)s || (i %% %(keys)s)::text, true, 'succeeded', 1, 1,
       'drained-' || (i %% 2)::text, now(), now(), '{}'::jsonb
FROM generate_series(0, %(count)s - 1) AS i

-- name: limits_busy_analyze
ANALYZE akadze.jobs

-- name: limits_busy_prune
DELETE FROM akadze.jobs

-- name: limits_busy_done
-- Whether the run's jobs are all done: none queued or running, and some succeeded
-- (before the burst is enqueued the table is empty). Each worker process of a
-- scenario asks every 0.1 s, on the server being measured: one probe of a partial
-- index each (queued, running, finished), where counting every row of the table
-- took 2 ms a time, about 5 % of the server's CPU in a many-keys run. The checks
-- are evaluated in order and the first false one ends it: while the drain runs,
-- the first queued entry.
SELECT NOT EXISTS (SELECT 1 FROM akadze.jobs j WHERE j.state = 'queued')
       AND NOT EXISTS (SELECT 1 FROM akadze.jobs j WHERE j.state = 'running')
       -- a reserved job is not done either (none is left once every run ended)
       AND NOT EXISTS (SELECT 1 FROM akadze.jobs j WHERE j.state = 'reserved')
       AND EXISTS (SELECT 1 FROM akadze.jobs j WHERE j.state = 'succeeded') AS done

-- name: limits_busy_drain
-- Seconds from the first start to the last outcome, as the database saw them.
SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM akadze.jobs

-- name: limits_busy_use
-- Each key's use of its max_running: the time its jobs' functions ran (each task
-- returns its own wall-clock start and end, {"s": .., "e": ..}) over max_running
-- times the key's span from its first start to its last end. 1.0: the key ran at
-- its limit from its first job to its last. Per key, then their mean and minimum.
WITH runs AS (
    SELECT j.limit_key AS key, (j.result ->> 's')::float8 AS s, (j.result ->> 'e')::float8 AS e
    FROM akadze.jobs j
    WHERE j.state = 'succeeded'
), per_key AS (
    SELECT r.key, sum(r.e - r.s) / (l.max_running * (max(r.e) - min(r.s))) AS used
    FROM runs r
    JOIN akadze.limits l ON l.key = r.key
    GROUP BY r.key, l.max_running
)
SELECT avg(used)::float8, min(used)::float8, count(*) FROM per_key

-- name: limits_busy_marks
-- The same starts as the limit counts them: its start marks (the claim's clock,
-- epoch seconds), in order.
SELECT extract(epoch FROM started_at)::float8 AS s
FROM akadze.start_marks
ORDER BY 1

-- name: limits_busy_starts
-- The starts of the rate-limited key, in order (wall-clock seconds, as the tasks
-- saw them).
SELECT (result ->> 's')::float8 AS s
FROM akadze.jobs
WHERE state = 'succeeded'
ORDER BY 1
