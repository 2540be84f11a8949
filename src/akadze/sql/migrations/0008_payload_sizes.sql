-- akadze schema, version 8: the sizes of a job's arguments and result are bounded by
-- the schema, whatever writes the row (issue 21, finding 6).
--
-- akadze checks sizes at enqueue (Akadze(max_args_bytes=...), 1 MiB by default, at
-- most 8 MiB of compact JSON); these constraints are the ceiling for every other
-- writer: an application's own INSERT, another tool, a hand-written UPDATE. Without
-- it a single row of 100 MB of arguments was accepted, and every list of its queue
-- read it.
--
-- pg_column_size is the size of the value as stored: on an INSERT or UPDATE that
-- writes the column, the whole jsonb value (constraints are checked before the
-- value is compressed or moved out of line); for an unchanged column, its stored,
-- possibly compressed, size, read from the TOAST pointer without fetching the value.
-- So the check costs next to nothing on the claim's and the outcome's updates,
-- where octet_length(args::text) would render every job's arguments as text at
-- every update. 64 MiB is well above anything akadze accepts at enqueue (jsonb takes
-- at most about six times the compact JSON text) and well under jsonb's own limit of
-- 256 MiB.
--
-- On a large table a CHECK is added NOT VALID (no scan, so the ACCESS EXCLUSIVE lock
-- of ALTER TABLE is held for milliseconds) and validated after the migrations have
-- committed (below the marker, see akadze.migrate): VALIDATE CONSTRAINT scans the
-- table under SHARE UPDATE EXCLUSIVE, which lets enqueues, claims and outcomes go on.
-- New rows are checked from the moment the constraint exists. Should an old row be
-- over the ceiling, the validation fails and `akadze migrate` says so (the migration
-- stays applied, the constraint checks new rows, and the next `akadze migrate`
-- validates again); find such rows with
--   SELECT id FROM akadze.jobs
--   WHERE pg_column_size(args) > 67108864 OR pg_column_size(result) > 67108864;
ALTER TABLE akadze.jobs
    ADD CONSTRAINT jobs_args_size CHECK (pg_column_size(args) <= 67108864) NOT VALID,
    -- a NULL result (no result yet) passes: the check is NULL, not false
    ADD CONSTRAINT jobs_result_size CHECK (pg_column_size(result) <= 67108864) NOT VALID;

-- akadze: after commit
ALTER TABLE akadze.jobs VALIDATE CONSTRAINT jobs_args_size;
ALTER TABLE akadze.jobs VALIDATE CONSTRAINT jobs_result_size;
