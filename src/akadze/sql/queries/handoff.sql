-- Hand-offs (akadze.worker._handoffs): a run of a job whose key has max_running
-- ends, and in the transaction that writes its outcome the slot it leaves goes
-- straight to the next ready job of the same key, instead of waiting for the
-- queue's next claim (which runs back to back with the others of its queue: tens
-- of milliseconds away on a busy queue). The finish and the start commit
-- together, so no claim ever sees the key with the room in between (and none
-- races the hand-off for it). The limits protocol is the claim's
-- (docs/explanation/claim.md, "Locks"): lock the key's limits row without waiting,
-- then count its running jobs in a later statement, whose READ COMMITTED snapshot
-- sees every commit made before the lock was granted. The transaction holds the
-- finished runs' rows when it asks for the locks; that is safe because it never
-- waits for them (SKIP LOCKED), and neither claims nor anything else waits for a
-- running row while holding a limits row.
--
-- Both statements follow the finish in one pipeline (hand_off_lock,
-- hand_off_take, COMMIT); hand_off_take learns which keys the lock got from the
-- setting akadze.hand_off_locked, local to the transaction.

-- name: hand_off_lock
-- Lock, without waiting, the limits rows of the keys whose runs just ended here,
-- for the keys limited by max_running alone (a start-rate key needs its start
-- marks counted over the window: those keys wait for the next claim, as before).
-- A row another claim holds is skipped: that claim counted the key before our
-- outcome commit, and the notification of migration 0010 sends the next one.
-- FOR NO KEY UPDATE, as claim_lock: an open transaction that queued a job of the
-- key holds FOR KEY SHARE, which this does not wait for. One probe of limits_pkey
-- per key (LATERAL), whatever the size of the limits table.
WITH got AS MATERIALIZED (
    SELECT mine.key
    FROM unnest(%(keys)b::text[]) AS k(key)
    CROSS JOIN LATERAL (
        SELECT x.key FROM akadze.limits x
        WHERE x.key = k.key AND x.max_running IS NOT NULL AND x.max_starts IS NULL
        FOR NO KEY UPDATE SKIP LOCKED
    ) mine
)
SELECT set_config('akadze.hand_off_locked',
                  COALESCE((SELECT jsonb_object_agg(g.key, true) FROM got g),
                           '{}'::jsonb)::text,
                  true) AS locked

