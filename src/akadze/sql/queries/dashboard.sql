-- What the web dashboard reads (akadze.dashboard). Every page stays cheap however
-- big akadze.jobs grows: nothing here counts the whole table. Queued and running
-- jobs are counted on their partial indexes, and every count that could read a large
-- share of them stops at %(cap)s rows (the page then shows "10 000+"); finished jobs,
-- most of a long-lived table and indexed only by finished_at, are read as a sample of
-- the latest %(cap)s finishes, and the table's size per state is the planner's
-- estimate. %(now)s is one instant per page, read once (dashboard_clock), so that
-- every statement of a page agrees on "now".

-- name: dashboard_clock
SELECT coalesce(%(now)s::timestamptz, now());

-- fragment: dashboard_queued_queues
-- The queues with queued jobs, without reading their backlogs: a skip scan over
-- jobs_ready_key_idx (which leads with queue and holds every queued job), one index
-- descent per queue.
queued_queues(queue) AS (
    (SELECT j.queue FROM akadze.jobs AS j
     WHERE j.state = 'queued' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND j.queue > p.queue ORDER BY j.queue LIMIT 1)
    FROM queued_queues AS p
    WHERE p.queue IS NOT NULL
)

-- name: dashboard_queue_names
-- Every queue the cluster knows about now: with queued or running jobs, paused, or
-- served by a registered worker. A queue with only finished jobs and no worker is
-- left out (finding it would read the finished jobs).
WITH RECURSIVE
-- include: dashboard_queued_queues
SELECT queue FROM queued_queues WHERE queue IS NOT NULL
UNION
SELECT j.queue FROM akadze.jobs AS j WHERE j.state = 'running'
UNION
SELECT p.queue FROM akadze.queue_pauses AS p
UNION
SELECT unnest(w.queues) FROM akadze.workers AS w
ORDER BY 1;

-- name: dashboard_pauses
SELECT queue, paused_at FROM akadze.queue_pauses ORDER BY queue;

-- name: dashboard_queued
-- Per queue and priority: the ready jobs (run_at reached), the scheduled ones, and
-- the run_at of the first job in queue order. The queued jobs of a queue are in two
-- partial indexes in queue order, (queue, priority DESC, run_at, id): those of keys
-- without a limit (jobs_ready_free_idx) and those of limited keys
-- (jobs_ready_limited_idx). Within one priority they are sorted by run_at, so the
-- ready ones are a contiguous range and the scheduled ones the range after it: each
-- count is one range scan, stopped at %(cap)s entries, and the first entry of a
-- priority is its oldest job. The priorities are found with a skip scan (one descent
-- per priority; there are few). The two parts are written out in full because a
-- partial index is used only when the query states its predicate literally.
SELECT q.queue, part.priority, part.ready, part.scheduled, part.first_run_at
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    WITH RECURSIVE free_priorities(priority) AS (
        (SELECT j.priority FROM akadze.jobs AS j
         WHERE j.state = 'queued' AND NOT j.limited AND j.queue = q.queue
         ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND NOT j.limited AND j.queue = q.queue
                  AND j.priority < p.priority
                ORDER BY j.priority DESC LIMIT 1)
        FROM free_priorities AS p WHERE p.priority IS NOT NULL
    ), limited_priorities(priority) AS (
        (SELECT j.priority FROM akadze.jobs AS j
         WHERE j.state = 'queued' AND j.limited AND j.queue = q.queue
         ORDER BY j.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT j.priority FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.limited AND j.queue = q.queue
                  AND j.priority < p.priority
                ORDER BY j.priority DESC LIMIT 1)
        FROM limited_priorities AS p WHERE p.priority IS NOT NULL
    )
    SELECT f.priority,
           (SELECT count(*) FROM (
                SELECT FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND NOT j.limited AND j.queue = q.queue
                  AND j.priority = f.priority AND j.run_at <= %(now)s
                LIMIT %(cap)s) AS x) AS ready,
           (SELECT count(*) FROM (
                SELECT FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND NOT j.limited AND j.queue = q.queue
                  AND j.priority = f.priority AND j.run_at > %(now)s
                LIMIT %(cap)s) AS x) AS scheduled,
           (SELECT j.run_at FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND NOT j.limited AND j.queue = q.queue
              AND j.priority = f.priority
            ORDER BY j.run_at LIMIT 1) AS first_run_at
    FROM free_priorities AS f WHERE f.priority IS NOT NULL
    UNION ALL
    SELECT l.priority,
           (SELECT count(*) FROM (
                SELECT FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.limited AND j.queue = q.queue
                  AND j.priority = l.priority AND j.run_at <= %(now)s
                LIMIT %(cap)s) AS x),
           (SELECT count(*) FROM (
                SELECT FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.limited AND j.queue = q.queue
                  AND j.priority = l.priority AND j.run_at > %(now)s
                LIMIT %(cap)s) AS x),
           (SELECT j.run_at FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND j.limited AND j.queue = q.queue
              AND j.priority = l.priority
            ORDER BY j.run_at LIMIT 1)
    FROM limited_priorities AS l WHERE l.priority IS NOT NULL
) AS part;

