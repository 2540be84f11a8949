-- akadze schema, version 19: the open route's read of each key with room
-- reaches the key's entries whatever the statistics say.
--
-- ready_window_open (migration 0018) reads the limited part of the queue per
-- key (the split, of the open route and of the judged window) with "limit_key
-- = k AND limited". Both jobs_ready_key_idx (queue, limit_key, priority DESC,
-- run_at, id), whose order is the one asked for, and jobs_ready_limited_idx
-- (queue, priority DESC, run_at, id) WHERE limited, which gives the same order
-- once the key is fixed, can answer it. On a table whose statistics were taken
-- while it was empty the plan chose the second, filtering by key: each key with
-- room cost a scan of the whole limited part (at 100 000 ready jobs, 20 keys
-- with room behind 1 000 at their limit: 400 000 entries, 60 ms of a 3 ms
-- claim; tests/test_claim_plans.py). The flag is now tested as
-- COALESCE(limited, false), which implies no partial index's predicate, so
-- jobs_ready_key_idx is the only index that can serve the read (its rows
-- are a key's own entries, their flag read from the row as before). The rest
-- is migration 0018's function, unchanged.
CREATE OR REPLACE FUNCTION akadze.ready_window_open(
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
               -- not "c.limited": see the top of this file
               AND COALESCE(c.limited, false)
               AND c.priority = after_priority
               AND (c.run_at, c.id) > (after_run_at, after_id)
               AND c.run_at <= clock
             ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
             LIMIT size)
            UNION ALL
            (SELECT c.id, c.priority, c.run_at, c.limit_key, true
             FROM akadze.jobs c
             WHERE c.queue = queue_name AND c.state = 'queued' AND c.limit_key = l.key
               AND COALESCE(c.limited, false)
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
