-- Queries of the reliability suite (akadze bench faults / soak, tests/test_reliability_*).
-- They run only in scratch databases that the suite creates; nothing here is part
-- of the schema migrations. The check of max_running at every commit and the log
-- of every start are the shared watch (watch.sql).

-- name: fault_install
-- What the fault scenarios add to the watch (watch.sql, installed with it):
-- effects, the rows the tasks write inside complete_tx() (one per job, exactly),
-- each naming the run that wrote it by its claim token (run_count can repeat after a
-- crash undid a claim; the token cannot).
CREATE SCHEMA IF NOT EXISTS akadze_fault;
CREATE TABLE IF NOT EXISTS akadze_fault.effects (
    job_id bigint NOT NULL, run_count int NOT NULL, worker text NOT NULL,
    claim_token bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS effects_job_idx ON akadze_fault.effects (job_id);

-- name: fault_record_effect
INSERT INTO akadze_fault.effects (job_id, run_count, worker, claim_token)
VALUES (%(job_id)s, %(run_count)s, %(worker)s, %(claim_token)s);

-- name: fault_sample_running
-- One snapshot: running jobs per limited key, with the key's max_running.
SELECT j.limit_key, count(*), l.max_running
FROM akadze.jobs j JOIN akadze.limits l ON l.key = j.limit_key
WHERE j.state = 'running' AND l.max_running IS NOT NULL
GROUP BY j.limit_key, l.max_running;

-- name: fault_progress
-- Jobs of the workload by phase of life (probe jobs are not part of it).
SELECT count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'cancelled')),
       count(*) FILTER (WHERE state = 'queued'),
       count(*) FILTER (WHERE state = 'running'),
       count(*)
FROM akadze.jobs WHERE task <> 'fault.probe';

-- name: fault_states
SELECT state::text, count(*) FROM akadze.jobs WHERE task <> 'fault.probe' GROUP BY state;

-- name: fault_audit
-- Every promise, checked per job once the run is over (see faults.md):
--   tx jobs: exactly one effect row when succeeded, none otherwise, and that row
--   written by the run that finished the job; plain jobs: the result names the run
--   that finished it. "The run" is its claim token: the job's last claim wrote it and
--   a finish keeps it, so a result or an effect of another token was written by a run
--   after the job was claimed again (a stale finish accepted). run_count would miss
--   the stale finish of a run whose claim a crash undid (the next claim repeats it). attempts spent beyond the first, runs
--   given back (claims that did not spend an attempt), and the recorded causes.
WITH j AS (
    SELECT j.id, j.state, j.run_count, j.attempt, (j.args ->> 'tx')::boolean AS tx,
           j.result ->> 'tok' AS result_token, j.claim_token, j.errors,
           (SELECT count(*) FROM akadze_fault.effects e WHERE e.job_id = j.id) AS effects,
           (SELECT count(*) FROM akadze_fault.effects e
            WHERE e.job_id = j.id AND e.claim_token IS DISTINCT FROM j.claim_token)
               AS stale_effects,
           (SELECT count(*) FROM jsonb_array_elements(j.errors) x
            WHERE x ->> 'error' = 'WorkerLost') AS rescues,
           (SELECT count(*) FROM jsonb_array_elements(j.errors) x
            WHERE x ->> 'message' LIKE 'injected failure%%') AS injected,
           -- entries of spent attempts: a give-back that refunded its attempt is
           -- recorded too ("GivenBack", spent false) but spends nothing
           (SELECT count(*) FROM jsonb_array_elements(j.errors) x
            WHERE NOT (x ->> 'error' = 'GivenBack' AND x ->> 'spent' = 'false'))
               AS error_entries,
           jsonb_array_length(j.errors) AS all_entries
    FROM akadze.jobs j
    WHERE j.task = 'fault.work'
)
SELECT
    count(*) FILTER (WHERE tx AND state = 'succeeded' AND effects <> 1),
    count(*) FILTER (WHERE tx AND state <> 'succeeded' AND effects > 0),
    coalesce(sum(stale_effects), 0),
    count(*) FILTER (WHERE state = 'succeeded' AND NOT tx
                     AND result_token IS DISTINCT FROM claim_token::text),
    coalesce(sum(run_count), 0),
    coalesce(sum(attempt - 1) FILTER (WHERE state <> 'queued'), 0),
    coalesce(sum(run_count - attempt), 0),
    coalesce(sum(rescues), 0),
    coalesce(sum(injected), 0),
    coalesce(sum(error_entries - rescues - injected), 0),
    count(*) FILTER (WHERE all_entries < 20 AND (  -- none dropped (append_error keeps 20)
        (state = 'succeeded' AND attempt - 1 <> error_entries)
        OR (state = 'failed' AND attempt <> error_entries))),
    count(*) FILTER (WHERE run_count > 1 + injected)