-- name: dashboard_running
-- Running jobs per queue and limit key, exact: the running rows are few (at most the
-- cluster's slots) and jobs_running_key_idx holds them alone. started_since counts
-- the runs that started after %(since)s (the fairness page's starts).
SELECT j.queue, j.limit_key, count(*) AS running,
       count(*) FILTER (WHERE j.started_at > %(since)s) AS started_since
FROM akadze.jobs AS j
WHERE j.state = 'running'
GROUP BY j.queue, j.limit_key;

-- fragment: dashboard_finished_sample
-- The latest finishes, newest first, back to %(since)s but never more than %(cap)s of
-- them: a backward range scan of jobs_finished_idx (finished rows only), one heap
-- fetch per row. At a high throughput the sample covers less than the span asked
-- for; the page says which span it covers.
sample AS (
    SELECT j.queue, j.state, j.limit_key, j.started_at, j.finished_at
    FROM akadze.jobs AS j
    WHERE j.state IN ('succeeded', 'failed', 'cancelled')
      AND j.finished_at > %(since)s AND j.finished_at <= %(now)s
    ORDER BY j.finished_at DESC
    LIMIT %(cap)s
)

-- name: dashboard_finished
-- Throughput: the sample's finishes per queue, state and bucket (bucket 0 is the
-- latest %(bucket)s seconds), with the oldest finish per group so that the caller
-- knows how far back a full sample reaches.
WITH
-- include: dashboard_finished_sample
SELECT s.queue, s.state::text,
       floor(extract(epoch FROM %(now)s::timestamptz - s.finished_at) / %(bucket)s)::int,
       count(*), min(s.finished_at)
FROM sample AS s
GROUP BY 1, 2, 3;

-- name: dashboard_starts
-- Fairness: the starts per queue and limit key since %(since)s, the %(top)s groups
-- with the most starts of each queue, with the queue's total and its number of
-- groups. A start is a run that began after %(since)s and is still running (the
-- running rows, few, on their partial index) or finished in the sample. A run that
-- failed and waits for its retry is queued again and not counted: queued jobs carry
-- no index on started_at. sampled and oldest say what the sample covered.
WITH
-- include: dashboard_finished_sample
, starts AS (
    SELECT s.queue, s.limit_key FROM sample AS s WHERE s.started_at > %(since)s
    UNION ALL
    SELECT j.queue, j.limit_key FROM akadze.jobs AS j
    WHERE j.state = 'running' AND j.started_at > %(since)s
), per_group AS (
    SELECT st.queue, st.limit_key, count(*) AS starts
    FROM starts AS st
    GROUP BY st.queue, st.limit_key
), ranked AS (
    SELECT g.queue, g.limit_key, g.starts,
           -- COLLATE "C": any fixed order breaks the ties, and sorting thousands of
           -- keys by the database's collation costs several times more.
           row_number() OVER (PARTITION BY g.queue COLLATE "C"
                              ORDER BY g.starts DESC, g.limit_key COLLATE "C") AS rank,
           (sum(g.starts) OVER (PARTITION BY g.queue COLLATE "C"))::bigint AS total,
           count(*) OVER (PARTITION BY g.queue COLLATE "C") AS groups
    FROM per_group AS g
)
SELECT r.queue, r.limit_key, r.starts, r.total, r.groups,
       (SELECT count(*) FROM sample), (SELECT min(s.finished_at) FROM sample AS s)
FROM ranked AS r
WHERE r.rank <= %(top)s;

-- name: dashboard_estimates
-- The size of akadze.jobs per state as the planner estimates it (reltuples times the
-- frequency of each state in pg_stats), as of the last ANALYZE: free to read, never
-- exact. reltuples is -1 before the table was first analysed.
SELECT c.reltuples::float8,
       s.most_common_vals::text::text[],
       s.most_common_freqs::float8[],
       greatest(t.last_analyze, t.last_autoanalyze)
FROM pg_class AS c
LEFT JOIN pg_stats AS s
  ON s.schemaname = 'akadze' AND s.tablename = 'jobs' AND s.attname = 'state'
LEFT JOIN pg_stat_user_tables AS t ON t.relid = c.oid
WHERE c.oid = 'akadze.jobs'::regclass;

-- name: dashboard_limits
-- One page of limits rows, keys at their limit first, then by key; keyset paging
-- after (%(after_at_limit)s, %(after_key)s). The limits table is small (one row per
-- key with a limit); each row costs two probes: its running jobs on
-- jobs_running_key_idx and its starts in the window on start_marks_key_idx (at most
-- about max_starts marks). A mark exactly one window old is outside, as in the claim.
SELECT u.key, u.max_running, u.max_starts, u."window", u.running, u.starts, u.at_limit
FROM (
    SELECT l.key, l.max_running, l.max_starts, l."window", r.running, m.starts,
           (l.max_running IS NOT NULL AND r.running >= l.max_running)
           OR (l.max_starts IS NOT NULL AND m.starts >= l.max_starts) AS at_limit
    FROM akadze.limits AS l
    CROSS JOIN LATERAL (
        SELECT count(*) AS running FROM akadze.jobs AS j
        WHERE j.state = 'running' AND j.limit_key = l.key
    ) AS r
    CROSS JOIN LATERAL (
        SELECT count(*) AS starts FROM akadze.start_marks AS sm
        WHERE l."window" IS NOT NULL AND sm.key = l.key
          AND sm.started_at > %(now)s::timestamptz - l."window"
    ) AS m
    WHERE %(prefix)s::text IS NULL OR starts_with(l.key, %(prefix)s::text)
) AS u
WHERE %(after_key)s::text IS NULL
   OR (NOT u.at_limit, u.key) > (NOT %(after_at_limit)s::boolean, %(after_key)s::text)
ORDER BY NOT u.at_limit, u.key
LIMIT %(page)s;

-- name: dashboard_limits_total
-- How many limits rows there are (and at their limit is counted on the page only).
SELECT count(*) FROM akadze.limits
WHERE %(prefix)s::text IS NULL OR starts_with(key, %(prefix)s::text);

-- name: dashboard_waiting
-- Ready jobs waiting per (queue, key) pair (the arrays %(queues)s and %(keys)s, zipped),
-- for the keys of one page: a range of jobs_ready_key_idx (queue, limit_key, ...) per
-- pair, stopped at %(cap)s entries. The empty-string key stands for the jobs without
-- a key (the null group). The two cases are two subqueries (CASE runs one): an OR of
-- them would not use the index's second column and would read the whole queue once
-- per key.
SELECT p.queue, p.key, w.waiting
FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS p(queue, key)
CROSS JOIN LATERAL (
    SELECT CASE WHEN p.key = '' THEN (
        SELECT count(*) FROM (
            SELECT FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND j.queue = p.queue AND j.limit_key IS NULL
              AND j.run_at <= %(now)s
            LIMIT %(cap)s) AS x)
    ELSE (
        SELECT count(*) FROM (
            SELECT FROM akadze.jobs AS j
            WHERE j.state = 'queued' AND j.queue = p.queue AND j.limit_key = p.key
              AND j.run_at <= %(now)s
            LIMIT %(cap)s) AS x)
    END AS waiting
) AS w
WHERE w.waiting > 0;

-- name: dashboard_waiting_queues
-- The queues with queued jobs (see dashboard_queued_queues).
WITH RECURSIVE
-- include: dashboard_queued_queues
SELECT queue FROM queued_queues WHERE queue IS NOT NULL;

-- name: dashboard_groups
-- The fair groups (limit keys) with queued jobs, per queue of %(queues)s, in key order:
-- a skip scan over jobs_ready_key_idx (one descent per key), stopped after %(cap)s keys
-- per queue; the null group (jobs without a key) sorts last in the index and is looked
-- up on its own.
SELECT q.queue, g.key
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    WITH RECURSIVE keys(key) AS (
        (SELECT j.limit_key FROM akadze.jobs AS j
         WHERE j.state = 'queued' AND j.queue = q.queue AND j.limit_key IS NOT NULL
         ORDER BY j.limit_key LIMIT 1)
        UNION ALL
        SELECT (SELECT j.limit_key FROM akadze.jobs AS j
                WHERE j.state = 'queued' AND j.queue = q.queue AND j.limit_key > k.key
                ORDER BY j.limit_key LIMIT 1)
        FROM keys AS k
        WHERE k.key IS NOT NULL
    )
    (SELECT key FROM keys WHERE key IS NOT NULL LIMIT %(cap)s)
    UNION ALL
    SELECT NULL WHERE EXISTS (
        SELECT FROM akadze.jobs AS j
        WHERE j.state = 'queued' AND j.queue = q.queue AND j.limit_key IS NULL)
) AS g;

