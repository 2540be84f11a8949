-- The watch: the one test-only check of max_running at every claim commit, shared
-- by `akadze bench claims` (its load test), `akadze bench faults` / `soak` and the
-- test suite (tests/test_concurrency_claims.py, tests/test_reliability_*.py).
-- Installed only in scratch and test databases, never by the migrations.

-- name: watch_install
-- A deferred constraint trigger runs at the commit of every transaction that made
-- a job with a limit_key 'running', once per such row, after all the
-- transaction's rows are taken. It first takes one transaction-level advisory
-- lock that every such commit takes and holds it until the commit is done: so the
-- checks (and the commits) of transactions that start keyed jobs are serialised,
-- and when a check gets the lock, the transaction that held it before has
-- committed (PostgreSQL releases locks only once the commit is visible) and is
-- seen by the count, a new statement with a fresh READ COMMITTED snapshot. A key's
-- running count only grows at these commits (completions, which are not
-- serialised, can only lower it), so checking at every one of them sees the
-- largest count the key ever had. The lock is the last one a claim takes and its
-- holder waits for nothing else, so it cannot deadlock.
--
-- Every such start is recorded in akadze_watch.starts: the key, the job and its
-- run, the claim's clock (started_at, what the claim counts start rates with),
-- the commit time, and for a key with max_running the running count at that
-- commit (running > max_running is a violation). The start-rate limits are then
-- checked afterwards, over any window, by the claims' clock or by the commits.
CREATE SCHEMA IF NOT EXISTS akadze_watch;
CREATE TABLE IF NOT EXISTS akadze_watch.starts (
    key text NOT NULL, job_id bigint NOT NULL, run_count int NOT NULL,
    started_at timestamptz, committed_at timestamptz NOT NULL,
    running bigint, max_running int
);
CREATE INDEX IF NOT EXISTS starts_key_idx ON akadze_watch.starts (key, started_at);
CREATE OR REPLACE FUNCTION akadze_watch.check_start() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    allowed int;
    running bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(7164829377);
    SELECT l.max_running INTO allowed FROM akadze.limits l WHERE l.key = NEW.limit_key;
    IF allowed IS NOT NULL THEN
        SELECT count(*) INTO running
        FROM akadze.jobs j WHERE j.state = 'running' AND j.limit_key = NEW.limit_key;
    END IF;
    INSERT INTO akadze_watch.starts (key, job_id, run_count, started_at, committed_at,
                                     running, max_running)
    VALUES (NEW.limit_key, NEW.id, NEW.run_count, NEW.started_at, clock_timestamp(),
            running, allowed);
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS akadze_watch_start ON akadze.jobs;
CREATE CONSTRAINT TRIGGER akadze_watch_start
    AFTER UPDATE ON akadze.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.state = 'running' AND OLD.state <> 'running' AND NEW.limit_key IS NOT NULL)
    EXECUTE FUNCTION akadze_watch.check_start();

-- name: watch_remove
DROP TRIGGER IF EXISTS akadze_watch_start ON akadze.jobs;
DROP SCHEMA IF EXISTS akadze_watch CASCADE;

-- name: watch_violations
-- Commits after which a key was over max_running: how many, over how many keys,
-- and by how much at most (0 when none).
SELECT count(*), count(DISTINCT key), coalesce(max(running - max_running), 0)
FROM akadze_watch.starts
WHERE running > max_running;

-- name: watch_violation_details
-- The first few of them.
SELECT key, running, max_running, job_id, committed_at
FROM akadze_watch.starts
WHERE running > max_running
ORDER BY committed_at
LIMIT 5;

-- name: watch_running_peaks
-- The largest running count each key with max_running had at a commit.
SELECT key, max(running)
FROM akadze_watch.starts
WHERE max_running IS NOT NULL
GROUP BY key;
