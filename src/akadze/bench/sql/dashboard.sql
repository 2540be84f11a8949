-- The data set of `akadze bench dashboard` (akadze.bench.dashboard): a table the size
-- the dashboard must stay fast at, written by a few INSERT ... SELECT generate_series
-- statements (seconds, where a million enqueues would take minutes). Harness SQL: the
-- runtime never runs it. %(now)s is the instant the data set is built around.
--
-- Jobs are numbered in the order a long-lived queue would have created them: the
-- finished ones first (the oldest ids), then the queued backlog, then the running
-- jobs, then the jobs queued for the night (the newest). Limit keys are tenants 'tenant:0000' .. ; the first
-- %(running)s tenants run one job each at max_running = 1, so they are at their limit.

-- name: bench_dashboard_limits
-- Every tenant has a concurrency limit; every tenth a start-rate limit as well.
INSERT INTO akadze.limits (key, max_running, max_starts, "window")
SELECT format('tenant:%%s', lpad(k::text, 4, '0')),
       CASE WHEN k < %(running)s THEN 1 ELSE 5 END,
       CASE WHEN k %% 10 = 0 THEN 100 END,
       CASE WHEN k %% 10 = 0 THEN interval '1 minute' END
FROM generate_series(0, %(keys)s - 1) AS k;

-- name: bench_dashboard_finished
-- Finished over the last day (retention keeps a week by default, so a week's worth
-- would be bigger and older, not more recent): one in 60 failed with an error and its
-- traceback, one in 250 cancelled. A run took up to two seconds.
INSERT INTO akadze.jobs (id, queue, task, args, state, priority, run_at, limit_key, meta,
                         attempt, max_attempts, run_count, errors, result, created_at,
                         started_at, finished_at, worker_id)
SELECT i,
       (ARRAY['default', 'emails', 'reports'])[1 + i %% 3],
       (ARRAY['sync_account', 'send_email', 'build_report'])[1 + i %% 3],
       jsonb_build_object('account_id', i),
       CASE WHEN i %% 60 = 0 THEN 'failed' WHEN i %% 250 = 1 THEN 'cancelled'
            ELSE 'succeeded' END::akadze.job_state,
       0,
       f.at - interval '3 seconds',
       format('tenant:%%s', lpad((i %% %(keys)s)::text, 4, '0')),
       CASE WHEN i %% 7 = 0 THEN jsonb_build_object('region', 'eu') ELSE '{}'::jsonb END,
       CASE WHEN i %% 60 = 0 THEN 3 ELSE 1 END,
       3,
       CASE WHEN i %% 60 = 0 THEN 3 ELSE 1 END,
       CASE WHEN i %% 60 = 0 THEN jsonb_build_array(jsonb_build_object(
           'attempt', 3, 'at', f.at, 'error', 'ConnectionError',
           'message', 'the account service did not answer',
           'traceback', 'Traceback (most recent call last):\n  File "jobs.py", line 12, '
                        'in sync_account\nConnectionError: the account service did not answer'))
            ELSE '[]'::jsonb END,
       CASE WHEN i %% 60 = 0 OR i %% 250 = 1 THEN NULL ELSE '"ok"'::jsonb END,
       f.at - interval '4 seconds',
       f.at - (i %% 2000) * interval '1 millisecond',
       f.at,
       'bench-worker-' || (i %% 4)
FROM generate_series(1, %(finished)s) AS i
CROSS JOIN LATERAL (
    SELECT %(now)s::timestamptz - interval '1 day' * (1 - i::float8 / %(finished)s) AS at
) AS f;

-- name: bench_dashboard_queued
-- The backlog: spread over the tenants and the three queues, one in ten scheduled in
-- the next hour (a delay or a retry backoff), one in twenty at priority 5. Every tenant
-- has a limits row, so every job is flagged limited, as enqueue would flag it.
INSERT INTO akadze.jobs (id, queue, task, args, state, priority, run_at, limit_key, meta,
                         limited, created_at)
