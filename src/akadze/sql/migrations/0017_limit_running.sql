-- akadze schema, version 17: each limits row counts its key's running jobs.
--
-- A claim that remembers many keys without room judges them again in its first
-- window (migration 0016): for each key, a probe of limits_pkey and a count of
-- the key's running jobs through jobs_running_key_idx. The count was most of
-- the claim: about 6 us a key, 6-10 ms for a queue headed by 1 000 keys at
-- their limit (benchmarks/claims.md). With the count kept in the limits row,
-- judging a key is reading that row.
--
-- limits.running counts the jobs of the key that are running AND flagged
-- `limited`. It is kept by the statement triggers below, in the same
-- transaction as every change to such a job, and it is never more than that
-- number: so a key it shows at its limit is at its limit, in every snapshot; a
-- key it shows with room is counted the old way before anything is taken from
-- it. A run now starts flagged if its key has a limits row (the run_start
-- fragment of claim_take and hand_off_take: a job queued before its key got a
-- limit was unflagged), so the count is the key's running jobs but for runs
-- that began before their key's row did. It can be lower than that number,
-- never higher:
--
-- * a row created (set_limit of a new key) starts at 0, whatever of the key
--   runs: counting them there could count a run whose end commits meanwhile
--   and is not subtracted (its trigger does not see the new row yet);
-- * runs flagged under a row that was deleted and created again are not in the
--   new row's count; when they end, the count does not go below 0.
--
-- Neither set_limit nor clear_limit touches running jobs: they would wait for
-- a transaction that is ending runs of the key while it waits for the key's
-- row, which they hold (a deadlock).
--
-- Why statement triggers with transition tables and not row triggers: the
-- counts of one statement are applied key by key in key order, so two
-- transactions that finish jobs of the same keys lock the limits rows in the
-- same order and cannot deadlock; row triggers would update them in the order
-- of the rows. Claims lock limits rows with SKIP LOCKED only (claim_lock,
-- hand_off_take) or holding nothing (claim_lock_first), so a claim never
-- waits for a finishing transaction while holding a row it waits for. A
-- statement that changes no counted job (an unkeyed claim, a progress update)
-- pays the trigger's call and a look at its own rows, no write.
--
-- TRUNCATE ends every run at once: every count goes to 0.

-- No job or limits row changes between the count below and the triggers'
-- creation (a run ending meanwhile would be counted and never subtracted).
LOCK TABLE akadze.jobs, akadze.limits IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE akadze.limits ADD COLUMN running integer NOT NULL DEFAULT 0;

UPDATE akadze.jobs j
SET limited = true
WHERE j.state = 'running' AND NOT j.limited
  AND j.limit_key IN (SELECT l.key FROM akadze.limits l);

UPDATE akadze.limits l
SET running = (SELECT count(*) FROM akadze.jobs r
               WHERE r.state = 'running' AND r.limited AND r.limit_key = l.key);

-- The count changes of one statement: per key, the counted rows after less the
-- counted rows before (a row counted both before and after adds nothing).
CREATE FUNCTION akadze.count_running() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    keys text[];
    deltas integer[];
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE akadze.limits SET running = 0 WHERE running <> 0;
        RETURN NULL;
    END IF;
    -- Most statements change no counted job: the row triggers below note in
    -- the transaction whether one of its statements did, and the statements
    -- of a transaction that changed none return here. The note is not cleared:
    -- a statement whose DML runs in parts (INSERT ... ON CONFLICT DO UPDATE,
    -- two CTEs) fires one statement trigger per part after all the row triggers.
    IF current_setting('akadze.running_changed', true) IS DISTINCT FROM 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        SELECT array_agg(d.key ORDER BY d.key), array_agg(d.delta ORDER BY d.key)
        INTO keys, deltas
        FROM (SELECT x.key, sum(x.delta)::integer AS delta
              FROM (SELECT o.limit_key AS key, -1 AS delta FROM old_rows o
                    WHERE o.state = 'running' AND o.limited
                    UNION ALL
                    SELECT n.limit_key, 1 FROM new_rows n
                    WHERE n.state = 'running' AND n.limited) x
              GROUP BY x.key
              HAVING sum(x.delta) <> 0) d;
    ELSIF TG_OP = 'INSERT' THEN
        SELECT array_agg(d.key ORDER BY d.key), array_agg(d.delta ORDER BY d.key)
        INTO keys, deltas
        FROM (SELECT n.limit_key AS key, count(*)::integer AS delta FROM new_rows n
              WHERE n.state = 'running' AND n.limited
              GROUP BY n.limit_key) d;
    ELSE
        SELECT array_agg(d.key ORDER BY d.key), array_agg(d.delta ORDER BY d.key)
        INTO keys, deltas
        FROM (SELECT o.limit_key AS key, -count(*)::integer AS delta FROM old_rows o
              WHERE o.state = 'running' AND o.limited
              GROUP BY o.limit_key) d;
    END IF;
    IF keys IS NULL THEN
        RETURN NULL;
    END IF;
    -- The rows are locked in key order (the lock order of every writer: a
    -- LockRows above the sort), then changed in one statement. A loop of one
    -- UPDATE per key cost about 60 us a key.
    PERFORM 1 FROM akadze.limits l WHERE l.key = ANY (keys) ORDER BY l.key
    FOR NO KEY UPDATE;
    -- Not below 0: see the top of this file (a run flagged under an earlier
    -- row of the key ends).
    UPDATE akadze.limits l SET running = GREATEST(l.running + d.delta, 0)
    FROM unnest(keys, deltas) AS d(key, delta)
    WHERE l.key = d.key;
    RETURN NULL;
