-- akadze demo: what the demo measures, read from the database rather than assumed.

-- name: demo_snapshot
-- One snapshot (a single statement: one consistent view) of the demo's queue per
-- limit key: its jobs in each state, and the starts the claim has recorded for
-- the key within its window. The demo samples this many times a second and keeps
-- the peaks, which it compares with the limits. The columns are the fields of
-- demo_plan.Counts, in order.
SELECT j.limit_key,
       count(*) FILTER (WHERE j.state = 'queued') AS queued,
       count(*) FILTER (WHERE j.state = 'queued' AND j.attempt > 0) AS retrying,
       count(*) FILTER (WHERE j.state = 'running') AS running,
       count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE j.state IN ('failed', 'cancelled')) AS failed,
       (SELECT count(*)
          FROM akadze.start_marks m
          JOIN akadze.limits l ON l.key = m.key AND l."window" IS NOT NULL
         WHERE m.key = j.limit_key
           AND m.started_at > now() - l."window") AS starts_in_window,
       count(*) FILTER (WHERE j.priority > 0) AS urgent,
       count(*) FILTER (WHERE j.priority > 0 AND j.state = 'succeeded') AS urgent_succeeded
FROM akadze.jobs j
WHERE j.queue = %(queue)s
GROUP BY j.limit_key

-- name: demo_jobs
-- Every job of the demo's queue at the end, for the checks. started_at is the
-- claim's database time of the last run; the earlier, failed runs of a job are
-- known by the times of their recorded errors.
SELECT limit_key, task, priority, state::text, attempt,
       ARRAY(SELECT (e ->> 'at')::timestamptz
               FROM jsonb_array_elements(errors) AS e
              ORDER BY 1) AS failed_at,
       created_at, started_at, finished_at
FROM akadze.jobs
WHERE queue = %(queue)s

-- name: demo_leftover_runs
-- The queues of earlier demo runs that left something behind (jobs kept with
-- --keep, or a run killed before it could clean up): a queue named demo-<run id>
-- (eight hex digits) holding jobs of the demo's tasks, or a limit key or start mark
-- demo-<run id>:<tenant>. A queue that a live worker serves belongs to a demo
-- running right now (in another terminal) and is left alone.
WITH found AS (
    SELECT DISTINCT queue FROM akadze.jobs
    WHERE queue ~ '^demo-[0-9a-f]{8}$' AND task IN ('demo.work', 'demo.flaky')
    UNION
    SELECT split_part(key, ':', 1) FROM akadze.limits WHERE key ~ '^demo-[0-9a-f]{8}:'
    UNION
    SELECT split_part(key, ':', 1) FROM akadze.start_marks WHERE key ~ '^demo-[0-9a-f]{8}:'
)
SELECT f.queue FROM found AS f
WHERE NOT EXISTS (
    SELECT 1 FROM akadze.workers AS w
    WHERE f.queue = ANY (w.queues) AND w.heartbeat_at + w.lease >= now()
)
ORDER BY f.queue;

-- name: demo_remove_jobs
-- The jobs of these demo runs (only the demo's own tasks, in their own queues).
DELETE FROM akadze.jobs
WHERE queue = ANY (%(queues)s::text[]) AND task IN ('demo.work', 'demo.flaky');

-- name: demo_remove_limits
-- Their limits (the limits_unflag trigger finds no job of these keys any more).
DELETE FROM akadze.limits
WHERE split_part(key, ':', 1) = ANY (%(queues)s::text[]) AND key ~ '^demo-[0-9a-f]{8}:';

-- name: demo_remove_marks
DELETE FROM akadze.start_marks
WHERE split_part(key, ':', 1) = ANY (%(queues)s::text[]) AND key ~ '^demo-[0-9a-f]{8}:';

-- name: demo_remove_pauses
DELETE FROM akadze.queue_pauses WHERE queue = ANY (%(queues)s::text[]);
