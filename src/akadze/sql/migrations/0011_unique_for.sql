-- akadze schema, version 11: uniqueness over time (issue 18).
--
-- Until now a unique_key was unique among queued and running jobs through a partial
-- unique index. Uniqueness over time asks more than an index can say: a key is also
-- held by the jobs that finished within the enqueue's unique_for, and under
-- on_duplicate="replace" a running holder must not block a new queued job, while a
-- job that is retried goes back from running to queued beside it (the index would
-- then refuse the worker's own outcome write). So the rule moves into the enqueue
-- (akadze.uniqueness): it locks each key for the rest of its transaction
-- (pg_advisory_xact_lock on the key's hash), reads the holders on a fresh snapshot,
-- and decides; two enqueues of one key are decided one after the other. Requeue takes
-- the same lock.
--
-- The holders are found on a plain index of the rows that carry a key (most carry
-- none, so it costs the enqueues and outcomes of those nothing), with finished_at for
-- the period: NULL (not finished) and the recent ones are two ranges of it.
--
-- Note for a large table: CREATE INDEX here reads the rows with a key while writes
-- wait; on a table of many millions of keyed jobs, build it first with
--   CREATE INDEX CONCURRENTLY jobs_unique_key_idx ON akadze.jobs (unique_key, finished_at)
--   WHERE unique_key IS NOT NULL;
-- and the IF NOT EXISTS below finds it.
CREATE INDEX IF NOT EXISTS jobs_unique_key_idx ON akadze.jobs (unique_key, finished_at)
    WHERE unique_key IS NOT NULL;
DROP INDEX akadze.jobs_active_unique_idx;