END
$$;

-- The row triggers only note that the statement changed a counted job; the
-- WHEN is checked by the executor without a call, so a statement that changes
-- none (an unkeyed claim, a progress update) costs the statement trigger's
-- call and this setting's look.
CREATE FUNCTION akadze.note_running_change() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('akadze.running_changed', 'on', true);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_running_change_update
    AFTER UPDATE ON akadze.jobs
    FOR EACH ROW
    WHEN ((OLD.state = 'running' AND OLD.limited)
              IS DISTINCT FROM (NEW.state = 'running' AND NEW.limited)
          OR (OLD.state = 'running' AND OLD.limited
              AND OLD.limit_key IS DISTINCT FROM NEW.limit_key))
    EXECUTE FUNCTION akadze.note_running_change();

CREATE TRIGGER jobs_running_change_insert
    AFTER INSERT ON akadze.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'running' AND NEW.limited)
    EXECUTE FUNCTION akadze.note_running_change();

CREATE TRIGGER jobs_running_change_delete
    AFTER DELETE ON akadze.jobs
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND OLD.limited)
    EXECUTE FUNCTION akadze.note_running_change();

CREATE TRIGGER jobs_count_running_update
    AFTER UPDATE ON akadze.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION akadze.count_running();

CREATE TRIGGER jobs_count_running_insert
    AFTER INSERT ON akadze.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION akadze.count_running();

CREATE TRIGGER jobs_count_running_delete
    AFTER DELETE ON akadze.jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION akadze.count_running();

CREATE TRIGGER jobs_count_running_truncate
    AFTER TRUNCATE ON akadze.jobs
    FOR EACH STATEMENT EXECUTE FUNCTION akadze.count_running();

-- Migration 0005's function, and a renamed row counts from 0.
CREATE OR REPLACE FUNCTION akadze.unflag_limited() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE akadze.jobs j
    SET limited = false
    WHERE j.state = 'queued' AND j.limit_key = OLD.key AND j.limited;
    IF TG_OP = 'UPDATE' THEN
        -- A renamed row counted the old key's runs; the new key's runs were
        -- not flagged under it.
        UPDATE akadze.limits SET running = 0 WHERE key = NEW.key;
    END IF;
    RETURN NULL;
END
$$;

-- The rows at their max_running by that count, and the rows with a start
-- rate (two partial indexes), for the judgement below.

-- Migration 0016's window, judging a remembered key by the count its limits
-- row keeps (limits.running) instead of counting the key's running jobs: a key
-- shown at its limit there is at its limit in this snapshot. Still a probe of
-- limits_pkey per remembered key (the plan of 0016); reading instead the rows
-- at their limit from a partial index on running >= max_running, each looked
-- up in the hashed keys, was 7 % faster on "1 000 keys at their limit" but
-- makes every change of the count a non-HOT update of the row. A start-rate
-- key is still judged by its start marks. The rest is unchanged.
CREATE OR REPLACE FUNCTION akadze.ready_window_judged(
    queue_name text, after_priority integer, after_run_at timestamptz, after_id bigint,
    clock timestamptz, skip_free jsonb, skip_limited jsonb, remembered jsonb,
    remembered_free jsonb, skip_null boolean, size integer, split_max integer)
