-- The reference claim: rank the whole ready set of the queue in one statement.
--
-- This is claim-semantics.md written as SQL, kept deliberately plain so that it
-- can be trusted: the property tests and `akadze bench claims` compare the
-- windowed claim (claim.sql) against it. It reads every ready row of the queue,
-- so it is linear in the queue length; production claims do not use it.
--
-- Parameters shared by every query here and in claim.sql:
--   queue  text, now timestamptz (resolved once per claim, never NULL),
--   tasks  text[] or NULL (NULL: any task).
-- "Ready" is always: queued in this queue, due, not cancel-requested, not
-- expired, of an allowed task. (A paused queue is handled before any of this:
-- the claim does nothing at all there.)

-- name: claim_oracle_lock
-- Lock the limits rows of every limited key that has a ready job. Every lock is
-- taken with SKIP LOCKED, so this statement never waits and cannot deadlock; a
-- key that another claim holds is simply not in the result and its jobs are left
-- to the next claim (the rank below leaves out limited keys it does not hold).
SELECT l.key
FROM akadze.limits l
WHERE l.key IN (
    SELECT j.limit_key
    FROM akadze.jobs j
    WHERE j.queue = %(queue)s
      AND j.state = 'queued'
      AND j.run_at <= %(now)s
      AND NOT j.cancel_requested
      AND (j.expires_at IS NULL OR j.expires_at > %(now)s)
      AND (%(tasks)s::text[] IS NULL OR j.task = ANY (%(tasks)s::text[]))
)
ORDER BY l.key
FOR NO KEY UPDATE OF l SKIP LOCKED

-- name: claim_oracle_rank
-- Runs as a NEW statement after the locks were granted: in READ COMMITTED it
-- gets a fresh snapshot, so running(k) and starts(k) include every commit made
-- by the claim that held a key before us. Jobs this transaction already took
-- (a re-plan after a short take) are 'running' here and count as such.
WITH ready AS (
    SELECT j.id, j.priority, j.run_at, j.limit_key, (l.key IS NOT NULL) AS limited
    FROM akadze.jobs j
    LEFT JOIN akadze.limits l ON l.key = j.limit_key
    WHERE j.queue = %(queue)s
      AND j.state = 'queued'
      AND j.run_at <= %(now)s
      AND NOT j.cancel_requested
      AND (j.expires_at IS NULL OR j.expires_at > %(now)s)
      AND (%(tasks)s::text[] IS NULL OR j.task = ANY (%(tasks)s::text[]))
      -- rows another claim held when we tried to take them
      AND NOT (j.id = ANY (%(skip_ids)s::bigint[]))
),
-- A limited key whose limits row we do not hold (another claim has it, or the
-- row appeared after we locked) is left out entirely: counting it without the
-- lock could let two claims both see the same free slot.
held AS (
    SELECT * FROM ready
    WHERE NOT limited OR limit_key = ANY (%(locked)s::text[])
),
headroom AS (
    -- LEAST ignores NULLs, so a missing policy does not constrain; the CHECK on
    -- akadze.limits guarantees that at least one policy is present.
    SELECT l.key,
           GREATEST(0, LEAST(
               l.max_running - (SELECT count(*) FROM akadze.jobs r
                                WHERE r.state = 'running' AND r.limit_key = l.key),
               l.max_starts - (SELECT count(*) FROM akadze.start_marks m
                               WHERE m.key = l.key AND m.started_at > %(now)s - l."window")
           )) AS headroom
    FROM akadze.limits l
    WHERE l.key = ANY (%(locked)s::text[])
),
numbered AS (
    -- n: position of the row among the ready rows of its key, in queue order
    SELECT h.id, h.priority, h.run_at, h.limit_key, hr.headroom,
           row_number() OVER (PARTITION BY h.limit_key
                              ORDER BY h.priority DESC, h.run_at, h.id) AS n
    FROM held h
    LEFT JOIN headroom hr ON hr.key = h.limit_key
),
eligible AS (
    SELECT id, priority, run_at, limit_key
    FROM numbered
    WHERE headroom IS NULL OR n <= headroom
),
-- busy(g): running jobs of the group in THIS queue. The groups with a key join
-- on "=" (a hash join); the null group, whose rows "=" never matches, has its
-- own count. (A join on IS NOT DISTINCT FROM cannot be hashed: it ran as a
-- nested loop, seconds per claim on a large queue.)
busy AS (
    SELECT r.limit_key, count(*) AS busy
    FROM akadze.jobs r
    WHERE r.state = 'running' AND r.queue = %(queue)s AND r.limit_key IS NOT NULL
    GROUP BY r.limit_key
),
null_busy AS (
    SELECT count(*) AS busy
    FROM akadze.jobs r
    WHERE r.state = 'running' AND r.queue = %(queue)s AND r.limit_key IS NULL
),
turned AS (
    -- PARTITION BY puts all null keys in one partition: the null group
    SELECT e.id, e.priority, e.run_at,
           CASE WHEN e.limit_key IS NULL THEN nb.busy ELSE COALESCE(b.busy, 0) END
           + row_number() OVER (PARTITION BY e.limit_key, e.priority
                                ORDER BY e.run_at, e.id) AS turn
    FROM eligible e
    CROSS JOIN null_busy nb
    LEFT JOIN busy b ON b.limit_key = e.limit_key
)
SELECT id
FROM turned
ORDER BY priority DESC,
         CASE WHEN %(fair)s THEN turn ELSE 0 END,
         run_at, id
LIMIT %(slots)s
