-- Statements of `akadze bench cluster` (src/akadze/bench/cluster.py). They run
-- only in the bench's scratch database; the claims themselves are the public
-- `claim` and the plain floor `bench_plain_claim` (claims.sql).

-- name: cluster_backend_pid
SELECT pg_backend_pid() AS pid

-- name: cluster_turn_waits
-- One look at the claimers' backends: how many are waiting for an advisory lock
-- right now (the claim's turn, claim_start, is the only advisory lock these
-- sessions take), and how many backends there are.
SELECT count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'advisory')
           AS waiting,
       count(*) AS backends
FROM pg_stat_activity
WHERE pid = ANY (%(pids)s::int[])

-- name: cluster_plain_claim
-- The uncoordinated floor under concurrency: the classic queue claim, with no
-- limits, no fair turns and no queue turn. FOR UPDATE SKIP LOCKED sits in the
-- LIMIT subquery itself, so a claimer steps over rows another one has locked
-- and still takes `slots` rows (claims.sql's bench_plain_claim picks 20 ids
-- first and locks after, which is right for one claimer timed alone but comes
-- back empty when two race). The bench's plain and fifo queues hold free
-- (limited = false) jobs only, so this reads jobs_ready_free_idx in order.
WITH picked AS (
    SELECT c.id
    FROM akadze.jobs c
    WHERE c.queue = %(queue)s AND c.state = 'queued' AND NOT c.limited
      AND c.run_at <= now()
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(slots)s
    FOR UPDATE SKIP LOCKED
)
UPDATE akadze.jobs j
SET state = 'running', run_count = j.run_count + 1, attempt = j.attempt + 1,
    worker_id = %(worker_id)s, started_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.run_count
