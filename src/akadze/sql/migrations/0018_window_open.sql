-- akadze schema, version 18: a window that reads the limited part of the queue
-- only for the keys with room, found from an index of the limits rows.
--
-- A queue headed by many keys at their limit cost every claim work per blocked
-- key: the claim remembered them (akadze.claim._hints), sent them, and its
-- first window judged each one by a probe of limits_pkey (migrations 0016 and
-- 0017), then hashed them to filter the queue; about 2.5 ms of a 5 ms claim of
-- "1 000 keys at their limit, then free ones" on the server. Yet the keys with
-- room are often few, and limits.running (migration 0017) tells them apart:
-- a key it shows at its max_running is at its limit in every snapshot.
--
-- Two partial indexes of the limits rows tell them apart by that count: the
-- rows full by it (limits_full_idx: COALESCE(running >= max_running, false);
-- a row without max_running is never full by it, though its start rate may
-- be spent) and the others (limits_room_idx). Partial, not one index on the
-- expression and the key: a probe of a key (claim_key_state) could pick that
-- one on stale statistics and read all of it. Their price: every change of a
-- count is a non-HOT update of the row (a column of their predicate changes).
--
-- ready_window_open is ready_window_judged (migrations 0016 and 0017) with one
-- route more, the open route, taken by a claim's first window when some limits
-- row is full and at most split_max are not: the limited part of the queue is
-- then read per key for the keys with room only (the rows not full), and the
-- window names them in a last row (`opened`, id NULL). Only the first read of
-- a claim may take it (try_open): a key at its limit in this snapshot may have
-- had room in an earlier window's, whose rows the claim read. The claim treats every
-- other key with a limits row as without room for the rest of the claim, met
-- where it may be (akadze.claim._keystate, KeyState.opened), and its later
-- windows pass the same keys back (known_open): they read the same split,
-- less the keys the claim left out since, and no limits row. So the cost is
-- a read of at most split_max + 2 index entries, whatever the number of keys
-- at their limit; the rows of a key that is at its limit in the window's
-- snapshot are the only rows left unread, and none of them could be claimed.
-- Without a full row, or with more than split_max rows with room, the window
-- is ready_window_judged's, unchanged.
CREATE INDEX limits_full_idx ON akadze.limits (key)
    WHERE COALESCE(running >= max_running, false);
CREATE INDEX limits_room_idx ON akadze.limits (key)
    WHERE NOT COALESCE(running >= max_running, false);

CREATE FUNCTION akadze.ready_window_open(
    queue_name text, after_priority integer, after_run_at timestamptz, after_id bigint,
    clock timestamptz, skip_free jsonb, skip_limited jsonb, remembered jsonb,
    remembered_free jsonb, skip_null boolean, size integer, split_max integer,
    try_open boolean, known_open jsonb)
RETURNS TABLE (id bigint, priority smallint, run_at timestamptz, limit_key text,
               limited boolean, opened text[])
LANGUAGE sql STABLE
AS $$
    -- The open route: is some row full (one index probe)? Only where the claim
    -- asks (try_open: its first read, before it learnt the state of any key in
    -- another snapshot); its later windows pass the keys back (known_open).
    WITH some_full AS MATERIALIZED (
        SELECT try_open AND known_open IS NULL AND split_max >= 0 AND EXISTS (
            SELECT 1 FROM akadze.limits l
            WHERE COALESCE(l.running >= l.max_running, false)) AS yes
    ), with_room AS MATERIALIZED (
        SELECT l.key FROM akadze.limits l
        WHERE (SELECT yes FROM some_full)
          AND NOT COALESCE(l.running >= l.max_running, false)
        LIMIT GREATEST(split_max + 1, 0)
    ), open_route AS MATERIALIZED (
        SELECT known_open IS NOT NULL
               OR ((SELECT yes FROM some_full)
                   AND (SELECT count(*) FROM with_room) <= split_max) AS yes
    ), open_set AS MATERIALIZED (
        SELECT jsonb_array_elements_text(known_open) AS key
        UNION ALL
        SELECT w.key FROM with_room w WHERE (SELECT yes FROM open_route)
    -- Otherwise migration 0017's judgement of the remembered keys; on the open
    -- route, of those the claim met in the free part only (remembered_free:
    -- jobs queued before their key had its limit, which the open route does not
    -- leave out), so that they are left out of it as before.
    ), judged AS MATERIALIZED (
        SELECT l.key
        FROM akadze.limits l
        WHERE l.key IN (SELECT jsonb_array_elements_text(
                            CASE WHEN (SELECT yes FROM open_route) THEN remembered_free
                                 ELSE remembered END))
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
    ), other_keys AS MATERIALIZED (
        SELECT l.key FROM akadze.limits l
        WHERE NOT (SELECT yes FROM open_route)
          AND EXISTS (SELECT 1 FROM skip_l)
          AND l.key NOT IN (SELECT s.key FROM skip_l s)
        LIMIT GREATEST(split_max + 1, 0)
    ), route AS MATERIALIZED (
        SELECT (SELECT yes FROM open_route)
               OR (EXISTS (SELECT 1 FROM skip_l)
                   AND (SELECT count(*) FROM other_keys) <= split_max) AS split
    -- The keys whose limited part is read per key: the open set less the keys
    -- left out, or (judged route) every limits row not left out.
    ), split_keys AS MATERIALIZED (
        SELECT o.key FROM open_set o
        WHERE o.key NOT IN (SELECT s.key FROM skip_l s)
        UNION ALL
        SELECT o.key FROM other_keys o
    )
    (SELECT u.*, NULL::text[] FROM (
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
        FROM split_keys l
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
    SELECT NULL, NULL, NULL, j.key, true, NULL FROM judged j
    UNION ALL
    -- The open route, taken by this window: the keys it read the limited part
    -- for (id and limit_key NULL; opened, possibly empty).
    SELECT NULL, NULL, NULL, NULL, NULL, array(SELECT o.key FROM open_set o ORDER BY o.key)
    WHERE known_open IS NULL AND (SELECT yes FROM open_route)
$$;
