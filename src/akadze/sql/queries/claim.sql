-- Statements of the claim that both the windowed claim and the oracle use.
-- Parameters: see claim_oracle.sql.
--
-- Array parameters are sent in binary (%(name)b): psycopg quotes every element
-- of a text-format array through a regular expression, about 1 ms per 1 000
-- keys here, and a claim that leaves out many blocked keys sends them twice.

-- name: claim_begin
-- The claim's clock (the injected one, or the transaction's: the oracle takes no
-- turn, so it has no claim_now, see claim_start) and whether the queue is paused;
-- a paused queue is not touched at all.
SELECT COALESCE(%(now)s::timestamptz, now()) AS now,
       EXISTS (SELECT 1 FROM akadze.queue_pauses WHERE queue = %(queue)s) AS paused

-- name: claim_cancel_due
-- Due queued jobs that are cancel-requested or expired become 'cancelled'
-- instead of being claimed. The OR of the two arms is answered by the two
-- partial indexes of migration 0002 (a BitmapOr), not by a scan of the queue.
-- Bounded per claim so that a mass expiry cannot make one claim slow; the rest
-- goes with the next claims. SKIP LOCKED: a row someone else holds is theirs.
WITH doomed AS (
    SELECT j.id
    FROM akadze.jobs j
    WHERE j.queue = %(queue)s
      AND j.state = 'queued'
      AND j.run_at <= %(now)s
      AND (j.cancel_requested OR j.expires_at <= %(now)s)
      AND (%(tasks)b::text[] IS NULL OR j.task = ANY (%(tasks)b::text[]))
    ORDER BY j.id
    LIMIT 500
    FOR UPDATE SKIP LOCKED
)
UPDATE akadze.jobs j
SET state = 'cancelled', finished_at = %(now)s
FROM doomed
WHERE j.id = doomed.id
RETURNING
-- include: job_columns

-- name: claim_take
-- Take the planned rows (ids), both claims' take (the windowed claim swept in
-- its first round trip: claim_sweep), and mark and prune the start marks of
-- the keys started.
--
-- FOR UPDATE SKIP LOCKED re-checks every ready condition on the newest version
-- of each row (READ COMMITTED re-evaluation), so a row that another claim took,
-- or that was cancelled meanwhile, is simply missing from the result, and the
-- caller plans again. The start mark of a rate-limited key is written in the
-- same statement, so a re-plan counts it; the marks of those keys that have
-- left their window are dropped here too (the claim holds the keys' limits
-- rows, so nobody is counting them meanwhile). Pruning only the keys a claim
-- starts keeps the effects of a claim independent of how much of the queue it
-- happened to read, and bounds each key's marks by its own rate.
--
-- The ids are the only condition the planner may use to find rows: the others
-- are one "(...) IS TRUE" test, which no index answers and which implies no
-- partial index's predicate. Written as plain conditions, a table whose
-- statistics were taken while it was empty estimated one queued row in the
-- queue, and the plan walked jobs_ready_key_idx over the whole queue filtering
-- by id (230 ms at 100 000 rows) instead of probing the primary key 20 times.
--
-- The guard (need: a jsonb object, limited key -> planned rows of the key; {}
-- for none) lets a claim send its locks and its take in one round trip, with
-- its COMMIT (akadze.claim._windows, "take_committing"): claim_lock, sent just
-- before as a statement of its own, records the keys it got in the setting
-- akadze.claim_locked (local to the transaction), and the take goes ahead only
-- if every key in `need` is among them and still has room for its planned rows,
-- counted here. This statement began after claim_lock had been granted every
-- lock it got, so under READ COMMITTED its snapshot sees every commit of the
-- claim that held a key before: the same rule as claim_counts after claim_lock
-- (docs/explanation/claim.md, "Locks"). A key claim_lock did not get is refused,
-- never locked here: locked inside this statement, its count would use a
-- snapshot taken before the lock. Refused, the take takes nothing and the
-- caller plans again. One row, whatever `need` holds; a one-time filter of
-- `picked`, so it changes no index path.
WITH guard AS MATERIALIZED (
    SELECT COALESCE(bool_and(
               l.key IS NOT NULL
               AND COALESCE(NULLIF(current_setting('akadze.claim_locked', true), ''),
                            '{}')::jsonb ? n.key
               AND COALESCE(l.max_running - (
                       SELECT count(*) FROM akadze.jobs r
                       WHERE r.state = 'running' AND r.limit_key = l.key), n.rows)
                   >= n.rows
               AND COALESCE(l.max_starts - (
                       SELECT count(*) FROM akadze.start_marks m
                       WHERE m.key = l.key
                         AND m.started_at > COALESCE(%(now)s::timestamptz,
                                                     nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                                     now())
                                            - l."window"), n.rows)
                   >= n.rows), true) AS ok
    FROM jsonb_each_text(%(need)b::jsonb) AS e(key, value)
    CROSS JOIN LATERAL (SELECT e.key, e.value::int AS rows) n
    LEFT JOIN LATERAL (
        SELECT x.key, x.max_running, x.max_starts, x."window" FROM akadze.limits x
        WHERE x.key = n.key
        OFFSET 0) l ON true
),
picked AS (
    SELECT j.id
    FROM akadze.jobs j
    WHERE j.id = ANY (%(ids)b::bigint[])
      AND (SELECT ok FROM guard)
      AND (j.queue = %(queue)s
           AND j.state = 'queued'
           AND j.run_at <= COALESCE(%(now)s::timestamptz,
                                    nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                    now())
           AND NOT j.cancel_requested
           AND (j.expires_at IS NULL
                OR j.expires_at > COALESCE(%(now)s::timestamptz,
                                           nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                           now()))) IS TRUE
    FOR UPDATE SKIP LOCKED
),
taken AS (
    UPDATE akadze.jobs j
-- include: run_start
    FROM picked
    WHERE j.id = picked.id
    RETURNING
-- include: job_columns
),
marked AS (
    INSERT INTO akadze.start_marks (key, started_at, job_id)
    SELECT t.limit_key, COALESCE(%(now)s::timestamptz,
                                 nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                 now()), t.id
    FROM taken t
    JOIN akadze.limits l ON l.key = t.limit_key
    WHERE l.max_starts IS NOT NULL
),
pruned AS (
    -- Same snapshot as the INSERT above: the new marks are not seen. A claim's
    -- clock is its transaction's start, so claims do not reach a key's lock in
    -- clock order: one that began earlier may count after us, over a window
    -- that ends earlier than ours. Marks are therefore kept for a margin past
    -- our window (5 minutes, far longer than any claim transaction lives), so
    -- that such a claim still sees every mark it must count.
    DELETE FROM akadze.start_marks m
    USING akadze.limits l
    WHERE m.key IN (SELECT t.limit_key FROM taken t)
      AND l.key = m.key
      AND m.started_at <= COALESCE(%(now)s::timestamptz,
                                   nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                   now()) - l."window"
                          - interval '5 minutes'
)
SELECT * FROM taken

