-- akadze schema, version 13: a child's release is counted on its edges, not on a
-- counter in its row; a parent deleted before it finished counts as cancelled.
--
-- Before (0012), each parent's terminal write decremented the child's waiting_for:
-- a fan-in of 10 000 parents rewrote its one jobs row 10 000 times (10 000 dead
-- versions of a wide row with a dozen indexes, and every parent's outcome
-- transaction queued on that row's lock until it committed). Now a parent's
-- terminal write marks its own edges done (one small row per edge, each written
-- once), takes the child's row lock without writing the row, and asks the partial
-- index below whether any edge of the child is still pending. The child's row is
-- written once: when it is released or cancelled.
ALTER TABLE akadze.jobs DROP COLUMN waiting_for;

-- The edges not yet done, by child: "is anything left?" is the first entry of the
-- child's range. Keyed on (child_id, parent_id), unique, so that btree keeps no
-- posting lists: an edge marked done leaves an entry to a dead version that the
-- first scan to meet it marks killed, and later probes step over it in the page.
CREATE INDEX job_dependencies_pending_idx ON akadze.job_dependencies (child_id, parent_id)
    WHERE NOT done;

-- A parent is no longer a foreign key of its edges: deleting a parent (by hand, or
-- a tool's DELETE) must settle its waiting children before the edges go, and a
-- cascade would delete them first. The trigger jobs_deleted below deletes them; the
-- enqueue locks every parent it names (parents_lock), so no edge to a deleted job
-- is written. A child's edges still go with the child (job_dependencies_child_id_fkey).
ALTER TABLE akadze.job_dependencies DROP CONSTRAINT job_dependencies_parent_id_fkey;

-- The children of one parent, settled by its end: parent_state is the state it
-- ended in ('succeeded', 'failed', 'cancelled') or 'deleted'.
--
-- Exactly once under concurrent parents: (1) the parent's edges are marked done;
-- (2) its waiting children are locked, in id order (FOR NO KEY UPDATE, the lock the
-- release's UPDATE takes anyway: a lock, no new row version); (3) a new statement, so a new snapshot (READ COMMITTED: each statement of
-- a volatile function takes one), releases a child none of whose edges is pending.
-- Two parents of one child finishing at once both do (1); the one that locks second
-- waits in (2) for the first to commit, and its (3) sees the first's edge done: the
-- second releases, the first did not (it saw the second's edge pending). A REPEATABLE
-- READ transaction keeps its first snapshot, so (3) could miss the other's edge and
-- neither would release: it is refused. SERIALIZABLE is safe (the read of each
-- other's edges is a conflict that fails one of the two, to be retried).
--
-- A child whose policy is "cancel" (the default) is cancelled by a parent that did
-- not succeed, with an error entry naming it; that update is itself a terminal write
-- (the trigger jobs_finished), so the cancellation runs down the subtree.
--
-- Planned once per session: the statements are planned generic (a custom plan for
-- each call, which PostgreSQL kept choosing for the arrays, cost more than the three
-- statements themselves), with sequential scans off: the statistics of a big fan-in
-- say that every edge is the child's and not done (n_distinct 1), so the planner would
-- read the pending test as "the first row of a sequential scan", which walks every
-- edge done since the last vacuum; only the partial index answers it from the
-- child's range.
CREATE FUNCTION akadze.settle_children(parent bigint, parent_state text, at timestamptz)
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    kids bigint[];
    anyway boolean[];
BEGIN
    WITH settled AS (
        UPDATE akadze.job_dependencies AS d
        SET done = true
        WHERE d.parent_id = parent AND NOT d.done
        RETURNING d.child_id, d.run_anyway
    )
    SELECT array_agg(s.child_id ORDER BY s.child_id),
           array_agg(s.run_anyway ORDER BY s.child_id)
    INTO kids, anyway
    FROM settled AS s;
    IF kids IS NULL THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') = 'repeatable read' THEN
        RAISE EXCEPTION 'akadze: job % has waiting children: its end must be written in a READ COMMITTED (or SERIALIZABLE) transaction, not REPEATABLE READ', parent
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    PERFORM 1 FROM akadze.jobs AS c
    WHERE c.id = ANY (kids) AND c.state = 'waiting'
    ORDER BY c.id
    FOR NO KEY UPDATE;
    UPDATE akadze.jobs AS c
    SET state = CASE WHEN x.cancels THEN 'cancelled'::akadze.job_state
                     ELSE 'queued'::akadze.job_state END,
        finished_at = CASE WHEN x.cancels THEN at ELSE c.finished_at END,
        errors = CASE WHEN NOT x.cancels THEN c.errors
            WHEN parent_state = 'deleted' THEN akadze.append_error(c.errors, jsonb_build_object(
                'attempt', c.attempt, 'at', at, 'error', 'ParentDeleted', 'parent', parent,
                'message', format('cancelled: parent job %s was deleted before it finished',
                                  parent)))
            ELSE akadze.append_error(c.errors, jsonb_build_object(
                'attempt', c.attempt, 'at', at, 'error', 'ParentFailed', 'parent', parent,
                'message', format('cancelled: parent job %s %s', parent, parent_state)))
            END
    FROM (SELECT k.child_id, parent_state <> 'succeeded' AND NOT k.run_anyway AS cancels
          FROM unnest(kids, anyway) AS k(child_id, run_anyway)) AS x
    WHERE c.id = x.child_id AND c.state = 'waiting'
      AND (x.cancels OR (
          -- "No edge pending", read from the child's highest parent down: parents
          -- mostly end in id order (the claim's), so the edges done, whose index
          -- entries lead to dead versions (those of this very transaction, a batch of
          -- outcomes, cannot even be marked killed yet), are at the low end, and a
          -- child still waiting is answered by its first entry. A scalar subquery,
          -- not EXISTS: PostgreSQL drops the ORDER BY and LIMIT of an EXISTS.
          SELECT p.parent_id FROM akadze.job_dependencies AS p
          WHERE p.child_id = c.id AND NOT p.done
          ORDER BY p.child_id DESC, p.parent_id DESC
          LIMIT 1) IS NULL);
END
$$;

-- The terminal write of a job that has children or is awaited (migration 0012's
-- trigger, unchanged): whatever wrote it, in the same transaction.
CREATE OR REPLACE FUNCTION akadze.job_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.awaited THEN
        PERFORM pg_notify('akadze_done', NEW.id::text);
    END IF;
    IF NEW.dependents THEN
        PERFORM akadze.settle_children(NEW.id, NEW.state::text,
                                       coalesce(NEW.finished_at, now()));
    END IF;
    RETURN NULL;
END
$$;

-- A parent deleted (DELETE FROM akadze.jobs, whatever tool) before it finished counts
-- as cancelled: its "cancel" children are cancelled with a ParentDeleted entry, its
-- "run" children count it as done. An AFTER trigger: the rows the statement deletes
-- are gone by then (a child deleted with its parent is not updated; a BEFORE trigger
-- that updated a row the same DELETE then reached would make it fail). Then the
-- parent's edges are deleted. Jobs that are nobody's parent (dependents false, and
-- retention's finished jobs are mostly that) do not fire it.
CREATE FUNCTION akadze.job_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state NOT IN ('succeeded', 'failed', 'cancelled') THEN
        PERFORM akadze.settle_children(OLD.id, 'deleted', now());
    END IF;
    DELETE FROM akadze.job_dependencies AS d WHERE d.parent_id = OLD.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_deleted
    AFTER DELETE ON akadze.jobs
    FOR EACH ROW
    WHEN (OLD.dependents)
    EXECUTE FUNCTION akadze.job_deleted();