RETURNS TABLE (id bigint, priority smallint, run_at timestamptz, limit_key text, limited boolean)
LANGUAGE sql STABLE
AS $$
    WITH judged AS MATERIALIZED (
        SELECT l.key
        FROM akadze.limits l
        WHERE l.key IN (SELECT jsonb_array_elements_text(remembered))
          AND (COALESCE(l.running >= l.max_running, false)
               OR COALESCE((SELECT count(*) FROM akadze.start_marks m
                            WHERE m.key = l.key AND m.started_at > clock - l."window")
                           >= l.max_starts, false))
    ), skip_l AS MATERIALIZED (
        SELECT jsonb_array_elements_text(skip_limited) AS key
        UNION ALL
        SELECT j.key FROM judged j
    ), skip_f AS MATERIALIZED (
        SELECT jsonb_array_elements_text(skip_free) AS key
        UNION ALL
        SELECT j.key FROM judged j WHERE remembered_free ? j.key
    ), open_keys AS MATERIALIZED (
        SELECT l.key FROM akadze.limits l
        WHERE EXISTS (SELECT 1 FROM skip_l)
          AND l.key NOT IN (SELECT s.key FROM skip_l s)
        LIMIT GREATEST(split_max + 1, 0)
    ), route AS MATERIALIZED (
        SELECT EXISTS (SELECT 1 FROM skip_l)
               AND (SELECT count(*) FROM open_keys) <= split_max AS split
    )
    (SELECT u.* FROM (
        (SELECT c.id, c.priority, c.run_at, c.limit_key, false
         FROM akadze.jobs c
         WHERE c.queue = queue_name
           AND c.state = 'queued' AND NOT c.limited
           AND c.priority = after_priority
           AND (c.run_at, c.id) > (after_run_at, after_id)
           AND c.run_at <= clock
           AND (c.limit_key IS NOT NULL OR NOT skip_null)
           AND (c.limit_key IS NULL OR c.limit_key NOT IN (SELECT s.key FROM skip_f s))
         ORDER BY c.priority DESC, c.run_at, c.id
         LIMIT size)
        UNION ALL
        (SELECT c.id, c.priority, c.run_at, c.limit_key, false
         FROM akadze.jobs c
         WHERE c.queue = queue_name
           AND c.state = 'queued' AND NOT c.limited
           AND c.priority < after_priority
           AND c.run_at <= clock
           AND (c.limit_key IS NOT NULL OR NOT skip_null)
           AND (c.limit_key IS NULL OR c.limit_key NOT IN (SELECT s.key FROM skip_f s))
         ORDER BY c.priority DESC, c.run_at, c.id
         LIMIT size)
        UNION ALL
        SELECT o.* FROM (
            (SELECT c.id, c.priority, c.run_at, c.limit_key, true
             FROM akadze.jobs c
             WHERE c.queue = queue_name
               AND c.state = 'queued' AND c.limited
               AND c.priority = after_priority
               AND (c.run_at, c.id) > (after_run_at, after_id)
               AND c.run_at <= clock
               AND c.limit_key NOT IN (SELECT s.key FROM skip_l s)
             ORDER BY c.priority DESC, c.run_at, c.id
             LIMIT size)
            UNION ALL
            (SELECT c.id, c.priority, c.run_at, c.limit_key, true
             FROM akadze.jobs c
             WHERE c.queue = queue_name
               AND c.state = 'queued' AND c.limited
               AND c.priority < after_priority
               AND c.run_at <= clock
               AND c.limit_key NOT IN (SELECT s.key FROM skip_l s)
             ORDER BY c.priority DESC, c.run_at, c.id
             LIMIT size)
        ) o
        WHERE NOT (SELECT split FROM route)
        UNION ALL
        SELECT k.*
        FROM open_keys l
        CROSS JOIN LATERAL (
            (SELECT c.id, c.priority, c.run_at, c.limit_key, true
             FROM akadze.jobs c
             WHERE c.queue = queue_name AND c.state = 'queued' AND c.limit_key = l.key
               AND c.limited
               AND c.priority = after_priority
               AND (c.run_at, c.id) > (after_run_at, after_id)
               AND c.run_at <= clock
             ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
             LIMIT size)
            UNION ALL
            (SELECT c.id, c.priority, c.run_at, c.limit_key, true
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
    ) u
    ORDER BY u.priority DESC, u.run_at, u.id
    LIMIT size)
    UNION ALL
    -- The keys left out as still without room (id NULL), after the entries.
    SELECT NULL, NULL, NULL, j.key, true FROM judged j
$$;
