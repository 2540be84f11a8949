-- Queries of periodic schedules (akadze.schedules). A fire is identified by the
-- schedule's name and the instant it is due (fire_at); the primary key of
-- akadze.periodic_fires on the pair is what makes a fire enqueue exactly once.

-- name: periodic_recorded
-- Which of the candidate fires (one per schedule) are recorded already: lets a
-- worker skip them without opening a transaction per schedule on every tick.
SELECT f.schedule, f.fire_at
FROM akadze.periodic_fires AS f
JOIN unnest(%(names)s::text[], %(fires)s::timestamptz[]) AS c(schedule, fire_at)
  ON f.schedule = c.schedule AND f.fire_at = c.fire_at;

-- name: periodic_lock
-- overlap=False: one decision at a time per schedule (released at commit). Taken
-- before the fire row is inserted, in every transaction that takes it, so two
-- deciders never wait on each other in opposite orders.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: periodic_record_fire
-- Claim the fire. A concurrent inserter of the same (schedule, fire_at) waits for
-- this transaction: if it commits, the other gets no row back and enqueues
-- nothing; if it rolls back (the enqueue failed), the other takes over.
INSERT INTO akadze.periodic_fires (schedule, fire_at)
VALUES (%(schedule)s, %(fire_at)s)
ON CONFLICT (schedule, fire_at) DO NOTHING
RETURNING fire_at;

-- name: periodic_previous_active
-- overlap=False: is the job of the schedule's previous enqueued fire still queued
-- or running? Walks the primary key backwards from this fire, past skipped fires
-- (job_id NULL), to the first one that has a job; a pruned job counts as done.
SELECT 1
FROM (
    SELECT f.job_id
    FROM akadze.periodic_fires AS f
    WHERE f.schedule = %(schedule)s AND f.fire_at < %(fire_at)s AND f.job_id IS NOT NULL
    ORDER BY f.fire_at DESC
    LIMIT 1
) AS previous
JOIN akadze.jobs AS j ON j.id = previous.job_id
WHERE j.state IN ('queued', 'running');

-- name: periodic_set_job
UPDATE akadze.periodic_fires SET job_id = %(job_id)s
WHERE schedule = %(schedule)s AND fire_at = %(fire_at)s;
