-- akadze schema, version 5: queued jobs of keys without a limit have an index
-- of their own, so that a claim steps over keys at their limit without reading
-- their backlogs.
--
-- Only a key with a limits row can be at its limit. When many keys are at their
-- limit and their jobs lead the queue, a claim that reads the queue in order
-- reads every one of those jobs to find the free ones behind them (linear in
-- the queue: ~110 ms at a million jobs). With this version a claim that leaves
-- keys out reads the queue as two parts (claim.sql, claim_window_candidates):
-- the jobs of keys without a limit, in order, from jobs_ready_free_idx, and the
-- jobs of each limited key that is not left out, from jobs_ready_key_idx. A key
-- at its limit then costs nothing, however many jobs it holds.
--
-- jobs.limited says that the job's key had a limits row when the job became
-- queued. The claim relies on one rule only: a queued job with limited = true
-- has a limits row (otherwise it would be in neither part and never claimed).
-- A queued job with limited = false whose key gained a row meanwhile is fine:
-- it stays in the first part, and the claim looks up the limits row of every
-- key it meets there, as it always did.
--
-- The rule is kept by the triggers below and by clear_limit:
-- * a job that becomes queued (insert, retry, rescue, requeue) sets its flag
--   from the limits table, locking the row FOR KEY SHARE (as a foreign key
--   does), so that a clear_limit cannot delete the row until the transaction
--   that queued the job has ended;
-- * clear_limit deletes the row (waiting for those transactions), then, in a
--   new statement that sees their jobs, sets limited = false on the key's
--   queued jobs (limits.sql);
-- * set_limit sets limited = true on the key's queued jobs (not needed for
--   correctness, only so that they leave the free index).
-- Claims lock limits rows FOR NO KEY UPDATE, which FOR KEY SHARE does not
-- conflict with: an open transaction that enqueued a job of a key never holds
-- up a claim of that key.
ALTER TABLE akadze.jobs ADD COLUMN limited boolean NOT NULL DEFAULT false;

UPDATE akadze.jobs j
SET limited = true
WHERE j.state = 'queued'
  AND j.limit_key IN (SELECT l.key FROM akadze.limits l);

-- The ready rows of keys without a limits row (and of no key), in queue order.
-- Every unlimited job has an entry here as well as in jobs_ready_idx: the price
-- of one more index entry per enqueue of such a job.
CREATE INDEX jobs_ready_free_idx ON akadze.jobs (queue, priority DESC, run_at, id)
    INCLUDE (limit_key)
    WHERE state = 'queued' AND NOT limited;

CREATE FUNCTION akadze.set_limited() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.limited := NEW.limit_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM akadze.limits l WHERE l.key = NEW.limit_key FOR KEY SHARE);
    RETURN NEW;
END
$$;

-- WHEN is checked by the executor without a call: a job without a key pays
-- nothing, and an update that does not queue a job (or change its key) pays
-- nothing.
CREATE TRIGGER jobs_limited_insert
    BEFORE INSERT ON akadze.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'queued' AND (NEW.limit_key IS NOT NULL OR NEW.limited))
    EXECUTE FUNCTION akadze.set_limited();

CREATE TRIGGER jobs_limited_update
    BEFORE UPDATE OF state, limit_key ON akadze.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'queued' AND (NEW.limit_key IS NOT NULL OR NEW.limited)
          AND (OLD.state <> 'queued' OR OLD.limit_key IS DISTINCT FROM NEW.limit_key))
    EXECUTE FUNCTION akadze.set_limited();

-- The entries of a claim window (claim.sql, claim_window_candidates): the next
-- `size` entries of the queue after the position P = (after_priority,
-- after_run_at, after_id) in queue order (priority DESC, run_at, id), leaving
-- out the keys in skip_keys (a jsonb array of strings) and the null group when
-- skip_null, due at `clock`.
--
-- A function so that the claim's window statements stay under the 4 KiB up to
-- which psycopg caches its conversion of a query's placeholders (longer texts
-- are parsed again at every execution). It is a single SELECT, LANGUAGE sql,
-- STABLE, not STRICT: PostgreSQL inlines it into the calling statement, whose
-- generic plan is then the plan of this body with the caller's parameters (no
-- function call at run time; EXPLAIN shows the index scans, not a Function
-- Scan). A change to it is a new migration (CREATE OR REPLACE FUNCTION).
--
-- Two ways to read the same entries; `route` picks one per execution, and the
-- arm of the other sits under a one-time filter and never runs.
--
-- whole: one ordered scan of jobs_ready_idx, stepping over the entries of the
-- excluded keys one index tuple at a time (an index-only scan). Linear in those
-- entries: 200 000 entries of keys at their limit ahead of the free ones cost
-- ~110 ms.
--
-- split: the jobs of keys without a limits row (limited = false) in order from
-- jobs_ready_free_idx, merged with the flagged jobs of each limited key that is
-- not excluded, read per key from jobs_ready_key_idx. Keys at their limit always
-- have a limits row, so their backlogs are not read at all. A queued job with
-- limited = true always has a limits row (see the top of this file), so nothing
-- falls between the two parts; a job with limited = false whose key has a row
-- is in the first part, and its key's state is looked up as for any key met
-- (claim_entries_with_state); the second part reads only flagged jobs, so no
-- job comes twice. The first `size` entries of the union are the first `size`
-- entries of the queue without the excluded keys: the same window either way.
-- Each limited key that is not excluded costs an index probe and up to `size`
-- entries, so split is chosen only when at most split_max (windows.SPLIT_MAX)
-- limits rows are not excluded, and something is excluded (otherwise whole
-- reads nothing it does not need). Counting them reads the limits table up to
-- the next such row.
--
-- "After P" is two contiguous index ranges glued by UNION ALL (claim.sql, the
-- windowed claim); the exclusions are "NOT IN (SELECT
-- jsonb_array_elements_text(..))", a hashed subplan (claim_window).
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
    SELECT w.* FROM (
        (SELECT c.id, c.priority, c.run_at, c.limit_key
         FROM akadze.jobs c
         WHERE c.queue = queue_name
           AND c.state = 'queued'
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
           AND c.state = 'queued'
           AND c.priority < after_priority
           AND c.run_at <= clock
           AND (c.limit_key IS NOT NULL OR NOT skip_null)
           AND (c.limit_key IS NULL OR c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_keys)))
         ORDER BY c.priority DESC, c.run_at, c.id
         LIMIT size)
        LIMIT size
    ) w
    WHERE NOT (SELECT split FROM route)
    UNION ALL
    SELECT s.* FROM (
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
            WHERE l.key NOT IN (SELECT jsonb_array_elements_text(skip_keys))
        ) u
        ORDER BY u.priority DESC, u.run_at, u.id
        LIMIT size
    ) s
    WHERE (SELECT split FROM route)
$$;