SELECT %(finished)s + i,
       (ARRAY['default', 'emails', 'reports'])[1 + i %% 3],
       (ARRAY['sync_account', 'send_email', 'build_report'])[1 + i %% 3],
       jsonb_build_object('account_id', i),
       'queued',
       CASE WHEN i %% 20 = 0 THEN 5 ELSE 0 END,
       CASE WHEN i %% 10 = 0 THEN %(now)s::timestamptz + (i %% 3600) * interval '1 second'
            ELSE %(now)s::timestamptz - interval '10 minutes'
                 + i * interval '1 millisecond' * 600000 / %(queued)s END,
       format('tenant:%%s', lpad((i %% %(keys)s)::text, 4, '0')),
       CASE WHEN i %% 7 = 0 THEN jsonb_build_object('region', 'eu') ELSE '{}'::jsonb END,
       true,
       %(now)s::timestamptz - interval '10 minutes'
FROM generate_series(1, %(queued)s) AS i;

-- name: bench_dashboard_running
-- One running job for each of the first tenants (at their limit of one), claimed by
-- four workers within the last minutes.
INSERT INTO akadze.jobs (id, queue, task, args, state, run_at, limit_key, attempt,
                         run_count, created_at, started_at, worker_id)
SELECT %(finished)s + %(queued)s + i,
       (ARRAY['default', 'emails', 'reports'])[1 + i %% 3],
       (ARRAY['sync_account', 'send_email', 'build_report'])[1 + i %% 3],
       jsonb_build_object('account_id', i),
       'running',
       %(now)s::timestamptz - interval '5 minutes',
       format('tenant:%%s', lpad(((i - 1) %% %(keys)s)::text, 4, '0')),
       1,
       1,
       %(now)s::timestamptz - interval '5 minutes',
       %(now)s::timestamptz - (i * 2) * interval '1 second',
       'bench-worker-' || (i %% 4)
FROM generate_series(1, %(running)s) AS i;

-- name: bench_dashboard_later
-- The rest of the million: jobs without a key queued for the night in a fourth queue,
-- all scheduled (run_at tonight), none ready.
INSERT INTO akadze.jobs (id, queue, task, args, state, run_at, created_at)
SELECT %(finished)s + %(queued)s + %(running)s + i, 'nightly', 'rebuild_index',
       jsonb_build_object('shard', i), 'queued',
       date_trunc('day', %(now)s::timestamptz) + interval '1 day 2 hours'
           + (i %% 3600) * interval '1 second',
       %(now)s::timestamptz - interval '1 hour'
FROM generate_series(1, %(later)s) AS i;

-- name: bench_dashboard_marks
-- The starts the rate-limited tenants recorded in the last minute.
INSERT INTO akadze.start_marks (key, started_at, job_id)
SELECT l.key, %(now)s::timestamptz - (n * 500) * interval '1 millisecond', n
FROM akadze.limits AS l
CROSS JOIN generate_series(1, 40) AS n
WHERE l.max_starts IS NOT NULL;

-- name: bench_dashboard_workers
INSERT INTO akadze.workers (id, host, pid, queues, heartbeat_at)
SELECT 'bench-worker-' || w, 'bench-host-' || w, 1000 + w,
       ARRAY['default', 'emails', 'reports'], %(now)s::timestamptz
FROM generate_series(0, 3) AS w;

-- name: bench_dashboard_fires
-- Two schedules with a day of hourly fires each.
INSERT INTO akadze.periodic_fires (schedule, fire_at, job_id)
SELECT s, date_trunc('hour', %(now)s::timestamptz) - h * interval '1 hour', h + 1
FROM unnest(ARRAY['hourly_report', 'nightly_cleanup']) AS s
CROSS JOIN generate_series(0, 23) AS h;

-- name: bench_dashboard_sequence
SELECT setval(pg_get_serial_sequence('akadze.jobs', 'id'), %(total)s);

-- name: bench_dashboard_count
-- What was loaded (the bench's report; never a dashboard page).
SELECT count(*) FROM akadze.jobs;

-- name: bench_dashboard_failed_job
-- The job page the bench times: the newest failed job.
SELECT max(id) FROM akadze.jobs WHERE state = 'failed';
