-- akadze schema, version 4: the wake-up on UPDATE is a row trigger that fires
-- only for the rows that become queued.
--
-- Version 3's statement-level trigger ran for every UPDATE of akadze.jobs,
-- whatever it changed and even when it changed no row, and made PostgreSQL
-- keep both transition tables of every update. It cost about 0.1-0.15 ms of
-- server time per statement (EXPLAIN ANALYZE with auto_explain.log_triggers)
-- twice per claim (the cancel sweep and the take) and once per batch of
-- outcomes, only to find that no row had become queued.
--
-- A row trigger's WHEN is checked by the executor, per row, without calling
-- anything: an update in which no row becomes queued costs nothing more, and
-- one that requeues rows (a retry, a rescue, a requeue) calls the function
-- once per such row. PostgreSQL folds identical notifications of a transaction
-- into one, so a bulk requeue still wakes each queue's workers once, at
-- commit. Inserts keep their statement trigger: a bulk enqueue is one call.
DROP TRIGGER jobs_notify_update ON akadze.jobs;
DROP FUNCTION akadze.notify_queued_update();

CREATE FUNCTION akadze.notify_requeued() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('akadze_jobs', NEW.queue);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_requeue
    AFTER UPDATE OF state ON akadze.jobs
    FOR EACH ROW
    WHEN (NEW.state = 'queued' AND OLD.state <> 'queued')
    EXECUTE FUNCTION akadze.notify_requeued();