FROM j;

-- name: fault_error_kinds
-- The recorded causes of spent attempts other than injected failures and rescues.
SELECT x ->> 'error', left(x ->> 'message', 120), count(*)
FROM akadze.jobs j, jsonb_array_elements(j.errors) x
WHERE j.task = 'fault.work' AND x ->> 'error' <> 'WorkerLost'
  AND x ->> 'message' NOT LIKE 'injected failure%%'
  AND NOT (x ->> 'error' = 'GivenBack' AND x ->> 'spent' = 'false')
GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 10;

-- name: fault_start_violations
-- Windows in which a rate-limited key started more jobs than max_starts: for each
-- start the watch recorded (watch.sql), the starts of its key in the window that
-- ends with it. By the claims' own
-- clock (started_at, what the claim counts with) and by the moment the starts
-- became visible (the commit).
WITH by_clock AS (
    SELECT s.key, s.job_id, s.run_count, l.max_starts, count(*) AS n
    FROM akadze_watch.starts s
    JOIN akadze.limits l ON l.key = s.key AND l.max_starts IS NOT NULL
    JOIN akadze_watch.starts t
      ON t.key = s.key AND t.started_at > s.started_at - l."window"
     AND t.started_at <= s.started_at
    GROUP BY s.key, s.job_id, s.run_count, l.max_starts
    HAVING count(*) > l.max_starts
), by_commit AS (
    SELECT s.key, s.job_id, s.run_count, l.max_starts, count(*) AS n
    FROM akadze_watch.starts s
    JOIN akadze.limits l ON l.key = s.key AND l.max_starts IS NOT NULL
    JOIN akadze_watch.starts t
      ON t.key = s.key AND t.committed_at > s.committed_at - l."window"
     AND t.committed_at <= s.committed_at
    GROUP BY s.key, s.job_id, s.run_count, l.max_starts
    HAVING count(*) > l.max_starts
)
SELECT (SELECT count(*) FROM by_clock), (SELECT coalesce(max(n - max_starts), 0) FROM by_clock),
       (SELECT count(*) FROM by_commit),
       (SELECT coalesce(max(n - max_starts), 0) FROM by_commit);

-- name: fault_start_violation_details
-- The worst window by the claims' clock: its starts, with how late each claim
-- committed after its clock.
WITH worst AS (
    SELECT s.key, s.started_at, count(*) AS n
    FROM akadze_watch.starts s
    JOIN akadze.limits l ON l.key = s.key AND l.max_starts IS NOT NULL
    JOIN akadze_watch.starts t
      ON t.key = s.key AND t.started_at > s.started_at - l."window"
     AND t.started_at <= s.started_at
    GROUP BY s.key, s.started_at, l.max_starts
    HAVING count(*) > l.max_starts
    ORDER BY count(*) - l.max_starts DESC, s.started_at
    LIMIT 1
)
SELECT t.key, t.started_at, t.committed_at - t.started_at AS commit_lag, t.job_id, w.n
FROM worst w
JOIN akadze.limits l ON l.key = w.key
JOIN akadze_watch.starts t
  ON t.key = w.key AND t.started_at > w.started_at - l."window" AND t.started_at <= w.started_at
ORDER BY t.started_at;

-- name: fault_backends
-- The akadze worker connections to this database (claims, outcomes, LISTEN).
SELECT pid, application_name, state
FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'akadze-worker%%'
  AND pid <> pg_backend_pid();

-- name: fault_terminate
SELECT pg_terminate_backend(%(pid)s);

