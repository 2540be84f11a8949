-- akadze schema, version 16: a claim window that leaves out the remembered
-- blocked keys still without room, judged in the window's own snapshot.
--
-- A connection remembers the keys its last claim of a queue left without room
-- (akadze.claim._hints). The next claim used to count them in one statement
-- (claim_remembered) and read, in the same round trip, a first window that left
-- them all out: that window stood only if every one of them was still full, and
-- was read again from the head otherwise. On a queue whose keys all run at
-- their limit a few of them always have room again at the next claim, so the
-- first window was thrown away at nearly every claim (two or three windows
-- where one would do). Here the window judges them itself:
--
-- * `remembered`: keys to leave out of the limited part of the queue if they
--   are still without room in this statement's snapshot (planner.headroom = 0:
--   running >= max_running, or starts in the window >= max_starts); a key
--   without a limits row, or with room, is read like any other;
-- * `remembered_free`: those of them to leave out of the free part too when
--   they are (the last claim met their jobs there: queued before the key had
--   its limit);
-- * the keys it left out come back as rows of their own, after the entries:
--   id NULL, limit_key the key. The caller learns them from the same snapshot
--   as the entries, so what it believes left out is exactly what was: a key
--   judged in another statement could have lost its room in between, and the
--   window would then have skipped rows the planner thinks it read.
--
-- Everything else is ready_window_parts' (migration 0014), whose comments
-- explain it; the judged keys join its two lists. The judgement counts each
-- remembered key once (a MATERIALIZED CTE: a hashed semi-join over the limits
-- rows, as claim_limit_counts does, then a probe of the running jobs and the
-- start marks per key), and the lists are hashed once each (NOT IN over a CTE,
-- uncorrelated: a hashed subplan). The function stays a single SELECT that
-- PostgreSQL inlines (tests/test_limited_flag.py): its arguments are the
-- statement's parameters, never sub-selects, which would stop the inlining.
CREATE FUNCTION akadze.ready_window_judged(
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
          AND (COALESCE((SELECT count(*) FROM akadze.jobs r
                         WHERE r.state = 'running' AND r.limit_key = l.key)
                        >= l.max_running, false)
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
