-- akadze schema, version 12: workflows (jobs that wait for other jobs), awaited
-- results and progress (issue 18).
--
-- A job enqueued with after=[...] waits in a state of its own, 'waiting', until its
-- parents are done. Every index the claim reads is partial on state = 'queued' (the
-- ready indexes, migration 0002), so a waiting job is in none of them: a million
-- waiting jobs cost the claim nothing, and the claim's SQL never names the state.
--
-- ALTER TYPE ... ADD VALUE may run inside the migrations' transaction, but the new
-- value cannot be used before that transaction commits: nothing below names
-- 'waiting' outside a function body (PL/pgSQL bodies are planned at their first call,
-- after the commit), and no index predicate or trigger WHEN mentions it.
ALTER TYPE akadze.job_state ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'queued';

-- dependents: the job has children (set by the enqueue that names it in after=);
-- awaited: someone waits for its outcome (wait_for). Both only widen the WHEN of the
-- trigger below, so that a job with neither pays nothing at its terminal write.
-- waiting_for: how many of a waiting job's parents are not yet done.
-- progress: what the running task last reported (current().progress), at most once
-- a second per job.
ALTER TABLE akadze.jobs
    ADD COLUMN dependents boolean NOT NULL DEFAULT false,
    ADD COLUMN awaited boolean NOT NULL DEFAULT false,
    ADD COLUMN waiting_for integer NOT NULL DEFAULT 0,
    ADD COLUMN progress double precision,
    ADD COLUMN progress_message text,
    ADD COLUMN progress_at timestamptz;

-- One row per edge of the graph. done: the parent's terminal write has counted this
-- edge (once: a parent requeued and finished again counts nothing twice). run_anyway:
-- the child's after_policy is "run" (a failed or cancelled parent counts as done).
-- Indexed both ways: the children of a parent (its terminal write), the parents of a
-- child (parent_results, jobs show). Deleting a job deletes its edges.
CREATE TABLE akadze.job_dependencies (
    child_id   bigint  NOT NULL REFERENCES akadze.jobs (id) ON DELETE CASCADE,
    parent_id  bigint  NOT NULL REFERENCES akadze.jobs (id) ON DELETE CASCADE,
    run_anyway boolean NOT NULL DEFAULT false,
    done       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (child_id, parent_id),
    CHECK (child_id <> parent_id)
);
CREATE INDEX job_dependencies_parent_idx ON akadze.job_dependencies (parent_id);

-- The terminal write of a job that has children or is awaited, whatever wrote it (a
-- worker's batched and fenced outcome, complete_tx, a rescue, a cancel, an expiry):
-- in the same transaction, so that a child is released (or cancelled) exactly when
-- that write commits, and never when it rolls back. No poller, no worker change.
--
-- Each child's counter is decremented under its row lock: two parents finishing at
-- once in two transactions are counted one after the other, and the second sees the
-- first's decrement (READ COMMITTED re-reads the locked row), so the last parent
-- releases the child exactly once. A child whose policy is "cancel" (the default) is
-- cancelled by a failed or cancelled parent, with an error entry naming it; that
-- update is itself a terminal write, so the cancellation runs down the subtree.
CREATE FUNCTION akadze.job_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.awaited THEN
        PERFORM pg_notify('akadze_done', NEW.id::text);
    END IF;
    IF NEW.dependents THEN
        WITH settled AS (
            UPDATE akadze.job_dependencies AS d
            SET done = true
            WHERE d.parent_id = NEW.id AND NOT d.done
            RETURNING d.child_id, d.run_anyway
        )
        UPDATE akadze.jobs AS c
        SET waiting_for = c.waiting_for - 1,
            state = CASE
                WHEN NEW.state <> 'succeeded' AND NOT s.run_anyway
                    THEN 'cancelled'::akadze.job_state
                WHEN c.waiting_for <= 1 THEN 'queued'::akadze.job_state
                ELSE c.state END,
            finished_at = CASE WHEN NEW.state <> 'succeeded' AND NOT s.run_anyway
                               THEN coalesce(NEW.finished_at, now()) ELSE c.finished_at END,
            errors = CASE WHEN NEW.state <> 'succeeded' AND NOT s.run_anyway
                THEN akadze.append_error(c.errors, jsonb_build_object(
                    'attempt', c.attempt, 'at', coalesce(NEW.finished_at, now()),
                    'error', 'ParentFailed', 'parent', NEW.id,
                    'message', format('cancelled: parent job %s %s', NEW.id, NEW.state)))
                ELSE c.errors END
        FROM settled AS s
        WHERE c.id = s.child_id AND c.state = 'waiting';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_finished
    AFTER UPDATE OF state ON akadze.jobs
    FOR EACH ROW
    WHEN ((NEW.dependents OR NEW.awaited)
          AND NEW.state IN ('succeeded', 'failed', 'cancelled')
          AND OLD.state NOT IN ('succeeded', 'failed', 'cancelled'))
    EXECUTE FUNCTION akadze.job_finished();