-- ---------------------------------------------------------------------------
-- The windowed claim (akadze.claim._windows, planned by akadze.claim._planner).
--
-- Windows continue after a position P = (after_priority, after_run_at,
-- after_id) in queue order (priority DESC, run_at, id). "After P" is written as
-- two range scans glued by UNION ALL: the rest of P's priority level,
-- (run_at, id) > (r, i), then every lower priority. Each is one contiguous range
-- of the index, so a window never re-reads what earlier windows read (a single
-- OR condition would make the scan start at the top of P's priority again).
-- The first window passes after_priority = 32768 (above every smallint): the
-- first arm is empty and the second reads the queue from its head.
-- ---------------------------------------------------------------------------

-- name: claim_window
-- The next `window` index entries of the queue after P, leaving out the
-- excluded keys (skip_free in the free part of the queue, skip_limited in its
-- limited part, and the null group when skip_null), cut short after the
-- need-th free entry when `need` is given (see "free" below).
--
-- The candidates come from index-only scans (claim_window_candidates): an
-- excluded key costs one index tuple per entry, or nothing at all when the
-- window is read split. On the open route (migration 0018: the claim's first
-- read, when some key is at its limit and few are not; the later windows pass
-- the same keys in known_open) the limited part is read for the keys with
-- room only, and no key at its limit costs anything.
--
-- The exclusion is "NOT IN (SELECT jsonb_array_elements_text($keys))":
-- PostgreSQL evaluates it as a hashed subplan, one hash probe per index tuple,
-- with negligible planning and the same plan when psycopg prepares the
-- statement. The alternatives measured worse: "<> ALL($array)" in a generic
-- plan scans the array for every row (20x slower); a literal array is hashed
-- but costs ~5 ms to plan for 1 000 keys; an anti-join against unnest() was
-- planned as a nested loop. skip_keys is a jsonb array of strings, not a
-- text[]: psycopg dumps a list of a thousand keys as text[] element by element
-- in Python (~0.4 ms), and as jsonb with one json.dumps call (~0.03 ms).
-- The skip lists never hold a null (a null in NOT IN would reject every row).
--
-- The conditions that need the heap (cancel requested, expiry, task) are
-- evaluated afterwards on the entries returned, by a per-row subquery on the
-- primary key (a join let the planner hash the whole table), and reported as
-- `ready` instead of filtering, so the caller knows where the window ended even
-- when its last entries are not ready for this claim.
WITH window_rows AS MATERIALIZED (
-- include: claim_window_candidates
)
-- include: claim_window_split
-- include: claim_window_early_stop
-- include: claim_entries_with_state
-- include: claim_opened_row

-- name: claim_window_whole
-- claim_window without the early stop, for the windows read with `need` null
-- (fair order's first windows): the same entries, without ranking them by key
-- or counting those sure to help. In claim_window those two sorts and three
-- window functions run even when `need` is null, about 3 us per entry (0.35 ms
-- of a 0.94 ms window of 116 entries, EXPLAIN ANALYZE). `scanned` as there.
WITH window_rows AS MATERIALIZED (
-- include: claim_window_candidates
)
-- include: claim_window_split
-- include: claim_window_kept_whole
-- include: claim_entries_with_state
-- include: claim_opened_row

-- name: claim_window_presumed
-- claim_window_whole for the first window of a fair claim that presumes groups
-- hopeless (claim_presume_busy, sent just before it in the same round trip):
-- the groups that statement judged still busy enough are left out of the free
-- part, read from the transaction's akadze.claim_presumed. A setting, not a
-- subquery in ready_window_open's arguments: PostgreSQL does not inline a
-- function called with a sub-select, and the window would be planned anew at
-- every call.
WITH window_rows AS MATERIALIZED (
    SELECT * FROM akadze.ready_window_open(
        %(queue)s, %(after_priority)s::int, %(after_run_at)s::timestamptz,
        %(after_id)s::bigint, COALESCE(%(now)s::timestamptz,
                                       nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                       now()),
        COALESCE(nullif(current_setting('akadze.claim_presumed', true), '')::jsonb, '[]'),
        %(skip_limited)b::jsonb, '[]', '[]', %(skip_null)s::boolean,
        %(window)s::int, %(split_max)s::int, %(try_open)s::boolean, %(known_open)b::jsonb)
)
-- include: claim_window_split
-- include: claim_window_kept_whole
-- include: claim_entries_with_state
-- include: claim_opened_row

-- name: claim_presume_busy
-- Which of the groups a fair claim presumes hopeless (Hints.busy: those the
-- connection's last claim of the queue found with at least as many jobs
-- running in the queue as the turn of its worst planned row) still have at
-- least `turn` jobs running in the queue: a probe of jobs_running_key_idx each,
-- stopping at `turn` entries. Sent in the claim's first round trip before its
-- first window (claim_window_presumed), which leaves the groups judged so out
-- of the free part through akadze.claim_presumed, a setting local to the
-- transaction. They come back as an array, with the highest priority of the
-- queue's queued jobs (due or not; the first entry of each ready index). The
-- claim keeps the window only if its worst planned row has a turn of at most
-- `turn` and that priority, or a higher one: then a row of those groups ranks
-- after it (a lower priority, or a turn of busy + 1 > turn), and otherwise it
-- reads again from the head without them (planner.presumption_holds).
WITH judged AS MATERIALIZED (
    SELECT g.key
    FROM jsonb_array_elements_text(%(groups)b) AS g(key)
    WHERE (SELECT count(*) FROM (
               SELECT FROM akadze.jobs r
               WHERE r.state = 'running' AND r.limit_key = g.key AND r.queue = %(queue)s
               LIMIT %(turn)s) b) >= %(turn)s
)
SELECT set_config('akadze.claim_presumed', COALESCE(jsonb_agg(j.key), '[]')::text, true),
       COALESCE(array_agg(j.key), '{}'),
       GREATEST((SELECT f.priority FROM akadze.jobs f
                 WHERE f.queue = %(queue)s AND f.state = 'queued' AND NOT f.limited
                 ORDER BY f.queue, f.priority DESC LIMIT 1),
                (SELECT l.priority FROM akadze.jobs l
                 WHERE l.queue = %(queue)s AND l.state = 'queued' AND l.limited
                 ORDER BY l.queue, l.priority DESC LIMIT 1))
FROM judged j

-- name: claim_window_judged
-- claim_window for the first window of a claim that remembers many blocked keys
-- (akadze.claim._hints): the remembered keys (`remembered`, a jsonb array) are
-- left out of the limited part of the queue, and those of `remembered_free` of
-- the free part too, if they are still without room, judged in this
-- statement's snapshot (akadze.ready_window_open, migrations 0016 and 0018,
-- inlined here). On the open route only those of `remembered_free` are judged:
-- the route reads no key at its limit in the limited part. The keys it left
-- out come back in one row
-- (left_out), in the same snapshot as the entries and the state of the keys
-- met: the claim leaves out exactly those, and reads the others (a remembered
-- key that has room again, or no limits row any more) like any key. Judged in
-- a statement of its own (claim_remembered) before the window, a key could
-- lose its room in between, and the window would skip rows the claim believes
-- it read; and a window that assumed them all still full had to be read again
-- from the head whenever one of them had room, at nearly every claim of a
-- queue whose keys all run at their limit.
--
-- MATERIALIZED: the function's rows are the entries and, after them, the
-- left-out keys and the open route's row (id NULL), split here; the entries
-- are at most `window`.
WITH window_rows AS MATERIALIZED (
-- include: claim_window_judged_candidates
)
-- include: claim_window_split
, left_out AS (
    SELECT COALESCE(array_agg(w.limit_key), '{}') AS keys FROM window_rows w
    WHERE w.id IS NULL AND w.opened IS NULL
)
-- include: claim_window_early_stop
-- include: claim_entries_cut_with_state
-- include: claim_opened_row

-- name: claim_free_read
-- How many entries of jobs_ready_free_idx this backend's scans have read, those
-- their exclusions filtered out included: the backend's own count
-- (pg_stat_get_xact_tuples_returned, kept as the scans run, since the backend
-- last reported its statistics: the claim takes the difference from claim_start's
-- `free_read`; 0 with track_counts off). Sent after a window that leaves keys out of the free part,
-- in its round trip: when that part's reads are mostly the entries of the keys
-- left out, the claim lists the queue's groups and reads per group instead
-- (akadze.claim._windows, DOMINATED_RATIO).
SELECT pg_stat_get_xact_tuples_returned('akadze.jobs_ready_free_idx'::regclass)

-- name: claim_groups
-- A bounded skip scan of jobs_ready_key_idx (queue, limit_key, ...): the
-- distinct non-null keys with queued rows in the queue, one index probe each
-- (~10 us), without reading their backlogs; stops after `bound` keys. When fewer
-- than `bound` keys come back, the list is complete and the claim can read each
-- group's rows directly (claim_group_rows) instead of filtering the queue.
--
-- Guarded, so that it can travel in the claim's first round trip: it scans only
-- when the first `window` entries of the queue (as many as a claim's default
-- first window, read again here: ~80 index tuples) hold at most `try` distinct
-- groups; a queue that shows many groups in its head rarely has few in total,
-- and the probes would be wasted. window = 0: no guard (the claim asks again later, having seen few
-- groups). `scanned` says whether it ran. With `fair`, a complete list also
-- brings each group's busy count (running jobs of the group in this queue),
-- which the fair planner needs for every group of the queue.
WITH RECURSIVE guard AS (
    SELECT %(window)s::int = 0 OR (
        SELECT count(DISTINCT h.limit_key) + COALESCE(bool_or(h.limit_key IS NULL), false)::int
        FROM akadze.ready_window_parts(%(queue)s, 32768, now(), 0,
                                       COALESCE(%(now)s::timestamptz,
                                                nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                                now()), '[]'::jsonb,
                                       '[]'::jsonb, false, %(window)s::int, -1) h
    ) <= %(try)s AS ok
),
found AS (
    (SELECT k.limit_key
     FROM akadze.jobs k
     WHERE (SELECT ok FROM guard)
       AND k.queue = %(queue)s AND k.state = 'queued' AND k.limit_key IS NOT NULL
     ORDER BY k.limit_key
     LIMIT 1)
    UNION ALL
    SELECT (SELECT k.limit_key
            FROM akadze.jobs k
            WHERE k.queue = %(queue)s AND k.state = 'queued' AND k.limit_key > f.limit_key
            ORDER BY k.limit_key
            LIMIT 1)
    FROM found f
    WHERE f.limit_key IS NOT NULL
),
listed AS (
    SELECT limit_key FROM found WHERE limit_key IS NOT NULL LIMIT %(bound)s
),
null_group AS (
    SELECT (SELECT ok FROM guard) AND EXISTS (
        -- Ordered like jobs_ready_key_idx so that the plan probes that index (an
        -- IS NULL is no equality: without the ORDER BY a generic plan scanned
        -- the table for the first null, 6 ms behind 50 000 keyed rows).
        SELECT 1 FROM (
            SELECT n.id FROM akadze.jobs n
            WHERE n.queue = %(queue)s AND n.state = 'queued' AND n.limit_key IS NULL
            ORDER BY n.limit_key, n.priority DESC, n.run_at, n.id
            LIMIT 1) x) AS present
),
complete AS (
    SELECT (SELECT ok FROM guard) AND (SELECT count(*) FROM listed) < %(bound)s AS yes
)
SELECT (SELECT ok FROM guard) AS scanned,
       array(SELECT limit_key FROM listed ORDER BY limit_key) AS keys,
       (SELECT present FROM null_group) AS has_null,
       CASE WHEN %(fair)s AND (SELECT yes FROM complete) THEN
           array(SELECT (SELECT count(*) FROM akadze.jobs r
                         WHERE r.state = 'running' AND r.limit_key = l.limit_key
                           AND r.queue = %(queue)s)
                 FROM listed l ORDER BY l.limit_key) END AS busy,
       CASE WHEN %(fair)s AND (SELECT yes FROM complete)
                 AND (SELECT present FROM null_group) THEN
           (SELECT count(*) FROM akadze.jobs r
            WHERE r.state = 'running' AND r.limit_key IS NULL AND r.queue = %(queue)s)
       END AS null_busy

-- name: claim_group_rows
-- The next `per_group` index entries of each listed group after the group's
-- own position (keys[i] after (from_priority[i], from_run_at[i],
-- from_id[i]); the null group after P), through jobs_ready_key_idx (queue,
-- limit_key, priority DESC, run_at, id), where each group's rows are contiguous
-- and in queue order: a group's backlog costs nothing to skip. Each group is
-- read from where its own read stopped, so a group read further than the
-- others (one holding the head of the queue) is not read again. The null group
-- (null_group) has its own arm because "limit_key = k" never matches a null
-- key. Same `ready` column as claim_window.
WITH candidates AS (
    SELECT c.*
    FROM unnest(%(keys)b::text[], %(from_priority)b::int[],
                %(from_run_at)b::timestamptz[], %(from_id)b::bigint[]) AS g(key, p, r, i)
    CROSS JOIN LATERAL (
        (SELECT c.id, c.priority, c.run_at, c.limit_key
         FROM akadze.jobs c
         WHERE c.queue = %(queue)s AND c.state = 'queued' AND c.limit_key = g.key
           AND c.priority = g.p AND (c.run_at, c.id) > (g.r, g.i)
           AND c.run_at <= COALESCE(%(now)s::timestamptz,
                                    nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                    now())
         -- limit_key first: a generic plan then reads jobs_ready_key_idx (it
         -- filtered the queue index by key otherwise)
         ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
         LIMIT %(per_group)s)
        UNION ALL
        (SELECT c.id, c.priority, c.run_at, c.limit_key
         FROM akadze.jobs c
         WHERE c.queue = %(queue)s AND c.state = 'queued' AND c.limit_key = g.key
           AND c.priority < g.p
           AND c.run_at <= COALESCE(%(now)s::timestamptz,
                                    nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                    now())
         ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
         LIMIT %(per_group)s)
        LIMIT %(per_group)s
    ) c
    UNION ALL
    SELECT c.*
    FROM (
        (SELECT c.id, c.priority, c.run_at, c.limit_key
         FROM akadze.jobs c
         WHERE %(null_group)s
           AND c.queue = %(queue)s AND c.state = 'queued' AND c.limit_key IS NULL
           AND c.priority = %(after_priority)s
           AND (c.run_at, c.id) > (%(after_run_at)s, %(after_id)s)
           AND c.run_at <= COALESCE(%(now)s::timestamptz,
                                    nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                    now())
         -- limit_key first: the order of jobs_ready_key_idx, which the plan then
         -- reads (see claim_groups: IS NULL is no equality for the planner)
         ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
         LIMIT %(per_group)s)
        UNION ALL
        (SELECT c.id, c.priority, c.run_at, c.limit_key
         FROM akadze.jobs c
         WHERE %(null_group)s
           AND c.queue = %(queue)s AND c.state = 'queued' AND c.limit_key IS NULL
           AND c.priority < %(after_priority)s
           AND c.run_at <= COALESCE(%(now)s::timestamptz,
                                    nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                    now())
         ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
         LIMIT %(per_group)s)
        LIMIT %(per_group)s
    ) c
)
-- The same columns as claim_window's entries (`scanned` has no use here, nor
-- the part: the per-group reads filter nothing).
, kept AS (
    SELECT c.id, c.priority, c.run_at, c.limit_key, NULL::boolean AS limited,
           NULL::bigint AS scanned
    FROM candidates c
)
-- include: claim_entries_with_state
ORDER BY 2 DESC NULLS LAST, 3, 1

