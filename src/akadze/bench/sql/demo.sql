-- akadze demo: what the demo measures, read from the database rather than assumed.

-- name: demo_snapshot
-- One snapshot (a single statement: one consistent view) of the demo's queue per
-- limit key: its jobs in each state, and the starts the claim has recorded for
-- the key within its window. The demo samples this many times a second and keeps
-- the peaks, which it compares with the limits.
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
           AND m.started_at > now() - l."window") AS starts_in_window
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
