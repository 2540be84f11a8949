-- Statements of the claim that both the windowed claim and the oracle use.
-- Parameters: see claim_oracle.sql.

-- name: claim_begin
-- The claim's clock (the injected one, or the transaction's) and whether the
-- queue is paused; a paused queue is not touched at all.
SELECT COALESCE(%(now)s::timestamptz, now()) AS now,
       EXISTS (SELECT 1 FROM akadze.queue_pauses WHERE queue = %(queue)s) AS paused

-- name: claim_cancel_due
-- Due queued jobs that are cancel-requested or expired become 'cancelled'
-- instead of being claimed. The OR of the two arms is answered by the two
-- partial indexes of migration 0002 (a BitmapOr), not by a scan of the queue.
-- Bounded per claim so that a mass expiry cannot make one claim slow; the rest
-- goes with the next claims. SKIP LOCKED: a row someone else holds is theirs.
WITH doomed AS (
    SELECT j.id
    FROM akadze.jobs j
    WHERE j.queue = %(queue)s
      AND j.state = 'queued'
      AND j.run_at <= %(now)s
      AND (j.cancel_requested OR j.expires_at <= %(now)s)
      AND (%(tasks)s::text[] IS NULL OR j.task = ANY (%(tasks)s::text[]))
    ORDER BY j.id
    LIMIT 500
    FOR UPDATE SKIP LOCKED
)
UPDATE akadze.jobs j
SET state = 'cancelled', finished_at = %(now)s
FROM doomed
WHERE j.id = doomed.id
RETURNING j.id, j.queue, j.task, j.args, j.priority, j.run_at, j.limit_key, j.run_count,
          j.attempt, j.max_attempts, j.meta, j.unique_key, j.expires_at, j.worker_id,
          j.started_at

-- name: claim_prune_marks
-- Start marks older than their key's window no longer count; drop them. Only
-- keys whose limits rows this claim holds, so no one else is counting them.
DELETE FROM akadze.start_marks m
USING akadze.limits l
WHERE m.key = ANY (%(keys)s::text[])
  AND l.key = m.key
  AND m.started_at <= %(now)s - l."window"

-- name: claim_take
-- Take the planned rows. FOR UPDATE SKIP LOCKED re-checks every ready condition
-- on the newest version of each row (READ COMMITTED re-evaluation), so a row
-- that another claim took, or that was cancelled meanwhile, is simply missing
-- from the result, and the caller plans again. The start mark of a rate-limited
-- key is written in the same statement, so a re-plan counts it.
WITH picked AS (
    SELECT j.id
    FROM akadze.jobs j
    WHERE j.id = ANY (%(ids)s::bigint[])
      AND j.queue = %(queue)s
      AND j.state = 'queued'
      AND j.run_at <= %(now)s
      AND NOT j.cancel_requested
      AND (j.expires_at IS NULL OR j.expires_at > %(now)s)
    FOR UPDATE SKIP LOCKED
),
taken AS (
    UPDATE akadze.jobs j
    SET state = 'running',
        run_count = j.run_count + 1,
        attempt = j.attempt + 1,
        worker_id = %(worker_id)s,
        started_at = %(now)s
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.id, j.queue, j.task, j.args, j.priority, j.run_at, j.limit_key, j.run_count,
              j.attempt, j.max_attempts, j.meta, j.unique_key, j.expires_at, j.worker_id,
              j.started_at
),
marked AS (
    INSERT INTO akadze.start_marks (key, started_at, job_id)
    SELECT t.limit_key, %(now)s, t.id
    FROM taken t
    JOIN akadze.limits l ON l.key = t.limit_key
    WHERE l.max_starts IS NOT NULL
)
SELECT * FROM taken