-- name: claim_group_heads
-- The first `per_group` index entries of every group of the queue, found by
-- the bounded skip scan of claim_groups (one probe per distinct key, up to
-- `bound` keys) and read as each key is found, through jobs_ready_key_idx;
-- then the null group's. A claim that remembers the queue's groups (a skip
-- scan listed them all) sends it in its first round trip: one pass over the
-- groups, where claim_groups and then claim_group_rows made two. The keys of
-- `skip` (remembered keys without room, counted in the same round trip) are
-- listed but not read, nor are the busy groups a fair claim presumes hopeless,
-- judged just before by claim_presume_busy (akadze.claim_presumed; '[]' when it
-- did not run in this transaction). The scan's row (below) says how many keys
-- it listed; `bound` of them or more, the list may be incomplete.
--
-- Each probe of the scan lands on the key's first entry in the index's order,
-- its head in queue order: with one row asked of each group (per_group = 1, a
-- fair claim whose last worst planned turn was 1) a head that is due is the
-- group's row, and the group costs that one probe; a group whose head is not
-- due yet is read by a probe of its own, as every group is otherwise.
WITH RECURSIVE found AS (
    (SELECT k.limit_key, k.priority, k.run_at, k.id FROM akadze.jobs k
     WHERE k.queue = %(queue)s AND k.state = 'queued' AND k.limit_key IS NOT NULL
     ORDER BY k.limit_key, k.priority DESC, k.run_at, k.id LIMIT 1)
    UNION ALL
    SELECT n.* FROM found f
    CROSS JOIN LATERAL (
        SELECT k.limit_key, k.priority, k.run_at, k.id FROM akadze.jobs k
        WHERE k.queue = %(queue)s AND k.state = 'queued' AND k.limit_key > f.limit_key
        ORDER BY k.limit_key, k.priority DESC, k.run_at, k.id LIMIT 1) n
),
skipped AS MATERIALIZED (
    SELECT jsonb_array_elements_text(
        %(skip)b::jsonb
        || COALESCE(nullif(current_setting('akadze.claim_presumed', true), '')::jsonb, '[]'))
        AS key
),
listed AS (
    SELECT f.*, %(per_group)s::int = 1
                AND f.run_at <= COALESCE(%(now)s::timestamptz,
                                         nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                         now()) AS head
    FROM found f LIMIT %(bound)s
),
candidates AS (
    SELECT g.id, g.priority, g.run_at, g.limit_key
    FROM listed g
    WHERE g.head AND g.limit_key NOT IN (SELECT s.key FROM skipped s)
    UNION ALL
    SELECT c.*
    FROM listed g
    CROSS JOIN LATERAL (
        SELECT c.id, c.priority, c.run_at, c.limit_key
        FROM akadze.jobs c
        WHERE c.queue = %(queue)s AND c.state = 'queued' AND c.limit_key = g.limit_key
          AND c.run_at <= COALESCE(%(now)s::timestamptz,
                                   nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                   now())
        -- limit_key first: the generic plan reads jobs_ready_key_idx
        ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
        LIMIT %(per_group)s) c
    WHERE NOT g.head
      AND g.limit_key NOT IN (SELECT s.key FROM skipped s)
    UNION ALL
    (SELECT c.id, c.priority, c.run_at, c.limit_key
     FROM akadze.jobs c
     WHERE c.queue = %(queue)s AND c.state = 'queued' AND c.limit_key IS NULL
       AND c.run_at <= COALESCE(%(now)s::timestamptz,
                                nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                now())
     -- the order of jobs_ready_key_idx (IS NULL is no equality: claim_groups)
     ORDER BY c.limit_key, c.priority DESC, c.run_at, c.id
     LIMIT %(per_group)s)
)
, kept AS (
    SELECT c.id, c.priority, c.run_at, c.limit_key, NULL::boolean AS limited,
           NULL::bigint AS scanned
    FROM candidates c
    UNION ALL
    -- The scan's row: no entry (id null; its null key also brings the null
    -- group's state), `scanned` the number of keys listed.
    SELECT NULL, NULL, NULL, NULL, NULL, (SELECT count(*) FROM listed)
)
-- include: claim_entries_with_state
ORDER BY 2 DESC NULLS LAST, 3, 1

