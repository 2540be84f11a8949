-- akadze schema, version 7: a claim token that no crash or failover can hand out twice.
--
-- Outcomes used to be fenced on (id, run_count, state = 'running'). A claim commits
-- asynchronously by default (synchronous_commit off on the claim connections), so a
-- server crash, or a failover to an asynchronous standby, can undo a claim the worker
-- has already started; the next claim then gives the job the same run_count again, and
-- the superseded run's outcome passes the live run's fence.
--
-- Each claim now writes a fresh random token per job (akadze.new_claim_token()), and
-- every fenced write matches on it. A random 62-bit value drawn from the server's
-- strong random source (gen_random_uuid(), core since PostgreSQL 13) cannot come back
-- after the crash the way a counter can: a sequence hands out again the values whose
-- WAL was lost, and run_count is recomputed from the undone row.
--
-- NULL: a job claimed before this migration (or never claimed). Runs already going at
-- the upgrade carry no token and are still fenced by run_count (worker.sql).
--
-- A nullable column without a default: no table rewrite, only a catalog change.
ALTER TABLE akadze.jobs ADD COLUMN claim_token bigint;

-- The last 16 hex digits of a version-4 uuid: 62 random bits (2 are the variant).
-- VOLATILE: a new value for every row a claim takes.
CREATE FUNCTION akadze.new_claim_token() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT ('x' || right(replace(gen_random_uuid()::text, '-', ''), 16))::bit(64)::bigint
$$;
