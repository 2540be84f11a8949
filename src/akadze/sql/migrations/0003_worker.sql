-- akadze schema, version 3: what the worker runtime needs.
--
-- 1. Wake-up: a statement-level trigger sends NOTIFY akadze_jobs, <queue> once per
--    queue whose rows became 'queued' in the statement (an insert, a retry, a
--    rescue, a requeue). NOTIFY is delivered at commit, so an idle worker claims
--    the job as soon as it is visible, and a rolled-back enqueue wakes nobody.
-- 2. akadze.append_error(): the bounded append to a job's errors array that the
--    outcome writer, the rescue and cancellation share.

-- The trigger runs once per statement, whatever the number of rows (a bulk
-- enqueue of 100 000 jobs sends one notification per queue), and PostgreSQL
-- folds identical notifications of one transaction into one.
CREATE FUNCTION akadze.notify_queued_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_rows AS n WHERE n.state = 'queued' LOOP
        PERFORM pg_notify('akadze_jobs', q);
    END LOOP;
    RETURN NULL;
END
$$;

-- Updates: only rows that *became* queued count. The common updates (a claim
-- moving hundreds of rows to 'running', outcomes moving them to 'succeeded')
-- leave no queued row behind and return after one pass over new_rows, before
-- any join. The join of the two transition tables has no statistics; a nested
-- loop over them would be quadratic on a large update, so it is ruled out for
-- the function's duration.
CREATE FUNCTION akadze.notify_queued_update() RETURNS trigger
LANGUAGE plpgsql
SET enable_nestloop = off
AS $$
DECLARE
    q text;
BEGIN
    PERFORM 1 FROM new_rows AS n WHERE n.state = 'queued' LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    FOR q IN
        SELECT DISTINCT n.queue
        FROM new_rows AS n
        JOIN old_rows AS o ON o.id = n.id
        WHERE n.state = 'queued' AND o.state <> 'queued'
    LOOP
        PERFORM pg_notify('akadze_jobs', q);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_insert
    AFTER INSERT ON akadze.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION akadze.notify_queued_insert();

CREATE TRIGGER jobs_notify_update
    AFTER UPDATE ON akadze.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION akadze.notify_queued_update();

-- errors || entry, keeping the last 20 entries (a job retried a million times
-- must not grow a million-entry array). A NULL entry leaves errors unchanged,
-- which lets one batched UPDATE mix rows with and without an error.
CREATE FUNCTION akadze.append_error(errors jsonb, entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN entry IS NULL THEN errors
        WHEN jsonb_array_length(errors) < 20 THEN errors || jsonb_build_array(entry)
        ELSE (
            SELECT jsonb_agg(t.e ORDER BY t.n)
            FROM jsonb_array_elements(errors || jsonb_build_array(entry))
                 WITH ORDINALITY AS t(e, n)
            WHERE t.n > jsonb_array_length(errors) + 1 - 20
        )
    END
$$;
