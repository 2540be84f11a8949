-- Limits administration: set, clear and list the cluster-wide limits of limit keys.
--
-- The claim locks a key's limits row (FOR NO KEY UPDATE) before counting its
-- running jobs and starts; these statements take the same row lock (or a
-- stronger one), so a change of a limit is serialised with the claims that read
-- it: a claim sees either the old or the new row, never half of each.
--
-- jobs.limited (migration 0005) follows the limits rows: set_limit flags the
-- queued jobs of a new key, and deleting the row unflags them (a trigger).
-- Those updates read the queued jobs of every queue (jobs_ready_key_idx leads
-- with the queue): a scan of the queued jobs, fine for an administrative call.

-- name: limit_lock
-- The current row of one key, locked until the end of the transaction so that
-- the merge of omitted fields (done in Python) cannot race another writer.
-- No row is locked when the key has no limit yet; the upsert below then merges
-- on conflict by itself.
SELECT max_running, max_starts, "window"
FROM akadze.limits
WHERE key = %(key)s
-- NO KEY UPDATE, like a claim: FOR UPDATE would also wait for every open
-- transaction that queued a job of this key (they hold FOR KEY SHARE).
FOR NO KEY UPDATE

-- name: limit_upsert
-- Insert or update one key. The set_* flags say which fields the caller gave:
-- an omitted field keeps the stored value, even when a concurrent insert of the
-- same key won the race between limit_lock and this statement. The table's
-- CHECK constraints are the last word on the merged row.
--
-- A key that gets its first row has its queued jobs flagged `limited`, so that
-- they leave jobs_ready_free_idx (xmax = 0: the row was inserted, not updated).
-- A job queued concurrently and not seen here keeps limited = false, which the
-- claim handles (migration 0005).
WITH stored AS (
    INSERT INTO akadze.limits AS l (key, max_running, max_starts, "window", updated_at)
    VALUES (%(key)s, %(max_running)s, %(max_starts)s, %(window)s, now())
    ON CONFLICT (key) DO UPDATE SET
        max_running = CASE WHEN %(set_max_running)s THEN EXCLUDED.max_running ELSE l.max_running END,
        max_starts = CASE WHEN %(set_max_starts)s THEN EXCLUDED.max_starts ELSE l.max_starts END,
        "window" = CASE WHEN %(set_window)s THEN EXCLUDED."window" ELSE l."window" END,
        updated_at = now()
    RETURNING key, max_running, max_starts, "window", (xmax = 0) AS inserted
), flagged AS (
    UPDATE akadze.jobs j
    SET limited = true
    WHERE j.state = 'queued' AND j.limit_key = %(key)s AND NOT j.limited
      AND (SELECT inserted FROM stored)
)
SELECT key, max_running, max_starts, "window" FROM stored

-- name: limit_isolation
-- clear_limit needs READ COMMITTED (migration 0005, limits_unflag).
SELECT current_setting('transaction_isolation')

-- name: limit_delete
-- Takes FOR UPDATE on the row, so it waits for every open transaction that
-- queued a job of the key (they hold FOR KEY SHARE); then the trigger
-- limits_unflag clears the flag of the key's queued jobs (migration 0005).
DELETE FROM akadze.limits
WHERE key = %(key)s
RETURNING key

-- name: limit_delete_marks
-- The start marks of a cleared key go with it: a limit set again later starts
-- from an empty window instead of inheriting stale starts.
DELETE FROM akadze.start_marks
WHERE key = %(key)s

-- name: limit_list
-- Every limit with its current use. running counts the key's running jobs in
-- every queue (limits are cluster-wide; jobs_running_key_idx covers it);
-- starts_in_window counts the marks inside the sliding window ending at now,
-- with the same bound as the claim: a mark exactly one window old is outside.
-- %(now)s is the injectable clock; NULL means the database clock.
SELECT
    l.key,
    l.max_running,
    l.max_starts,
    l."window",
    (SELECT count(*)
       FROM akadze.jobs j
      WHERE j.state = 'running' AND j.limit_key = l.key) AS running,
    CASE WHEN l."window" IS NULL THEN 0 ELSE
        (SELECT count(*)
           FROM akadze.start_marks m
          WHERE m.key = l.key
            AND m.started_at > coalesce(%(now)s::timestamptz, now()) - l."window")
    END AS starts_in_window
FROM akadze.limits l
ORDER BY l.key

-- name: limit_next_start
-- When the soonest of the keys `keys` (a jsonb array: the keys a worker's claim
-- left without room) gets room for a start again: seconds from now (from
-- %(now)s, the injectable clock), NULL when none of them is held by a start-rate
-- limit. A key has room when fewer than max_starts of its marks are inside the
-- window ending at now (the claim's bound: a mark exactly one window old is
-- outside), so its window opens when its max_starts-th newest mark leaves it:
-- exact, read backwards on start_marks_key_idx, one index probe per key. A key
-- held by max_running as well gets a claim that finds no room: a wasted claim,
-- never a missed one. Sent only by a claim loop about to wait (a short claim
-- that left keys without room), never inside the claim.
--
-- Also the opening itself and the server's clock as the reply leaves (epoch
-- seconds; clock_timestamp(), not now(): the statement's start came earlier):
-- the loop turns the opening into its own time by the smallest gap it has seen
-- between a reply's clock and its arrival (akadze.worker._serverclock), instead
-- of counting from this reply's arrival, which opened every window late by the
-- reply's whole trip.
--
-- `opens_at` is the opening as a timestamptz, exact to the microsecond: the claim
-- the loop sends for it waits for that moment on the server (claim_start_at's
-- not_before).
--
-- And `open_now`: some key's window is open already and nothing else is known
-- to hold it (its kept running count is under max_running). Its claim came a
-- little too early (the server's clock and the loop's drifted apart:
-- _serverclock), and without this the loop would wait for a poll.
SELECT extract(epoch FROM min(o.opens) - coalesce(%(now)s::timestamptz, now()))::float8,
       extract(epoch FROM min(o.opens))::float8 AS opens,
       extract(epoch FROM clock_timestamp())::float8 AS clock,
       COALESCE(bool_or(o.opens IS NULL AND COALESCE(l.running < l.max_running, true)),
                false) AS open_now,
       min(o.opens) AS opens_at
FROM akadze.limits l
LEFT JOIN LATERAL (
    SELECT m.started_at + l."window" AS opens
    FROM akadze.start_marks m
    WHERE m.key = l.key
      AND m.started_at > coalesce(%(now)s::timestamptz, now()) - l."window"
    ORDER BY m.started_at DESC
    OFFSET l.max_starts - 1
    LIMIT 1
) o ON true
WHERE l.key IN (SELECT jsonb_array_elements_text(%(keys)b))
  AND l.max_starts IS NOT NULL