-- name: claim_lock_first
-- The only lock of a claim that may wait. Used when claim_lock found every
-- limited key it tried held by other claims while this claim holds no limits
-- row and no job row yet: waiting then cannot close a cycle (we hold nothing
-- anyone could wait for), and the claim makes progress on a hot key instead of
-- coming back empty. The caller passes the first such key in queue order.
SELECT l.key
FROM akadze.limits l
WHERE l.key = ANY (%(keys)b::text[])
ORDER BY array_position(%(keys)b::text[], l.key)
LIMIT 1
FOR NO KEY UPDATE OF l

-- name: claim_lock
-- Lock the limits rows of newly met keys without waiting. Returns every listed
-- key that has a limits row, and whether we now hold it; a key without a row is
-- unlimited; a key with a row we could not lock is held by another claim and is
-- left out of this one. (A row this claim already holds is locked again at no
-- cost.) FOR NO KEY UPDATE, here and in claim_lock_first: it excludes other
-- claims and set_limit, but not the FOR KEY SHARE that an open transaction
-- which queued a job of the key holds (migration 0005); FOR UPDATE would make
-- such a key look held by another claim until that transaction ends.
-- Per listed key, a probe of limits_pkey and a lock attempt on that row
-- (LATERAL): the cost follows the keys listed, never the size of the limits
-- table (written as IN (SELECT unnest(..)), the plan hashed the keys and read
-- every limits row, twice). The keys are distinct.
--
-- The keys we now hold are also added to the setting akadze.claim_locked (a
-- jsonb object, local to the transaction, emptied by claim_start), which the
-- guard of claim_take reads: a take sent in the same round trip as this lock
-- knows which keys it got. An InitPlan: evaluated once, when the first row is
-- returned (no row, no key to add).
WITH got AS MATERIALIZED (
    SELECT l.key, (mine.key IS NOT NULL) AS locked
    FROM unnest(%(keys)b::text[]) AS k(key)
    CROSS JOIN LATERAL (
        SELECT x.key FROM akadze.limits x WHERE x.key = k.key OFFSET 0) l
    LEFT JOIN LATERAL (
        SELECT x.key FROM akadze.limits x
        WHERE x.key = k.key
        FOR NO KEY UPDATE SKIP LOCKED
    ) mine ON true
)
SELECT g.key, g.locked,
       (SELECT set_config(
                   'akadze.claim_locked',
                   (COALESCE(NULLIF(current_setting('akadze.claim_locked', true), ''),
                             '{}')::jsonb
                    || COALESCE(jsonb_object_agg(x.key, true) FILTER (WHERE x.locked),
                                '{}'::jsonb))::text,
                   true)
        FROM got x) IS NOT NULL AS noted
