-- Limits administration: set, clear and list the cluster-wide limits of limit keys.
--
-- The claim locks a key's limits row (FOR UPDATE) before counting its running
-- jobs and starts; these statements take the same row lock, so a change of a
-- limit is serialised with the claims that read it: a claim sees either the
-- old or the new row, never half of each.

-- name: limit_lock
-- The current row of one key, locked until the end of the transaction so that
-- the merge of omitted fields (done in Python) cannot race another writer.
-- No row is locked when the key has no limit yet; the upsert below then merges
-- on conflict by itself.
SELECT max_running, max_starts, "window"
FROM akadze.limits
WHERE key = %(key)s
FOR UPDATE

-- name: limit_upsert
-- Insert or update one key. The set_* flags say which fields the caller gave:
-- an omitted field keeps the stored value, even when a concurrent insert of the
-- same key won the race between limit_lock and this statement. The table's
-- CHECK constraints are the last word on the merged row.
INSERT INTO akadze.limits AS l (key, max_running, max_starts, "window", updated_at)
VALUES (%(key)s, %(max_running)s, %(max_starts)s, %(window)s, now())
ON CONFLICT (key) DO UPDATE SET
    max_running = CASE WHEN %(set_max_running)s THEN EXCLUDED.max_running ELSE l.max_running END,
    max_starts = CASE WHEN %(set_max_starts)s THEN EXCLUDED.max_starts ELSE l.max_starts END,
    "window" = CASE WHEN %(set_window)s THEN EXCLUDED."window" ELSE l."window" END,
    updated_at = now()
RETURNING key, max_running, max_starts, "window"

-- name: limit_delete
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
