-- akadze schema, version 14: a claim window with an exclusion list per part of
-- the queue, and one read of the limits table.
--
-- akadze.ready_window (migration 0005) reads the next entries of a queue as
-- the merge of its free part (jobs_ready_free_idx) and its limited part
-- (jobs_ready_limited_idx, or per limited key), leaving out the keys of one
-- jsonb list. That list is mostly keys at their limit, whose jobs are all in
-- the limited part, yet every part filtered by it: a claim that left out 1 000
-- keys built the list's hash three times (the free part, the choice of route,
-- the per-key read) and read the limits table twice, at every window (about
-- 0.3 ms of every claim of "1 000 keys at their limit", whatever the queue's
-- length). This version:
--
-- * takes the exclusions apart: skip_free for the free part, skip_limited for
--   the limited part. Leaving a key out is only ever an economy: a window must
--   return every entry of the keys it does not leave out, and may return
--   entries of keys it does (the planner finds them ineligible or hopeless), so
--   each list may be any part of the claim's exclusions. The claim leaves out
--   of the free part only what it found there (a key without a limits row, or a
--   limited key one of whose jobs it met unflagged), and of the limited part its
--   limited keys;
-- * reads the limits rows that are not left out once (open_keys, at most
--   split_max + 1 of them): the route counts them, and the per-key read probes
--   them;
-- * returns each entry's part (limited), which tells the claim where it met a
--   key's jobs: a constant per arm (the flag is the partial indexes' predicate,
--   not one of their columns: read from the row, the scans would not stay
--   index-only).
--
-- Everything else is ready_window's, which stays (for a worker of the previous
-- version during an upgrade) and which its comments explain: the two contiguous
-- ranges after P, the route, and why the function is a single inlined SELECT
-- (tests/test_limited_flag.py checks that it is inlined).
CREATE FUNCTION akadze.ready_window_parts(
    queue_name text, after_priority integer, after_run_at timestamptz, after_id bigint,
    clock timestamptz, skip_free jsonb, skip_limited jsonb, skip_null boolean, size integer, split_max integer)
RETURNS TABLE (id bigint, priority smallint, run_at timestamptz, limit_key text, limited boolean)
LANGUAGE sql STABLE
AS $$
    WITH open_keys AS MATERIALIZED (
        SELECT l.key FROM akadze.limits l
        WHERE jsonb_array_length(skip_limited) > 0
          AND l.key NOT IN (SELECT jsonb_array_elements_text(skip_limited))
        LIMIT GREATEST(split_max + 1, 0)
    ), route AS MATERIALIZED (
        SELECT jsonb_array_length(skip_limited) > 0
               AND (SELECT count(*) FROM open_keys) <= split_max AS split
    )
    SELECT u.* FROM (
        (SELECT c.id, c.priority, c.run_at, c.limit_key, false
         FROM akadze.jobs c
         WHERE c.queue = queue_name
           AND c.state = 'queued' AND NOT c.limited
           AND c.priority = after_priority
           AND (c.run_at, c.id) > (after_run_at, after_id)
           AND c.run_at <= clock
           AND (c.limit_key IS NOT NULL OR NOT skip_null)
           AND (c.limit_key IS NULL OR c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_free)))
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
           AND (c.limit_key IS NULL OR c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_free)))
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
               AND c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_limited))
             ORDER BY c.priority DESC, c.run_at, c.id
             LIMIT size)
            UNION ALL
            (SELECT c.id, c.priority, c.run_at, c.limit_key, true
             FROM akadze.jobs c
             WHERE c.queue = queue_name
               AND c.state = 'queued' AND c.limited
               AND c.priority < after_priority
               AND c.run_at <= clock
               AND c.limit_key NOT IN (SELECT jsonb_array_elements_text(skip_limited))
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
             -- limit_key first: the order of jobs_ready_key_idx (claim_group_rows)
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
    LIMIT size
$$;