-- fragment: dashboard_job_filters
-- The filters of the jobs list; an unset filter is NULL and folds away.
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(states)s::akadze.job_state[] IS NULL
           OR j.state = ANY(%(states)s::akadze.job_state[]))
      AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
      AND (%(limit_key)s::text IS NULL OR j.limit_key = %(limit_key)s::text)
      AND (%(meta)s::jsonb IS NULL OR j.meta @> %(meta)s::jsonb)

-- fragment: dashboard_job_row
-- The columns of a row of the jobs list, with the last error's class and message.
j.id, j.queue, j.task, j.state::text, j.priority, j.attempt, j.max_attempts,
j.run_at, j.created_at, j.started_at, j.finished_at, j.limit_key,
j.errors -> -1 ->> 'error', j.errors -> -1 ->> 'message'

-- name: dashboard_jobs
-- One page of the jobs list, newest first, keyset-paged below id %(before)s. The
-- scan is bounded: it walks the primary key down through at most %(scan)s jobs and
-- keeps those matching the filters, so a filter that matches rarely costs
-- %(scan)s rows and not the whole table (the page then offers to search further
-- down, from where this scan stopped: dashboard_jobs_scan_end). The outer LIMIT
-- stops the walk as soon as the page is full.
SELECT
-- include: dashboard_job_row
FROM (
    SELECT * FROM akadze.jobs AS j
    WHERE j.id < %(before)s
    ORDER BY j.id DESC
    LIMIT %(scan)s
) AS j
WHERE true
-- include: dashboard_job_filters
ORDER BY j.id DESC
LIMIT %(page)s;

