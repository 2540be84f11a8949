-- akadze schema, version 20: the running jobs of a worker are indexed only where
-- a worker is named, so that nothing else can read them by that index.
--
-- jobs_running_worker_idx (worker_id) and jobs_running_key_idx (limit_key,
-- queue) had the same predicate, state = 'running'. A count of one key's running
-- jobs (the claims' and the hand-offs' judgement of a key's room) could be
-- planned on either, and with statistics taken once a drain had ended (as
-- autovacuum takes them: every job finished, none running, both indexes
-- estimated empty) the planner took the smaller one, the worker index, with the
-- key as a filter: every running job of the cluster read for each key counted.
-- A hand-off of 20 keys among 4 000 running jobs read 460 000 index entries
-- (tests/test_claim_plans.py); a drain of 200 keys on two workers spent 2.5
-- times the server's CPU a job it spends on the plan intended.
--
-- With "worker_id IS NOT NULL" in its predicate, the worker index serves only
-- statements that name a worker (worker_id = ..., worker_id > ...: a strict
-- comparison implies it); a count by key names none and has one index left,
-- its own. The running jobs without a worker (never registered: rescue takes
-- them as orphans once they started orphan_grace ago) get an index of their
-- own, by start, normally empty.
DROP INDEX akadze.jobs_running_worker_idx;

CREATE INDEX jobs_running_worker_idx ON akadze.jobs (worker_id)
    WHERE state = 'running' AND worker_id IS NOT NULL;

CREATE INDEX jobs_running_orphan_idx ON akadze.jobs (started_at)
    WHERE state = 'running' AND worker_id IS NULL;