FROM got g

-- name: claim_counts
-- Runs as a NEW statement after the locks of claim_lock(_first) were granted:
-- its READ COMMITTED snapshot sees every commit of the claim that held a key
-- before us, so running(k) and starts(k) are exact while we hold the row.
-- Also counts busy(g) for fair groups (running jobs of the group in this queue).
SELECT 'limit' AS kind, c.key, c.max_running, c.running, c.max_starts, c.starts
FROM (
-- include: claim_limit_counts
) c
UNION ALL
SELECT 'busy', g.key, NULL,
       (SELECT count(*) FROM akadze.jobs r
        WHERE r.state = 'running' AND r.limit_key = g.key AND r.queue = %(queue)s),
       NULL, NULL
FROM unnest(%(groups)b::text[]) AS g(key)
UNION ALL
SELECT 'busy', NULL, NULL,
       (SELECT count(*) FROM akadze.jobs r
        WHERE r.state = 'running' AND r.limit_key IS NULL AND r.queue = %(queue)s),
       NULL, NULL
WHERE %(null_group)s

-- name: claim_remembered
-- The limit state of the keys this connection's last claim of the queue left
-- without room (akadze.claim._hints), counted without locks like a window's, in
-- the claim's first round trip. Counted as in claim_counts, but the keys still
-- without room come back as one array (kind 'blocked') and only the others as
-- rows (kind 'limit'): a claim remembering a thousand blocked keys receives and
-- parses one row, not a thousand. "Without room" is planner.headroom = 0: a
-- present policy used up (running >= max_running or starts >= max_starts).
-- MATERIALIZED: inlined, each count was run twice per key (once for its
-- column, once more for `full`).
WITH counted AS MATERIALIZED (
-- include: claim_limit_counts
), judged AS (
    SELECT c.*, COALESCE(c.running >= c.max_running, false)
                OR COALESCE(c.starts >= c.max_starts, false) AS full
    FROM counted c
)
SELECT 'limit' AS kind, j.key, j.max_running, j.running, j.max_starts, j.starts,
       NULL::text[] AS blocked
FROM judged j
WHERE NOT j.full
UNION ALL
SELECT 'blocked', NULL, NULL, NULL, NULL, NULL, array_agg(j.key)
FROM judged j
WHERE j.full