-- name: dashboard_jobs_running
-- The jobs list filtered to running jobs: those are few and have partial indexes of
-- their own, so the list reads them all instead of walking the whole table.
SELECT
-- include: dashboard_job_row
FROM akadze.jobs AS j
WHERE j.state = 'running' AND j.id < %(before)s
-- include: dashboard_job_filters
ORDER BY j.id DESC
LIMIT %(page)s;

-- name: dashboard_jobs_scan_end
-- Where a bounded scan of dashboard_jobs stopped: the lowest id it read, and how many
-- it read (fewer than %(scan)s: it reached the first job).
SELECT min(s.id), count(*)
FROM (
    SELECT j.id FROM akadze.jobs AS j
    WHERE j.id < %(before)s
    ORDER BY j.id DESC
    LIMIT %(scan)s
) AS s;

-- name: dashboard_failed_ids
-- The failed jobs a bulk requeue takes, newest first. An action, not a page: the
-- scan is not bounded, the number of jobs is.
SELECT j.id FROM akadze.jobs AS j
WHERE j.state = 'failed'
-- include: dashboard_job_filters
ORDER BY j.id DESC
LIMIT %(limit)s;

-- name: dashboard_schedule_fires
-- The latest recorded fire of each named schedule and the state of its job (NULL
-- job: the fire was skipped, or its job was pruned): one probe of the primary key
-- (schedule, fire_at) per schedule, backwards.
SELECT n.name, f.fire_at, f.job_id, j.state::text
FROM unnest(%(names)s::text[]) AS n(name)
CROSS JOIN LATERAL (
    SELECT pf.fire_at, pf.job_id FROM akadze.periodic_fires AS pf
    WHERE pf.schedule = n.name
    ORDER BY pf.fire_at DESC
    LIMIT 1
) AS f
LEFT JOIN akadze.jobs AS j ON j.id = f.job_id;

-- name: dashboard_schedule_names
-- The schedules that recorded a fire, for a dashboard started without the app (which
-- alone knows the schedules): a skip scan over the primary key of periodic_fires,
-- stopped after %(cap)s names.
WITH RECURSIVE names(name) AS (
    (SELECT pf.schedule FROM akadze.periodic_fires AS pf ORDER BY pf.schedule LIMIT 1)
    UNION ALL
    SELECT (SELECT pf.schedule FROM akadze.periodic_fires AS pf
            WHERE pf.schedule > n.name ORDER BY pf.schedule LIMIT 1)
    FROM names AS n
    WHERE n.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL LIMIT %(cap)s;

-- name: dashboard_job_family
-- The job page's parents and children (the ids get_job read, at most 1 000 of each):
-- their tasks and states, by primary key.
SELECT j.id, j.task, j.state::text
FROM akadze.jobs AS j
WHERE j.id = ANY (%(ids)s::bigint[])
ORDER BY j.id;
