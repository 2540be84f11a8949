-- akadze schema, version 5: the queued jobs of keys without a limit and those of
-- limited keys are indexed apart, so that a claim steps over keys at their
-- limit without reading their backlogs.
--
-- Only a key with a limits row can be at its limit. When many keys are at their
-- limit and their jobs lead the queue, a claim that reads the queue in order
-- reads every one of those jobs to find the free ones behind them (linear in
-- the queue: ~110 ms at a million jobs). With this version a window reads the
-- jobs of keys without a limit from jobs_ready_free_idx and those of limited
-- keys either in order from jobs_ready_limited_idx or, when it leaves keys out,
-- per key from jobs_ready_key_idx: a key at its limit then costs nothing,
-- however many jobs it holds (akadze.ready_window below).
--
-- jobs.limited says that the job's key had a limits row when the job became
-- queued. The claim relies on one rule only: a queued job with limited = true
-- has a limits row (otherwise the per-key read would never reach it). A queued
-- job with limited = false whose key gained a row meanwhile is fine: it is read
-- with the free jobs, and the claim looks up the limits row of every key it
-- meets, as it always did.
--
-- The rule is kept by whatever sets the flag:
-- * enqueue (enqueue.sql) sets it from the limits table, locking the key's row
--   FOR KEY SHARE (as a foreign key does), so that clear_limit cannot delete the
--   row until the enqueuing transaction has ended; an insert that does not set
--   it (an application's own INSERT) leaves it false, which is safe;
-- * the trigger below sets it, the same way, when a job becomes queued again
--   (retry, rescue, requeue, snooze, give-back);
-- * deleting a limits row (clear_limit, or any DELETE) waits for those
--   transactions, then a trigger on akadze.limits sets limited = false on the
--   key's queued jobs, in a statement of its own that sees theirs (below);
-- * set_limit of a new key sets limited = true on the key's queued jobs (not
--   needed for the rule, only so that they leave the free index).
-- Claims lock limits rows FOR NO KEY UPDATE, which FOR KEY SHARE does not
-- conflict with: an open transaction that enqueued a job of a key never holds
-- up a claim of that key.
--
-- Enqueue sets the flag instead of an insert trigger: a row trigger on every
-- insert of a job with a key cost enqueue_many a tenth of its throughput. The
-- two partial indexes replace jobs_ready_idx, so a job still has one entry in
-- an index in queue order, and a queue whose jobs are all free or all limited
-- reads one of them as before.
ALTER TABLE akadze.jobs ADD COLUMN limited boolean NOT NULL DEFAULT false;

UPDATE akadze.jobs j
SET limited = true
WHERE j.state = 'queued'
  AND j.limit_key IN (SELECT l.key FROM akadze.limits l);

DROP INDEX akadze.jobs_ready_idx;

-- The ready jobs of keys without a limits row (and of no key), in queue order.
-- INCLUDE (limit_key): the claim leaves out keys with an index-only scan.
CREATE INDEX jobs_ready_free_idx ON akadze.jobs (queue, priority DESC, run_at, id)
    INCLUDE (limit_key)
    WHERE state = 'queued' AND NOT limited;

-- The ready jobs of limited keys, in queue order.
CREATE INDEX jobs_ready_limited_idx ON akadze.jobs (queue, priority DESC, run_at, id)
    INCLUDE (limit_key)
    WHERE state = 'queued' AND limited;

CREATE FUNCTION akadze.set_limited() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.limited := NEW.limit_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM akadze.limits l WHERE l.key = NEW.limit_key FOR KEY SHARE);
    RETURN NEW;
END
$$;

-- WHEN is checked by the executor without a call: an update that does not queue
-- a job (or change a queued job's key) pays nothing.
CREATE TRIGGER jobs_limited_update
    BEFORE UPDATE OF state, limit_key ON akadze.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'queued' AND (NEW.limit_key IS NOT NULL OR NEW.limited)
          AND (OLD.state <> 'queued' OR OLD.limit_key IS DISTINCT FROM NEW.limit_key))
    EXECUTE FUNCTION akadze.set_limited();

-- After a limits row is deleted (or its key changed), the key's queued jobs lose
-- their flag. The DELETE waited for every transaction holding the row FOR KEY
-- SHARE (those that queued jobs of the key); in READ COMMITTED each statement of
-- this VOLATILE function takes a new snapshot, which sees their jobs. At a
-- stricter isolation level it would not (the transaction's snapshot predates
-- them): clear_limit refuses to run there (limits.py), and a DELETE by hand
-- must run in READ COMMITTED, the default.
CREATE FUNCTION akadze.unflag_limited() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE akadze.jobs j
    SET limited = false
    WHERE j.state = 'queued' AND j.limit_key = OLD.key AND j.limited;
    RETURN NULL;
END
$$;

CREATE TRIGGER limits_unflag
    AFTER DELETE OR UPDATE OF key ON akadze.limits
    FOR EACH ROW
    EXECUTE FUNCTION akadze.unflag_limited();