-- name: fault_hold_limits
-- Hold the limits rows of these keys (the claim locks them FOR NO KEY UPDATE).
SELECT key FROM akadze.limits WHERE key = ANY (%(keys)s::text[]) FOR NO KEY UPDATE;

-- name: fault_worker_jobs
-- The running jobs of one worker, and their fencing tokens.
SELECT id, claim_token FROM akadze.jobs
WHERE worker_id = %(worker_id)s AND state = 'running';

-- name: fault_jobs_moved_on
-- How many of these (id, claim_token) runs were replaced: the job is no longer in
-- that run (rescued), and how many were claimed again since (a rescue clears the
-- token, a claim writes a new one; the job may have finished since), by another
-- worker than %(worker_id)s as far as the row still says.
SELECT count(*) FILTER (WHERE j.claim_token IS DISTINCT FROM r.token
                           OR j.state <> 'running'),
       count(*) FILTER (WHERE j.claim_token IS NOT NULL AND j.claim_token <> r.token
                           AND j.worker_id IS DISTINCT FROM %(worker_id)s)
FROM akadze.jobs j
JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS r(id, token) ON r.id = j.id;

-- name: fault_probe_complete
-- The probe claims real jobs of the workload and finishes them as the task would
-- (an effect row for a complete_tx job, the run in the result), fenced.
WITH done AS (
    UPDATE akadze.jobs SET state = 'succeeded', finished_at = now(),
           result = jsonb_build_object('rc', run_count, 'tok', claim_token::text,
                                       'w', 'fault-probe')
    WHERE id = %(id)s AND claim_token = %(claim_token)s AND state = 'running'
    RETURNING id, run_count, claim_token, (args ->> 'tx')::boolean AS tx
)
INSERT INTO akadze_fault.effects (job_id, run_count, worker, claim_token)
SELECT id, run_count, 'fault-probe', claim_token FROM done WHERE tx;

-- name: fault_table_stats
-- Size and dead tuples of the jobs table and its indexes.
SELECT pg_relation_size('akadze.jobs'),
       pg_indexes_size('akadze.jobs'),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       (SELECT count(*) FROM akadze.jobs WHERE state = 'queued')
FROM pg_stat_user_tables s
WHERE s.relid = 'akadze.jobs'::regclass;

-- name: fault_long_snapshot
-- A REPEATABLE READ transaction takes its snapshot at its first statement; while it
-- stays open, vacuum cannot remove the rows that died after it.
SELECT count(*) FROM akadze.jobs;

-- name: soak_stats
-- The jobs table over a soak: sizes (heap, every index, the ready indexes alone),
-- live and dead tuples, autovacuum runs, and the jobs per state.
SELECT pg_relation_size('akadze.jobs'),
       pg_indexes_size('akadze.jobs'),
       pg_relation_size('akadze.jobs_ready_free_idx')
           + pg_relation_size('akadze.jobs_ready_limited_idx'),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       coalesce(s.autovacuum_count, 0) + coalesce(s.vacuum_count, 0),
       (SELECT count(*) FROM akadze.jobs WHERE state IN ('succeeded', 'failed', 'cancelled')),
       (SELECT count(*) FROM akadze.jobs WHERE state = 'queued'),
       (SELECT count(*) FROM akadze.jobs WHERE state = 'running')
FROM pg_stat_user_tables s
WHERE s.relid = 'akadze.jobs'::regclass;

-- name: fault_session_writable
-- The failover scenario's own session stays writable when the server's default
-- turns read-only (a session's SET wins over the configuration file).
SET default_transaction_read_only = off;

-- name: fault_read_only_on
-- The whole server refuses writes (SQLSTATE 25006), as a primary that became a
-- standby does to the clients whose URL still leads there; takes effect at the
-- reload, in every session that did not SET it itself.
ALTER SYSTEM SET default_transaction_read_only = on;

-- name: fault_read_only_off
ALTER SYSTEM RESET default_transaction_read_only;

-- name: fault_reload
SELECT pg_reload_conf();

-- name: fault_workers_registered
-- How many worker processes have registered (their first heartbeat).
SELECT count(*) FROM akadze.workers;
