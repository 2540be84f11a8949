-- Workflows, awaited results and progress as the running job and its waiters see them
-- (migration 0012). The enqueue side is in enqueue.sql.

-- name: job_parent_results
-- current().parent_results(): the parents of a job with their states and results,
-- on the primary key of job_dependencies (child_id first).
SELECT d.parent_id, p.state::text, p.result
FROM akadze.job_dependencies AS d
JOIN akadze.jobs AS p ON p.id = d.parent_id
WHERE d.child_id = %(id)s
ORDER BY d.parent_id;

-- name: progress_write
-- What running tasks reported (current().progress), coalesced by the worker to at
-- most one write a second per job, all pending jobs in one statement. Fenced by the
-- run (run_count), not by the state: the last report of a short run often comes
-- after its outcome, and is kept; a job claimed again since is left alone.
UPDATE akadze.jobs AS j
SET progress = p.fraction,
    progress_message = p.message,
    progress_at = coalesce(%(now)s::timestamptz, now())
FROM unnest(%(ids)s::bigint[], %(run_counts)s::integer[], %(fractions)s::float8[],
            %(messages)s::text[]) AS p(id, run_count, fraction, message)
WHERE j.id = p.id AND j.run_count = p.run_count;

-- name: wait_mark
-- wait_for: the job is marked awaited, so that its terminal write notifies
-- akadze_done (the trigger jobs_finished tests the flag, and jobs nobody waits for
-- notify nothing). The mark takes the row lock: a terminal write in flight is waited
-- for, and the state returned is what it committed; a terminal write after this
-- commit sees the flag. Returns nothing for an unknown id.
UPDATE akadze.jobs SET awaited = true WHERE id = %(id)s RETURNING state::text;

-- name: wait_mark_many
-- The shared waiters of a process (akadze.waiters): the jobs its new waiters await,
-- marked in one statement (only those not marked yet: a mark is never written twice).
-- As wait_mark, the UPDATE waits for a terminal write in flight on a row it marks;
-- the states are read by wait_states right after, in a statement of their own (its
-- snapshot sees that write and every mark committed meanwhile by another process).
UPDATE akadze.jobs SET awaited = true
WHERE id = ANY (%(ids)s::bigint[]) AND NOT awaited;

-- name: wait_states
-- The shared waiters' read of their jobs' states: after the mark, at each
-- notification of one of them, and at each poll (the fallback), on the primary key.
SELECT id, state::text FROM akadze.jobs WHERE id = ANY (%(ids)s::bigint[]);

-- name: wait_state
-- wait_for's poll (and its check after each notification).
SELECT state::text FROM akadze.jobs WHERE id = %(id)s;

-- name: wait_listen
LISTEN akadze_done;

-- name: wait_unlisten
UNLISTEN akadze_done;

-- name: metrics_progress
-- akadze_job_progress: the running jobs that reported progress, on the small partial
-- index of running rows; at most 1 000 (one series per job: a gauge for the
-- long jobs one follows, not for a backlog).
SELECT j.id, j.queue, j.task, j.progress
FROM akadze.jobs AS j
WHERE j.state = 'running' AND j.progress IS NOT NULL
ORDER BY j.id
LIMIT 1000;