-- name: claim_sweep
-- The windowed claim's cancel sweep (claim_cancel_due), sent in its first round
-- trip right after claim_start, so that a claim that takes nothing (an idle
-- worker's poll, a queue whose keys are all at their limit) ends after one
-- round trip. The windows that follow in the same transaction no longer see
-- the swept rows. Bounded and SKIP LOCKED, as claim_cancel_due. A paused queue
-- sweeps nothing.
--
-- Its plan cannot depend on the statistics: the candidates come from the two
-- partial indexes of migration 0002, one arm each whose conditions are their
-- predicates exactly (state = 'queued' AND cancel_requested; AND expires_at IS
-- NOT NULL) with the queue and time as index conditions; the first 500 ids of
-- their union are then locked and re-checked one by one through the primary
-- key (LATERAL). Nothing else in the statement can drive a scan of the table:
-- the re-check is one "(...) IS TRUE" test. Written as one query over jobs,
-- a generic plan once walked the primary key in id order over the whole table
-- (18 ms at 100 000 rows), and on a table analyzed while empty it walked
-- jobs_ready_key_idx over the whole queue (100-180 ms) to find nothing.
WITH candidates AS (
    SELECT d.id FROM akadze.jobs d
    WHERE d.queue = %(queue)s AND d.state = 'queued' AND d.cancel_requested
      AND d.run_at <= COALESCE(%(now)s::timestamptz,
                               nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                               now())
    UNION
    SELECT d.id FROM akadze.jobs d
    WHERE d.queue = %(queue)s AND d.state = 'queued' AND d.expires_at IS NOT NULL
      AND d.expires_at <= COALESCE(%(now)s::timestamptz,
                                   nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                   now())
),
doomed AS (
    SELECT j.id
    FROM (SELECT c.id FROM candidates c
          WHERE NOT EXISTS (SELECT 1 FROM akadze.queue_pauses p WHERE p.queue = %(queue)s)
          ORDER BY c.id
          LIMIT 500) c
    CROSS JOIN LATERAL (
        SELECT j.id FROM akadze.jobs j
        WHERE j.id = c.id
          AND (j.queue = %(queue)s
               AND j.state = 'queued'
               AND j.run_at <= COALESCE(%(now)s::timestamptz,
                                        nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                        now())
               AND (j.cancel_requested
                    OR j.expires_at <= COALESCE(%(now)s::timestamptz,
                                                nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                                now()))
               AND (%(tasks)b::text[] IS NULL OR j.task = ANY (%(tasks)b::text[]))) IS TRUE
        FOR UPDATE SKIP LOCKED
    ) j
)
UPDATE akadze.jobs j
SET state = 'cancelled', finished_at = COALESCE(%(now)s::timestamptz,
                                                nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                                now())
FROM doomed
WHERE j.id = doomed.id
RETURNING
-- include: job_columns

-- name: claim_start
-- The first statement of a windowed claim, sent with its first window (one
-- round trip). Two things:
--
-- Claims of one queue take turns: a transaction-level advisory lock on the
-- queue (two-key form, class 6384484 = 0x616b64, "akd", so that it does not
-- meet an application's own advisory locks; queues whose names hash alike
-- merely share turns). Concurrent claims of a queue compute the same plan, so
-- without turns they collide on the same rows and limits rows and re-plan from
-- the head again and again (docs/explanation/claim.md, "Claims of one queue
-- take turns"). It is the claim's first lock, taken holding nothing, so this
-- wait cannot close a cycle of waits.
--
-- Generic plans for the rest of the transaction. Without this the server
-- re-plans the claim's prepared statements at every execution (their custom
-- plans look cheaper than the generic one), which costs ~0.6-1.2 ms per
-- statement, more than running it. The generic plans were checked with
-- EXPLAIN: the exclusions are written as "NOT IN (SELECT unnest($keys))", a
-- hashed subplan in a generic plan as in a custom one (never "<> ALL($keys)",
-- which a generic plan searches linearly per row), and "id = ANY($ids)" is an
-- index scan. Also no JIT: on a queue of a million rows a generic plan's
-- estimated cost passes jit_above_cost, and compiling cost ~25 ms for a
-- statement that runs in well under one.
--
-- And no sequential or bitmap scans: the claim's statements are written so that
-- each relation is reached through one index path (the ready indexes, the
-- primary key, the running-job indexes, the limits' primary key), bounded by
-- the window or by the ids given. Their generic plans are made once per
-- connection, with whatever statistics the table has then: taken while the
-- queue was empty (a burst into a quiet queue), at a thousand rows before a
-- million, or after a mass completion left it mostly dead. With estimates that
-- wrong, the cost model alone chose a sequential scan of the limits table per
-- key met, or a bitmap scan of a whole ready index, where a probe per row was
-- meant (docs/explanation/claim.md, "Plans that cannot go wrong"). Turned off
-- here they are not forbidden, only priced out: a statement with no other path
-- still runs.
--
-- Returns the settings it replaces (restored before the hooks run). The lock
-- comes first: the settings are read and changed once the queue is ours.
--
-- akadze.claim_locked: the limits rows this transaction holds (claim_lock),
-- none yet.
--
-- akadze.claim_now: the claim's clock, read here once the turn is ours
-- (clock_timestamp(), after the lock: the select list is evaluated once the FROM
-- has taken it, first of the list). Every statement of the claim reads it (COALESCE($now,
-- claim_now, now())), the same in each, as now() would be. Not now(): that is the
-- transaction's start, which came before the wait for the turn, so a claim that
-- waited behind others would find a job enqueued meanwhile not yet due (its
-- run_at is the enqueue's now(), later than that), come back without it, and the
-- job would wait for a claim that began after it, at the back of the queue of
-- claims (issue 16; tests/test_claim_turn_clock.py). The setting is local to the
-- transaction ('' after it: nullif), so a statement run outside a claim, or with
-- an injected clock ($now), never reads a stale one.
--
-- not_before: a moment of the server's clock the claim's clock must not come
-- before (NULL for none): the opening of a start-rate window that a worker
-- waits for (akadze.worker._openings). The worker sends the claim a little early
-- and the wait happens here, before the turn is taken (other claims of the queue
-- go on meanwhile), so the claim's clock, read once the turn is ours, is the
-- first moment the window is open when the turn is free: counted from the
-- worker's side instead, each window opened later than the last one's first
-- start by the claim's own trip (about a millisecond and a half on one host),
-- and the start rate fell short of max_starts per window by as much. pg_sleep
-- counts whole milliseconds, rounded up, so it sleeps until a millisecond before
-- and the rest is spun on clock_timestamp() (`spin`, a row a turn: a millisecond
-- of CPU at most). Never more than 5 ms in all, whatever the moment. A claim
-- with not_before opens with claim_start_at instead.
--
-- synchronous_commit for this transaction only (a worker's claims do not wait
-- for the WAL flush unless durable_claims): set here, local to the transaction,
-- rather than as a connection's startup option, which PgBouncer refuses. NULL
-- keeps the session's setting. Not restored before the hooks: it is what the
-- COMMIT uses.
SELECT
-- include: claim_start_list
FROM (SELECT pg_advisory_xact_lock(6384484, hashtext(%(queue)s))) AS turn

-- name: claim_start_at
-- claim_start for a claim with not_before (see above): the wait, then the turn.
-- A statement of its own, so that a claim without one plans and starts no part
-- of the wait (about 15 us a claim).
SELECT
-- include: claim_start_list
FROM (SELECT pg_advisory_xact_lock(6384484, hashtext(%(queue)s))
      FROM (WITH RECURSIVE spin(t, until) AS (
                SELECT clock_timestamp(), w.until
                FROM (SELECT LEAST(%(not_before)s::timestamptz,
                                   clock_timestamp() + interval '5 ms') AS until) w,
                     pg_sleep(extract(epoch FROM w.until - clock_timestamp())::float8 - 0.001)
                UNION ALL
                SELECT clock_timestamp(), s.until FROM spin s WHERE s.t < s.until)
            SELECT max(s.t) FROM spin s) AS waited) AS turn

-- fragment: claim_start_list
-- The select list of claim_start and claim_start_at. The claim's clock comes
-- first: the list is evaluated in order, once the FROM has taken the turn.
set_config('akadze.claim_now', clock_timestamp()::text, true) AS claim_now,
       current_setting('plan_cache_mode') AS plan_cache_mode,
       current_setting('jit') AS jit,
       current_setting('enable_seqscan') AS enable_seqscan,
       current_setting('enable_bitmapscan') AS enable_bitmapscan,
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('synchronous_commit',
                  coalesce(%(synchronous_commit)s::text,
                           current_setting('synchronous_commit')), true),
       set_config('akadze.claim_locked', '{}', true),
       -- where claim_free_read's count stands as the claim begins (it counts
       -- since the backend last reported its statistics, not per transaction)
       pg_stat_get_xact_tuples_returned('akadze.jobs_ready_free_idx'::regclass) AS free_read

-- name: claim_plan_restore
SELECT set_config('plan_cache_mode', %(plan_cache_mode)s, true),
       set_config('jit', %(jit)s, true),
       set_config('enable_seqscan', %(enable_seqscan)s, true),
       set_config('enable_bitmapscan', %(enable_bitmapscan)s, true)

-- fragment: claim_entries_with_state
-- The end of claim_window, claim_window_whole and claim_group_rows, after
-- their CTE `kept` (the entries read: id, priority, run_at, limit_key, limited,
-- scanned): each entry with its `ready` flag, then one row per key met with its
-- state. The columns of claim_entries_cut_with_state (left_out and cuts null).
--
-- The state of the keys met in these entries whose state the caller does not
-- know yet (known: text[], known_null: the null group), read WITHOUT locks: the
-- limits row, running(k) and starts(k), and in fair mode busy(g). In this
-- statement's snapshot the counts are exact for a single claim; a key is locked
-- (and counted again) only if the claim goes on to take from it (claim_lock).
, met AS (
    SELECT DISTINCT c.limit_key FROM kept c
    WHERE (c.limit_key IS NULL AND NOT %(known_null)s)
       OR c.limit_key NOT IN (SELECT unnest(%(known)b::text[]))
)
SELECT c.id, c.priority, c.run_at, c.limit_key,
       (SELECT NOT j.cancel_requested
               AND (j.expires_at IS NULL OR j.expires_at > COALESCE(%(now)s::timestamptz,
                                                                    nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                                                    now()))
               AND (%(tasks)b::text[] IS NULL OR j.task = ANY (%(tasks)b::text[]))
        FROM akadze.jobs j
        WHERE j.id = c.id) AS ready,
       -- max_running, running, max_starts, starts, busy, scanned, left_out, cuts,
       -- opened
       c.limited, NULL::int, NULL::bigint, NULL::int, NULL::bigint, NULL::bigint,
       c.scanned, NULL::text[], NULL::bigint, NULL::text[]
FROM kept c
-- A paused queue is not touched at all: no entry, no state (an InitPlan, once).
WHERE NOT EXISTS (SELECT 1 FROM akadze.queue_pauses p WHERE p.queue = %(queue)s)
UNION ALL
-- One row per key met (id NULL), after the entries, for the keys that have a
-- limits row or (fair) running jobs in the queue: a key met without a row here
-- is unlimited and idle, which spares a row per key of a queue of free keys.
SELECT NULL, NULL, NULL, st.limit_key, NULL, st.limited, st.max_running, st.running,
       st.max_starts, st.starts, st.busy, NULL, NULL, NULL, NULL
FROM (
    SELECT m.limit_key,
-- include: claim_key_state
    -- OFFSET 0 keeps this subquery whole: inlined, each busy count ran twice
    -- (once for the WHERE below, once for its column), 1 ms of a 4 ms window of
    -- 240 new groups (EXPLAIN ANALYZE).
    OFFSET 0
) st
WHERE st.limited OR st.busy > 0

-- fragment: claim_entries_cut_with_state
-- The end of claim_window_judged, after its CTEs `kept` (the entries read: id,
-- priority, run_at, limit_key, limited, scanned) and `left_out` (one row:
-- `keys`, the remembered keys it left out as still without room):
-- claim_entries_with_state, with the cut below, and then the left-out keys in
-- one row (id NULL, left_out not null: a claim remembering a thousand blocked
-- keys receives and parses one row, not a thousand); then claim_opened_row.
-- Only there: the cut costs
-- two sorts of the entries, which a window of many unlimited groups pays for
-- nothing ("200 of 400 groups busy" was 1.6x slower with it in every window).
--
-- The state of the keys met in these entries whose state the caller does not
-- know yet (known: text[], known_null: the null group), read WITHOUT locks: the
-- limits row, running(k) and starts(k), and in fair mode busy(g). In this
-- statement's snapshot the counts are exact for a single claim; a key is locked
-- (and counted again) only if the claim goes on to take from it (claim_lock).
, met AS (
    -- unflagged: an entry of the key came from the free part (jobs.limited
    -- false; the caller remembers such keys, Hints.unflagged, even when the cut
    -- below returns none of their entries)
    SELECT c.limit_key, COALESCE(bool_or(c.limited IS FALSE), false) AS unflagged
    FROM kept c
    WHERE (c.limit_key IS NULL AND NOT %(known_null)s)
       OR c.limit_key NOT IN (SELECT unnest(%(known)b::text[]))
    GROUP BY c.limit_key
)
-- MATERIALIZED: read twice (the rows of state, and the cut below); inlined,
-- each count would run once per reference.
, st AS MATERIALIZED (
    SELECT m.limit_key, m.unflagged,
-- include: claim_key_state
)
-- The cut: the window does not return the ready entries of a limited
-- key past the key's headroom, by the state above (in this snapshot, the one
-- the caller learns): they cannot be eligible (planner.prune drops them), and
-- on a queue whose limited keys have a slot or two free each, they were most of
-- a window (280 of 320 entries sent, decoded and planned over for nothing). The
-- last entry is always returned: the caller's next window starts after it. A
-- key whose state the caller knew is not cut (its headroom may be another
-- snapshot's). `cut`: how many entries were left out so (on every entry), so
-- that the caller still tells the end of the queue by `scanned`.
, rated AS (
    SELECT c.id, c.priority, c.run_at, c.limit_key, c.limited, c.scanned,
           (SELECT NOT j.cancel_requested
                   AND (j.expires_at IS NULL
                        OR j.expires_at > COALESCE(%(now)s::timestamptz,
                                                   nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                                   now()))
                   AND (%(tasks)b::text[] IS NULL OR j.task = ANY (%(tasks)b::text[]))
            FROM akadze.jobs j
            WHERE j.id = c.id) AS ready
    FROM kept c
    -- A paused queue is not touched at all: no entry, no state (an InitPlan, once).
    WHERE NOT EXISTS (SELECT 1 FROM akadze.queue_pauses p WHERE p.queue = %(queue)s)
)
, judged_entries AS (
    SELECT r.*,
           COALESCE(r.ready AND s.limited
                    AND row_number() OVER (PARTITION BY r.limit_key, r.ready
                                           ORDER BY r.priority DESC, r.run_at, r.id)
                        > GREATEST(0, LEAST(s.max_running - s.running,
                                            s.max_starts - s.starts))
                    AND row_number() OVER (ORDER BY r.priority, r.run_at DESC, r.id DESC) > 1,
                    false) AS cut
    FROM rated r
    LEFT JOIN st s ON s.limit_key = r.limit_key
)
, entries AS (
    SELECT e.*, count(*) FILTER (WHERE e.cut) OVER () AS cuts FROM judged_entries e
)
SELECT e.id, e.priority, e.run_at, e.limit_key, e.ready,
       e.limited, NULL::integer AS max_running, NULL::bigint AS running,
       NULL::integer AS max_starts, NULL::bigint AS starts, NULL::bigint AS busy,
       e.scanned, NULL::text[] AS left_out, e.cuts, NULL::text[] AS opened
FROM entries e
WHERE NOT e.cut
UNION ALL
-- One row per key met (id NULL), after the entries, for the keys that have a
-- limits row or (fair) running jobs in the queue: a key met without a row here
-- is unlimited and idle, which spares a row per key of a queue of free keys.
-- Its `ready` column says whether it was met in the free part (unflagged).
SELECT NULL, NULL, NULL, st.limit_key, st.unflagged, st.limited, st.max_running,
       st.running, st.max_starts, st.starts, st.busy, NULL, NULL, NULL, NULL
FROM st
WHERE st.limited OR st.busy > 0
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, lo.keys, NULL,
       NULL
FROM left_out lo

-- fragment: claim_key_state
-- The rest of a SELECT of the state of each key of `met` (limit_key), after the
-- list's first columns (claim_entries_with_state, claim_entries_cut_with_state),
-- read WITHOUT locks: whether it has a limits row, running(k) and starts(k),
-- and in fair mode busy(g); no row for a paused queue.
           l.key IS NOT NULL AS limited, l.max_running,
           CASE WHEN l.key IS NOT NULL THEN
               (SELECT count(*) FROM akadze.jobs r
                WHERE r.state = 'running' AND r.limit_key = l.key) END AS running,
           l.max_starts,
           CASE WHEN l.max_starts IS NOT NULL THEN
               (SELECT count(*) FROM akadze.start_marks s
                WHERE s.key = l.key
                  AND s.started_at > COALESCE(%(now)s::timestamptz,
                                              nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                              now()) - l."window")
           END AS starts,
           CASE WHEN NOT %(fair)s THEN NULL
                WHEN m.limit_key IS NULL THEN
                    (SELECT count(*) FROM akadze.jobs r
                     WHERE r.state = 'running' AND r.limit_key IS NULL
                       AND r.queue = %(queue)s)
                ELSE (SELECT count(*) FROM akadze.jobs r
                      WHERE r.state = 'running' AND r.limit_key = m.limit_key
                        AND r.queue = %(queue)s) END AS busy
    FROM met m
    -- A probe of limits_pkey per key met (LATERAL, OFFSET 0): joined plainly,
    -- the plan hashed the whole limits table at every window, a thousand
    -- rows read to look up forty keys.
    LEFT JOIN LATERAL (
        SELECT x.key, x.max_running, x.max_starts, x."window" FROM akadze.limits x
        WHERE x.key = m.limit_key
        OFFSET 0) l ON true
    WHERE NOT EXISTS (SELECT 1 FROM akadze.queue_pauses p WHERE p.queue = %(queue)s)

-- fragment: claim_limit_counts
-- The limits rows of the keys `keys` with what counts against them: running
-- jobs of the key in every queue, and start marks inside its window (0 without
-- max_starts). Columns key, max_running, running, max_starts, starts.
SELECT l.key, l.max_running,
       (SELECT count(*) FROM akadze.jobs r
        WHERE r.state = 'running' AND r.limit_key = l.key) AS running,
       l.max_starts,
       CASE WHEN l.max_starts IS NULL THEN 0
            ELSE (SELECT count(*) FROM akadze.start_marks m
                  WHERE m.key = l.key
                    AND m.started_at > COALESCE(%(now)s::timestamptz,
                                                nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                                now()) - l."window")
       END AS starts
FROM akadze.limits l
-- IN (SELECT ..), not = ANY (..): a generic plan searches an array parameter
-- linearly for every row (quadratic for a claim that counts a thousand
-- remembered keys); the subquery is hashed once. `keys` is a jsonb array (see
-- claim_window on skip_keys). Hashed, the whole limits table is read (about
-- 0.1 us a row); a probe of limits_pkey per key (LATERAL) was tried and read
-- three times the buffers for "1 000 keys at their limit", where the keys
-- counted are most of the limits rows, as they are whenever many are counted.
WHERE l.key IN (SELECT jsonb_array_elements_text(%(keys)b))

-- fragment: claim_window_candidates
-- The rows of claim_window and claim_window_whole: the next `window` index
-- entries of the queue after P, leaving out the excluded keys: the free and the
-- limited part merged, the limited part in order or split per key
-- (akadze.ready_window_open, migrations 0014 and 0018, which PostgreSQL
-- inlines here: the plan is the one of the function's body, with these
-- parameters), and the open route's row if the window took it
-- (claim_window_split). Each entry says which part it came from (`limited`).
    SELECT * FROM akadze.ready_window_open(
        %(queue)s, %(after_priority)s::int, %(after_run_at)s::timestamptz,
        %(after_id)s::bigint, COALESCE(%(now)s::timestamptz,
                                       nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                       now()), %(skip_free)b::jsonb,
        -- no remembered keys (claim_window_judged's)
        %(skip_limited)b::jsonb, '[]', '[]', %(skip_null)s::boolean,
        %(window)s::int, %(split_max)s::int, %(try_open)s::boolean, %(known_open)b::jsonb)

-- fragment: claim_window_kept_whole
-- The CTE `kept` of the windows read without the early stop
-- (claim_window_whole, claim_window_presumed): every candidate, with how many
-- the window scanned.
, kept AS (
    SELECT c.id, c.priority, c.run_at, c.limit_key, c.limited, count(*) OVER () AS scanned
    FROM candidates c
)

-- fragment: claim_window_early_stop
-- The early stop of claim_window and claim_window_judged, after their CTE
-- `candidates`: the CTE `kept` of claim_entries_with_state.
-- The early stop (`need` not null, planner.ReadMore): the entries up to and
-- with the need-th one that is sure to help. Default order: an entry of a key
-- without a limits row (or without a key), which is eligible (if ready). Fair
-- order: the first entry of a group that the claim has not met (not in `known`)
-- with no limits row and nothing running in the queue: its turn is 1. With
-- that many the claim can settle, and the window's tail would be read, sent,
-- and have its keys' state looked up for nothing (a window that follows many
-- excluded keys is large). CASE evaluates the probes only where needed. What is
-- returned stays a prefix of the queue; `scanned` (on every entry) lets the
-- caller tell a cut window from the end of the queue.
--
-- Each correlated EXISTS ends in OFFSET 0, which keeps it a probe per entry
-- (an index probe of limits_pkey or jobs_running_key_idx). Without it the
-- planner may hash the subquery instead, reading every limits row or every
-- running job of the key index once per statement, and it chooses between the
-- two by its estimate of the rows: on statistics taken while the queue was
-- empty it hashed (1 000 running jobs read for a window of 40).
, firsts AS (
    SELECT c.id, c.priority, c.run_at, c.limit_key, c.limited,
           row_number() OVER (PARTITION BY c.limit_key
                              ORDER BY c.priority DESC, c.run_at, c.id) = 1 AS first
    FROM candidates c
)
, free AS (
    SELECT c.id, c.priority, c.run_at, c.limit_key, c.limited,
           CASE WHEN %(need)s::int IS NULL THEN false
                -- A flagged job's key has a limits row (migration 0005): no
                -- probe needed to know it is not free.
                WHEN c.limited THEN false
                WHEN NOT %(fair)s THEN
                    c.limit_key IS NULL
                    OR NOT EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = c.limit_key
                                   OFFSET 0)
                WHEN NOT c.first THEN false
                WHEN c.limit_key IS NULL THEN
                    NOT %(known_null)s
                    AND NOT EXISTS (SELECT 1 FROM akadze.jobs r
                                    WHERE r.state = 'running' AND r.limit_key IS NULL
                                      AND r.queue = %(queue)s)
                ELSE
                    c.limit_key NOT IN (SELECT unnest(%(known)b::text[]))
                    AND NOT EXISTS (SELECT 1 FROM akadze.limits l WHERE l.key = c.limit_key
                                    OFFSET 0)
                    AND NOT EXISTS (SELECT 1 FROM akadze.jobs r
                                    WHERE r.state = 'running' AND r.limit_key = c.limit_key
                                      AND r.queue = %(queue)s
                                    OFFSET 0)
           END AS free
    FROM firsts c
)
, counted AS (
    SELECT f.id, f.priority, f.run_at, f.limit_key, f.limited,
           count(*) OVER () AS scanned,
           count(*) FILTER (WHERE f.free) OVER (
               ORDER BY f.priority DESC, f.run_at, f.id
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS free_before
    FROM free f
)
, kept AS (
    SELECT k.id, k.priority, k.run_at, k.limit_key, k.limited, k.scanned
    FROM counted k
    WHERE %(need)s::int IS NULL OR k.free_before < %(need)s::int
)

-- fragment: claim_window_judged_candidates
-- claim_window_candidates with the remembered keys judged on the server
-- (claim_window_judged).
    SELECT * FROM akadze.ready_window_open(
        %(queue)s, %(after_priority)s::int, %(after_run_at)s::timestamptz,
        %(after_id)s::bigint, COALESCE(%(now)s::timestamptz,
                                       nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                                       now()), %(skip_free)b::jsonb,
        %(skip_limited)b::jsonb, %(remembered)b::jsonb, %(remembered_free)b::jsonb,
        %(skip_null)s::boolean, %(window)s::int, %(split_max)s::int, %(try_open)s::boolean,
        NULL::jsonb)

-- fragment: claim_window_split
-- The entries of ready_window_open (migration 0018) in the window statements,
-- after their CTE `window_rows` (MATERIALIZED: read twice), whose other rows
-- (id NULL) are the open route's keys (opened not null: claim_opened_row) and
-- the judged window's left-out keys.
, candidates AS (
    SELECT w.id, w.priority, w.run_at, w.limit_key, w.limited FROM window_rows w
    WHERE w.id IS NOT NULL
)

-- fragment: claim_opened_row
-- The end of the window statements after claim_entries_with_state (or
-- claim_entries_cut_with_state): the open route's keys (ready_window_open,
-- migration 0018), if the window took it, in one row after the entries (id and
-- limit_key NULL; CTE `window_rows`), and the order of all their rows.
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       w.opened
FROM window_rows w WHERE w.id IS NULL AND w.opened IS NOT NULL
ORDER BY 2 DESC NULLS LAST, 3, 1