-- name: hand_off_take
-- Start, for each (queue, key, slots) asked for whose key hand_off_lock got, up to
-- `slots` ready jobs of the key in queue order, as many as the key has room for
-- (max_running less its running jobs in every queue, counted here: this statement
-- began after the lock was granted). The worker asks for one slot per run of the
-- key that just ended there; with no room (the limit was lowered, or another
-- worker's claim started a job of the key after our outcome commit) nothing starts.
--
-- A hand-off starts only what the queue's next claim would start in that slot
-- (default order: the first eligible jobs in queue order), as far as a bounded
-- look can tell:
--   * only ready jobs (queued, due, not cancel-requested, not expired, of a task
--     the worker runs, the queue not paused), checked on each row;
--   * only a job J that no other queued job precedes in queue order, leaving out
--     the jobs of keys without room: the keys in `excluded` (those the worker's
--     last claim of the queue left without room, a hint that spares counting them,
--     and the keys handed off here) and, in the limited part, any other key whose
--     running jobs or starts are at its limit now. Such a job is not eligible, or
--     became eligible a moment ago (as if a claim of another worker ran
--     meanwhile); any other job before J (a job of no key, of a key with room, of
--     a higher priority, not due yet at a higher priority, of a task this worker
--     does not run) makes the hand-off step aside for the next claim.
--     The look reads the first entries of each ready index in queue order (`scan`:
--     64 of jobs_ready_free_idx, whose keys are rarely excluded, and 1 024 of
--     jobs_ready_limited_idx, where the entries of keys at their limit lie before
--     the next job of the key handed off), never more: `stop` is the first of them
--     that is not of an excluded key, or the last entry a part was read to (beyond
--     it the look knows nothing), and J must come before `stop`. So a worker whose
--     slots are all wanted (a job of another key with room waits) never hands a
--     slot to a key with a deep backlog, and the cost is bounded whatever the queue
--     holds (at most 1 088 index entries per queue and write, not per key). The
--     limited part's look also ends past `far`, the furthest entry the write
--     could start: usually well before 1 024 entries. And when at most 32 limits
--     rows have room by their count (`with_room`), the limited part is not read
--     entry by entry at all: its stop is the first entry of those keys (the open
--     route), so keys at their limit cost nothing, however many come first.
--
-- A key's next jobs are read from jobs_ready_key_idx (equality on queue and
-- limit_key, the index's order), at most `slots` + 16 entries, and checked there;
-- a key whose first entries are not ready (cancel requests, other tasks) is left
-- to the next claim. The rows are then locked through the primary key (= ANY of
-- an array: an index condition whatever the statistics say) with every ready
-- condition checked again on the newest version (FOR UPDATE SKIP LOCKED), and
-- changed as claim_take changes them.
WITH locked AS MATERIALIZED (
    -- The keys hand_off_lock got (a jsonb object: `?` is a binary search), parsed
    -- once: tested per row, the setting's text was parsed once per row. And the
    -- changes to running counts this transaction's finishes made and has not
    -- applied yet (migration 0021: defer_running), per key.
    SELECT COALESCE(NULLIF(current_setting('akadze.hand_off_locked', true), ''),
                    '{}')::jsonb AS keys,
           COALESCE(NULLIF(current_setting('akadze.running_pending', true), ''),
                    '{}')::jsonb AS pending
),
carried AS MATERIALIZED (
    -- The reserved jobs begun in the slots of the runs this write ends, that
    -- start_reserved started earlier in this transaction (one given back meanwhile
    -- is not running: it gets no successor), per key. Read through the primary
    -- key only: the other conditions are one "(...) IS TRUE" test, which no index
    -- answers (jobs_running_worker_idx, chosen on stale statistics, read every run
    -- of the worker once per key).
    SELECT c.limit_key AS key, count(*)::int AS n
    FROM akadze.jobs c
    WHERE c.id = ANY (%(carried)s::bigint[])
      AND (c.state = 'running' AND c.worker_id = %(worker_id)s) IS TRUE
    GROUP BY c.limit_key
),
asked AS MATERIALIZED (
    -- slots: the runs of the key that ended here with no successor (each asks
    -- for a start); carried: the reserved jobs of the key begun in the slots of
    -- the others. Each run started, either way, gets a successor reserved (room,
    -- below).
    SELECT a.queue, a.key, a.slots,
           COALESCE((SELECT c.n FROM carried c WHERE c.key = a.key), 0) AS carried
    FROM unnest(%(queues)b::text[], %(keys)b::text[], %(slots)b::int[])
         AS a(queue, key, slots)
    WHERE (SELECT k.keys FROM locked k) ? a.key
      AND NOT EXISTS (SELECT 1 FROM akadze.queue_pauses p WHERE p.queue = a.queue)
),
with_room AS MATERIALIZED (
    -- The open route (the claim's, migration 0018): the limits rows that have room
    -- by their count, up to 33, from limits_room_idx. A row full by its count is at
    -- its limit in this snapshot (the count is never higher than the key's running
    -- jobs), so when at most 32 rows have room, the jobs of every other key in the
    -- limited part are of keys without room: the look needs the first entry of the
    -- keys with room only, one probe of jobs_ready_key_idx each, instead of reading
    -- the queue's head entry by entry past every key at its limit (about 200
    -- entries per write in "many keys", up to 1 024 with more keys). Keys with a
    -- start rate and no max_running are never full by the count: they are probed,
    -- and their start marks counted, as the look counts them.
    SELECT l.key FROM akadze.limits l
    WHERE NOT COALESCE(l.running >= l.max_running, false)
    ORDER BY l.key
    LIMIT 33
),
open_route AS MATERIALIZED (
    SELECT (SELECT count(*) FROM with_room) <= 32 AS yes
),
far AS MATERIALIZED (
    -- Per queue, the furthest in queue order of the entries a hand-off could start:
    -- for each key asked there, its `slots`-th queued entry (or its last), read from
    -- jobs_ready_key_idx. The look below ends at the first entry past it, so nothing
    -- past it is started here: a key whose first entries are not ready (chosen reads
    -- on to `slots` + 16) leaves its later jobs to the next claim. A queue whose head
    -- is all keys at their limit is read as far as the keys' next jobs, not to the
    -- end of the look (the cost of a hand-off follows how far its jobs are, not the
    -- size of the look). The key's first entries are read again by chosen: stop,
    -- which chosen needs, needs this first. Not on the open route (empty there):
    -- chosen then keeps to each key's first `slots` entries itself.
    SELECT DISTINCT ON (a.queue) a.queue, h.priority, h.run_at, h.id
    FROM asked a
    CROSS JOIN LATERAL (
        SELECT e.priority, e.run_at, e.id
        FROM (SELECT j.priority, j.run_at, j.id FROM akadze.jobs j
              WHERE j.queue = a.queue AND j.limit_key = a.key AND j.state = 'queued'
              ORDER BY j.priority DESC, j.run_at, j.id
              LIMIT 2 * a.slots + a.carried) e
        ORDER BY e.priority, e.run_at DESC, e.id DESC
        LIMIT 1
    ) h
    WHERE NOT (SELECT r.yes FROM open_route r)
    ORDER BY a.queue, h.priority, h.run_at DESC, h.id DESC
),
stop AS MATERIALIZED (
    -- Per queue, the first entry of each part that is not of an excluded key, or
    -- is past the queue's `far`, or the last one the look reads there; the earlier
    -- of the two. Each part's entries stream in index order and the first match
    -- ends its scan.
    SELECT q.queue, s.priority, s.run_at, s.id
    FROM (SELECT DISTINCT a.queue FROM asked a) q
    LEFT JOIN far fa ON fa.queue = q.queue
    CROSS JOIN LATERAL (
        SELECT e.priority, e.run_at, e.id
        FROM ((SELECT f.priority, f.run_at, f.id
               FROM (SELECT j.priority, j.run_at, j.id, j.limit_key,
                            row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.id) AS n
                     FROM (SELECT j.priority, j.run_at, j.id, j.limit_key FROM akadze.jobs j
                           WHERE j.queue = q.queue AND j.state = 'queued' AND NOT j.limited
                           ORDER BY j.priority DESC, j.run_at, j.id LIMIT 64) j) f
               WHERE f.n = 64 OR f.limit_key IS NULL
                  OR f.limit_key NOT IN (SELECT jsonb_array_elements_text(%(excluded)b::jsonb))
               LIMIT 1)
              UNION ALL
              (SELECT f.priority, f.run_at, f.id
               FROM ((SELECT j.priority, j.run_at, j.id, j.limit_key,
                             row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.id) AS n
                      FROM (SELECT j.priority, j.run_at, j.id, j.limit_key FROM akadze.jobs j
                            WHERE j.queue = q.queue AND j.state = 'queued' AND j.limited
                              AND NOT (SELECT r.yes FROM open_route r)
                            ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1024) j)
                     UNION ALL
                     -- The open route, instead: the first queued entry, in this
                     -- queue, of each key with room by its row or freed by this
                     -- transaction's own finishes (deferred: its row does not show
                     -- it yet), in queue order, for the test below (n and far do
                     -- not apply: NULL). Entries of a key that is not flagged there
                     -- are read too: that only stops the look earlier. One of the
                     -- two sources is empty, so the other's order is kept.
                     (SELECT h.priority, h.run_at, h.id, c.key, NULL::bigint
                      FROM (SELECT w.key FROM with_room w
                            UNION
                            SELECT p.key
                            FROM jsonb_each_text((SELECT k.pending FROM locked k)) p
                            WHERE p.value::integer < 0) c
                      CROSS JOIN LATERAL (
                          SELECT j.priority, j.run_at, j.id FROM akadze.jobs j
                          WHERE j.queue = q.queue AND j.limit_key = c.key
                            AND j.state = 'queued'
                          ORDER BY j.priority DESC, j.run_at, j.id
                          LIMIT 1
                      ) h
                      WHERE (SELECT r.yes FROM open_route r)
                        -- the keys left out are not probed at all (the test below
                        -- would pass their entries anyway): in a write that hands
                        -- off, they are most of the freed ones
                        AND c.key NOT IN (SELECT jsonb_array_elements_text(%(excluded)b::jsonb))
                      ORDER BY h.priority DESC, h.run_at, h.id)) f
               WHERE f.n = 1024 OR f.limit_key IS NULL
                  OR ((-f.priority::int, f.run_at, f.id)
                      > (-fa.priority::int, fa.run_at, fa.id)) IS TRUE
                  OR (f.limit_key NOT IN (SELECT jsonb_array_elements_text(%(excluded)b::jsonb))
                      -- not left out, but without room now. Read without the key's
                      -- lock: this decides the order only, never the limit. The
                      -- running count is the limits row's (migration 0017), with
                      -- what this transaction changed and has not applied yet: one
                      -- probe of limits_pkey per entry, where counting the key's
                      -- running jobs read each of their rows (about 5 us an entry,
                      -- and the look reads up to a thousand). The row's count is
                      -- never higher than the key's running jobs: a key it shows
                      -- with room that has none only makes the hand-off step aside.
                      AND NOT EXISTS (
                          SELECT 1 FROM akadze.limits l
                          WHERE l.key = f.limit_key
                            AND (l.max_running <= l.running + COALESCE(
                                     ((SELECT k.pending FROM locked k) ->> l.key)::integer, 0)
                                 OR (l.max_starts IS NOT NULL AND l.max_starts <= (
                                     SELECT count(*) FROM akadze.start_marks m
                                     WHERE m.key = l.key
                                       AND m.started_at > COALESCE(%(now)s::timestamptz, now())
                                                          - l."window")))))
               LIMIT 1)) e
        ORDER BY e.priority DESC, e.run_at, e.id
        LIMIT 1
    ) s
),
room AS MATERIALIZED (
    SELECT s.*,
           -- The successors to reserve: one per run of the key started by this
           -- write (n here, carried by start_reserved), none while the key runs
           -- more than its limit allows (it was lowered: no run is followed).
           CASE WHEN s.over THEN 0 ELSE s.n + s.carried END AS r
    FROM (SELECT a.queue, a.key, a.carried, st.priority AS stop_priority,
                 st.run_at AS stop_run_at, st.id AS stop_id,
                 CASE WHEN (SELECT r.yes FROM open_route r)
                      THEN 2 * a.slots + a.carried END AS first_only,
                 GREATEST(0, LEAST(a.slots, l.max_running - c.running)) AS n,
                 c.running > l.max_running AS over
          FROM asked a
          JOIN akadze.limits l ON l.key = a.key
          CROSS JOIN LATERAL (
              SELECT count(*) AS running FROM akadze.jobs r
              WHERE r.state = 'running' AND r.limit_key = a.key) c
          LEFT JOIN stop st ON st.queue = a.queue) s
),
chosen AS (
    -- Per key, its first n + r eligible jobs in queue order: the first n start, the
    -- next r are reserved (`rank`).
    SELECT c.id, c.rank, rm.key, rm.n
    FROM room rm
    CROSS JOIN LATERAL (
        SELECT e.id, row_number() OVER (ORDER BY e.priority DESC, e.run_at, e.id) AS rank
        FROM (SELECT j.id, j.priority, j.run_at
              FROM akadze.jobs j
              WHERE j.queue = rm.queue AND j.limit_key = rm.key AND j.state = 'queued'
              ORDER BY j.priority DESC, j.run_at, j.id
              -- on the open route, the key's first `slots` entries only (far's
              -- bound, per key)
              LIMIT COALESCE(rm.first_only, rm.n + rm.r + 16)) e
        JOIN akadze.jobs h ON h.id = e.id
        WHERE (rm.stop_id IS NULL
               OR (-e.priority::int, e.run_at, e.id)
                  < (-rm.stop_priority::int, rm.stop_run_at, rm.stop_id)) IS TRUE
          AND (h.run_at <= COALESCE(%(now)s::timestamptz, now())
               AND NOT h.cancel_requested
               AND (h.expires_at IS NULL
                    OR h.expires_at > COALESCE(%(now)s::timestamptz, now()))
               AND (%(tasks)b::text[] IS NULL OR h.task = ANY (%(tasks)b::text[]))) IS TRUE
        ORDER BY e.priority DESC, e.run_at, e.id
        LIMIT rm.n + rm.r
    ) c
    WHERE rm.n + rm.r > 0
),
picked AS (
    SELECT j.id
    FROM akadze.jobs j
    WHERE j.id = ANY (ARRAY(SELECT id FROM chosen))
      AND (j.state = 'queued'
           AND j.run_at <= COALESCE(%(now)s::timestamptz, now())
           AND NOT j.cancel_requested
           AND (j.expires_at IS NULL
                OR j.expires_at > COALESCE(%(now)s::timestamptz, now()))) IS TRUE
    FOR UPDATE SKIP LOCKED
),
ranked AS (
    -- A row skipped (locked elsewhere) moves the next ones up: the first n of
    -- those locked start.
    SELECT c.id, c.n, row_number() OVER (PARTITION BY c.key ORDER BY c.rank) AS k
    FROM picked p
    JOIN chosen c ON c.id = p.id
),
reserved AS (
    -- Reserved for this worker: out of every ready index (state), counted by no
    -- limit, with the claim token its run will carry. The worker starts it the
    -- moment a run of its key ends here, and the write that records that end
    -- starts it here too (start_reserved); a worker that stops gives its
    -- reservations back (give_back_reserved), and those of a lost worker are given
    -- back by rescue_reserved.
    UPDATE akadze.jobs j
    SET state = 'reserved', worker_id = %(worker_id)s,
        claim_token = akadze.new_claim_token()
    FROM ranked
    WHERE j.id = ranked.id AND ranked.k > ranked.n
    RETURNING
-- include: job_columns
    , j.state
),
started AS (
    UPDATE akadze.jobs j
-- include: run_start
    FROM ranked
    WHERE j.id = ranked.id AND ranked.k <= ranked.n
    RETURNING
-- include: job_columns
    , j.state
)
SELECT * FROM started
UNION ALL
SELECT * FROM reserved

