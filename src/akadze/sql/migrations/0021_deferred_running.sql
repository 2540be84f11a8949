-- akadze schema, version 21: a write that ends runs of a key and starts the
-- key's next ones changes the key's running count once, by the net change.
--
-- A hand-off (akadze.worker._handoffs) is one transaction: the outcomes of the
-- runs that ended (finish_succeeded, finish_jobs), then the start of the next
-- jobs of the same keys (hand_off_take). The count trigger of migration 0017
-- ran after each statement: the finish locked each key's limits row and took
-- 1 from its count, the take added it back. On a queue whose keys all run at
-- their limit almost every key of a write is handed off, so both updates of its
-- row cancel out; they were a third of the server's time for the write (about
-- 10 us a key each, and every update is a new row version).
--
-- Now a transaction that sets akadze.running_deferred to 'on' (the hand-off's
-- write does, first: defer_running) has the triggers keep each key's change in
-- akadze.running_pending, a jsonb object local to the transaction, and its last
-- statement (apply_running, the function below) applies the sum per key, where
-- it is not 0. The write's pipeline holds both statements; an error anywhere
-- rolls the whole transaction back, so no count is ever left half-applied.
--
-- Lock order is unchanged: every key whose count a statement changes is locked
-- by that statement, in key order, as before (the finish's keys by the finish,
-- waiting; the take's keys are the finish's, or were locked by hand_off_lock
-- without waiting), and a key already in the pending object was locked by an
-- earlier statement of the transaction and is not locked again. apply_running
-- locks only keys this transaction holds.
--
-- The count is still never higher than the key's running jobs: it changes at
-- commit, as before, and only by what the transaction's statements changed. A
-- row whose count was already 0 while a run flagged under an earlier row of the
-- key ended (migration 0017) now stays 0 when that run's slot is handed off in
-- the same write, instead of going to 0 and back to 1: lower, as allowed.
CREATE OR REPLACE FUNCTION akadze.count_running() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    keys text[];
    deltas integer[];
    pending jsonb;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE akadze.limits SET running = 0 WHERE running <> 0;
        RETURN NULL;
    END IF;
    -- Most statements change no counted job: the row triggers note in the
    -- transaction whether one of its statements did (migration 0017).
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
    IF current_setting('akadze.running_deferred', true) = 'on' THEN
        pending := COALESCE(NULLIF(current_setting('akadze.running_pending', true), ''),
                            '{}')::jsonb;
        -- The keys no earlier statement of the transaction changed are locked as
        -- below (in key order); the others are held already.
        PERFORM 1 FROM akadze.limits l
        WHERE l.key = ANY (keys) AND NOT pending ? l.key
        ORDER BY l.key
        FOR NO KEY UPDATE;
        PERFORM set_config('akadze.running_pending', (
            SELECT jsonb_object_agg(COALESCE(d.key, p.key),
                                    COALESCE(p.value::integer, 0) + COALESCE(d.delta, 0))
            FROM jsonb_each_text(pending) p
            FULL JOIN unnest(keys, deltas) AS d(key, delta) ON d.key = p.key)::text, true);
        RETURN NULL;
    END IF;
    -- The rows are locked in key order (the lock order of every writer: a
    -- LockRows above the sort), then changed in one statement.
    PERFORM 1 FROM akadze.limits l WHERE l.key = ANY (keys) ORDER BY l.key
    FOR NO KEY UPDATE;
    -- Not below 0 (migration 0017: a run flagged under an earlier row of the
    -- key ends).
    UPDATE akadze.limits l SET running = GREATEST(l.running + d.delta, 0)
    FROM unnest(keys, deltas) AS d(key, delta)
    WHERE l.key = d.key;
    RETURN NULL;
END
$$;

-- The changes the triggers kept since defer_running, applied: each key whose sum
-- is not 0, in key order (rows this transaction locked already), in one
-- statement. Deferral ends here: a later statement of the transaction counts at
-- once again.
CREATE FUNCTION akadze.apply_running() RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    pending jsonb;
    changed integer;
BEGIN
    pending := COALESCE(NULLIF(current_setting('akadze.running_pending', true), ''),
                        '{}')::jsonb;
    PERFORM set_config('akadze.running_deferred', 'off', true);
    PERFORM set_config('akadze.running_pending', '', true);
    PERFORM 1 FROM akadze.limits l
    WHERE l.key IN (SELECT p.key FROM jsonb_each_text(pending) p WHERE p.value::integer <> 0)
    ORDER BY l.key
    FOR NO KEY UPDATE;
    UPDATE akadze.limits l SET running = GREATEST(l.running + p.value::integer, 0)
    FROM jsonb_each_text(pending) p
    WHERE l.key = p.key AND p.value::integer <> 0;
    GET DIAGNOSTICS changed = ROW_COUNT;
    RETURN changed;
END
$$;