-- The entries of a claim window (claim.sql, claim_window_candidates): the next
-- `size` entries of the queue after the position P = (after_priority,
-- after_run_at, after_id) in queue order (priority DESC, run_at, id), due at
-- `clock`, leaving out the keys in skip_keys (a jsonb array of strings) and the
-- null group when skip_null. From the head of the queue: after_priority =
-- 32768, above every smallint.
--
-- A function so that the claim's window statements stay under the 4 KiB up to
-- which psycopg caches its conversion of a query's placeholders (longer texts
-- are parsed again at every execution). It is a single SELECT, LANGUAGE sql,
-- STABLE, not STRICT: PostgreSQL inlines it into the calling statement, whose
-- generic plan is then the plan of this body with the caller's parameters (no
-- function call at run time; EXPLAIN shows the index scans, not a Function
-- Scan; tests/test_limited_flag.py checks it). A change to it is a new
-- migration (CREATE OR REPLACE FUNCTION).
--
-- The window is the first `size` entries of the union of two parts, each read
-- `size` entries deep at most:
--
-- free: the jobs with limited = false, in order from jobs_ready_free_idx, the
-- excluded keys filtered one index tuple at a time (an index-only scan).
--
-- limited: the jobs with limited = true, read one of two ways; `route` picks
-- one per execution, and the other sits under a one-time filter and never runs.
-- * in order from jobs_ready_limited_idx, filtered like the free part: the
--   entries of excluded keys are stepped over one index tuple each, so a window
--   behind 200 000 entries of keys at their limit reads them all;
-- * split: per limited key that is not excluded, from jobs_ready_key_idx (a
--   LATERAL probe over the limits rows). Keys at their limit always have a
--   limits row and are excluded, so their backlogs are not read at all. Each
--   limits row that is not excluded costs a probe and up to `size` entries, so
--   split is chosen only when at most split_max (windows.SPLIT_MAX) limits rows
--   are not excluded, and something is excluded (otherwise the ordered read
--   steps over nothing). Counting them reads the limits table up to the next
--   such row.
-- A queued job with limited = true has a limits row (the rule above), so the
-- split read misses none; the two parts are disjoint by the flag, so no job
-- comes twice.
--
-- "After P" is two contiguous index ranges glued by UNION ALL (claim.sql, "The
-- windowed claim"); the exclusions are "NOT IN (SELECT
-- jsonb_array_elements_text(..))", a hashed subplan (claim.sql, claim_window).
CREATE FUNCTION akadze.ready_window(
    queue_name text, after_priority integer, after_run_at timestamptz, after_id bigint,
    clock timestamptz, skip_keys jsonb, skip_null boolean, size integer, split_max integer)
RETURNS TABLE (id bigint, priority smallint, run_at timestamptz, limit_key text)
LANGUAGE sql STABLE
AS $$
    WITH route AS MATERIALIZED (
        SELECT jsonb_array_length(skip_keys) > 0
               AND (SELECT count(*) FROM (
                       SELECT 1 FROM akadze.limits l
                       WHERE l.key NOT IN (SELECT jsonb_array_elements_text(skip_keys))
                       LIMIT GREATEST(split_max + 1, 0)) x) <= split_max AS split
    )
    SELECT u.* FROM (
        (SELECT c.id, c.priority, c.run_at, c.limit_key
         FROM akadze.jobs c
         WHERE c.queue = queue_name
           AND c.state = 'queued' AND NOT c.limited
           AND c.priority = after_priority
           AND (c.run_at, c.id) > (after_run_at, after_id)
           AND c.run_at <= clock
           AND (c.limit_key IS NOT NULL OR NOT skip_null)
           AND (c.limit_key IS NULL OR c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_keys)))
         ORDER BY c.priority DESC, c.run_at, c.id
         LIMIT size)
        UNION ALL
        (SELECT c.id, c.priority, c.run_at, c.limit_key
         FROM akadze.jobs c
         WHERE c.queue = queue_name
           AND c.state = 'queued' AND NOT c.limited
           AND c.priority < after_priority
           AND c.run_at <= clock
           AND (c.limit_key IS NOT NULL OR NOT skip_null)
           AND (c.limit_key IS NULL OR c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_keys)))
         ORDER BY c.priority DESC, c.run_at, c.id
         LIMIT size)
        UNION ALL
        SELECT o.* FROM (
            (SELECT c.id, c.priority, c.run_at, c.limit_key
             FROM akadze.jobs c
             WHERE c.queue = queue_name
               AND c.state = 'queued' AND c.limited
               AND c.priority = after_priority
               AND (c.run_at, c.id) > (after_run_at, after_id)
               AND c.run_at <= clock
               AND c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_keys))
             ORDER BY c.priority DESC, c.run_at, c.id
             LIMIT size)
            UNION ALL
            (SELECT c.id, c.priority, c.run_at, c.limit_key
             FROM akadze.jobs c
             WHERE c.queue = queue_name
               AND c.state = 'queued' AND c.limited
               AND c.priority < after_priority
               AND c.run_at <= clock
               AND c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_keys))
             ORDER BY c.priority DESC, c.run_at, c.id
             LIMIT size)
        ) o
        WHERE NOT (SELECT split FROM route)
        UNION ALL
        SELECT k.*
        FROM akadze.limits l
        CROSS JOIN LATERAL (
            (SELECT c.id, c.priority, c.run_at, c.limit_key
             FROM akadze.jobs c
             WHERE c.queue = queue_name AND c.state = 'queued' AND c.limit_key = l.key
               AND c.limited
               AND c.priority = after_priority
               AND (c.run_at, c.id) > (after_run_at, after_id)
               AND c.run_at <= clock
             -- limit_key first: the order of jobs_ready_key_idx (claim_group_rows)
             ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
             LIMIT size)
            UNION ALL
            (SELECT c.id, c.priority, c.run_at, c.limit_key
             FROM akadze.jobs c
             WHERE c.queue = queue_name AND c.state = 'queued' AND c.limit_key = l.key
               AND c.limited
               AND c.priority < after_priority
               AND c.run_at <= clock
             ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
             LIMIT size)
            LIMIT size
        ) k
        WHERE (SELECT split FROM route)
          AND l.key NOT IN (SELECT jsonb_array_elements_text(skip_keys))
    ) u
    ORDER BY u.priority DESC, u.run_at, u.id
    LIMIT size
$$;
