-- akadze schema, version 10: a wake-up when a limited key gets room.
--
-- A claim that a key's max_running held back leaves that key's jobs queued
-- until some claim looks again. The worker whose own outcome write ended a run
-- of the key knows it and claims at once; the other workers of the cluster
-- learn it from this trigger: a run of a limited job that ends (succeeded,
-- failed, cancelled) sends NOTIFY akadze_jobs, '<queue>', the channel and
-- payload every worker of the queue already listens to, so an idle worker
-- claims within milliseconds instead of at its next poll. A run that ends
-- queued again (a retry, a snooze, a give-back, a rescue) is notified by
-- jobs_notify_requeue (migration 0004) already.
--
-- Coalesced: PostgreSQL folds identical notifications of one transaction into
-- one, so an outcome batch of a thousand runs of a hot key (or of many keys of
-- one queue) wakes each worker of the queue once, at commit, and a worker's
-- claim loop takes no more than one look per wake-up (a notification only marks
-- the queue as worth a look; the claim loop debounces them).
--
-- jobs.limited (migration 0005) stays as the claim found it while the job
-- runs: true when the key had a limits row when the job was queued. A job
-- queued before its key got a limit has it false and sends nothing: the poll
-- (poll_interval) still finds the room, as before this version. The WHEN is
-- checked by the executor without a call, so the outcome of a job of no
-- limited key costs nothing more; the function is the one of migration 0004.
CREATE TRIGGER jobs_notify_key_room
    AFTER UPDATE OF state ON akadze.jobs
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND NEW.limited
          AND NEW.state IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION akadze.notify_requeued();