-- name: start_reserved
-- Start the reserved jobs that began running here when a run of their key ended
-- (in the transaction that writes that run's outcome, after it: the key's
-- running count goes down and up again, under the lock its finish took), each
-- fenced by its reservation: still reserved for this worker, with the token the
-- reservation drew. A reservation given back meanwhile (cancelled, rescued after
-- the worker's lease ran out) is not started: the worker stops that run. The
-- second arm answers a write retried after a commit it did not see: the job was
-- started then (this statement's snapshot shows the rows as they were before it).
WITH asked AS (
    SELECT s.id, s.token
    FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS s(id, token)
),
started AS (
    UPDATE akadze.jobs j
    SET state = 'running',
        run_count = j.run_count + 1,
        attempt = j.attempt + 1,
        started_at = COALESCE(%(now)s::timestamptz, now()),
        limited = j.limited OR (j.limit_key IS NOT NULL AND EXISTS (
            SELECT 1 FROM akadze.limits x WHERE x.key = j.limit_key))
    FROM asked a
    WHERE j.id = a.id AND j.state = 'reserved' AND j.worker_id = %(worker_id)s
      AND j.claim_token = a.token
    RETURNING j.id
)
SELECT s.id FROM started s
UNION ALL
SELECT j.id FROM akadze.jobs j
JOIN asked a ON a.id = j.id
WHERE j.state = 'running' AND j.worker_id = %(worker_id)s AND j.claim_token = a.token

-- name: give_back_reserved
-- A worker's reservations back to the queue (queued as they were: same place,
-- no attempt spent), but those in `keep`: at a stop all of them, after a write
-- that failed those the worker does not know of (it may have committed them).
UPDATE akadze.jobs j
SET state = 'queued', worker_id = NULL, claim_token = NULL
WHERE j.state = 'reserved' AND j.worker_id = %(worker_id)s
  AND NOT (j.id = ANY (%(keep)s::bigint[]))
RETURNING j.id

-- name: rescue_reserved
-- The reservations of workers that have no row any more (rescue_expired deleted
-- it, or the worker ended without giving them back) go back to the queue. The
-- holders are listed by a skip scan of jobs_reserved_worker_idx (one probe per
-- distinct worker), and only the jobs of the missing ones are read, through the
-- same index: in its order (worker_id, id) and bounded, so that the plan is that
-- index's scan whatever the statistics say (a bitmap scan, planned on a table
-- analyzed while empty, would read each holder's whole bitmap first). A worker
-- holds at most as many reservations as it has slots; more than 10 000 are given
-- back over several rounds.
WITH RECURSIVE holders AS (
    (SELECT r.worker_id FROM akadze.jobs AS r
     WHERE r.state = 'reserved' AND r.worker_id IS NOT NULL
     ORDER BY r.worker_id
     LIMIT 1)
    UNION ALL
    SELECT (SELECT r.worker_id FROM akadze.jobs AS r
            WHERE r.state = 'reserved' AND r.worker_id > h.worker_id
            ORDER BY r.worker_id
            LIMIT 1)
    FROM holders AS h
    WHERE h.worker_id IS NOT NULL
), lost AS (
    SELECT r.id
    FROM holders AS h
    CROSS JOIN LATERAL (
        SELECT r.id FROM akadze.jobs AS r
        WHERE r.state = 'reserved' AND r.worker_id = h.worker_id
        ORDER BY r.id
        LIMIT 10000) AS r
    WHERE h.worker_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM akadze.workers AS w WHERE w.id = h.worker_id)
)
UPDATE akadze.jobs j
SET state = 'queued', worker_id = NULL, claim_token = NULL
WHERE j.id = ANY (ARRAY(SELECT l.id FROM lost l)) AND j.state = 'reserved'
RETURNING j.id
