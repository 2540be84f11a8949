-- akadze schema, version 22: reserved jobs, the next job of a limited key held for
-- the slot that will free first.
--
-- A key at its max_running gets room only when one of its runs ends. Until this
-- version the slot it left waited for the write of that run's outcome, whose
-- transaction started the key's next job (a hand-off): 5-15 ms on a busy
-- worker, during which the key ran below its limit. Now that write also reserves
-- the key's next job for the worker (state 'reserved': in no ready index, counted
-- by no limit), which starts it the moment the next run of the key ends there;
-- the write after starts it in the database, under the lock its finish takes.
--
-- The value is added in the migrations' transaction and used only after it
-- commits (PostgreSQL refuses a new enum value in the transaction that added it):
-- the index that finds a worker's reservations is built after commit.
ALTER TYPE akadze.job_state ADD VALUE IF NOT EXISTS 'reserved' AFTER 'queued';

-- akadze: after commit
-- A worker's reservations: given back at its stop, and rescued (rescue_reserved)
-- once its row is gone. Under a lock of its own: two `migrate` runs at once both
-- run the after-commit parts, and two CREATE INDEX IF NOT EXISTS at once both
-- create (the second fails on the catalog's unique name).
DO $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('akadze.migration.0022'));
    CREATE INDEX IF NOT EXISTS jobs_reserved_worker_idx ON akadze.jobs (worker_id, id)
        WHERE state = 'reserved';
END
$$;
