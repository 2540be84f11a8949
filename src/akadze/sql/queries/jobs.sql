-- The job row, defined once: the columns of akadze.jobs that code reads as a job,
-- spliced in (-- include:) by every query that returns one. Each query names its
-- jobs row `j`. Code reads these rows by column name (psycopg row factories), never
-- by position: akadze.jobs.job_rows / job_state_rows into a ClaimedJob (whose
-- fields are these columns), akadze.overview into a JobSummary (whole, or listed).

-- fragment: job_columns
-- A ClaimedJob: what the claim, rescue, cancel and requeue return. claim_token is
-- the fencing token of the run (random per claim, migration 0007); run_count counts
-- runs. Queries that also need the job's state add ", j.state" on the line after
-- the include.
-- args and meta come as text (the same bytes jsonb's output sends anyway) and are
-- decoded per row by job_rows, which survives what it cannot read: a row written by
-- another tool with args nested 5 000 deep made psycopg's jsonb loader raise
-- RecursionError inside the claim, so every claim of its queue failed. Now only
-- that job fails (InvalidArguments), at its run.
j.id, j.queue, j.task, j.args::text AS args, j.priority, j.run_at, j.limit_key,
j.run_count, j.attempt, j.max_attempts, j.meta::text AS meta, j.unique_key,
j.expires_at, j.worker_id, j.started_at, j.claim_token

-- fragment: run_start
-- The change that starts a run of a job (claim_take, and hand_off_take, whose
-- transaction has no claim_now: it takes now()). The SET list of an UPDATE of
-- akadze.jobs j.
SET state = 'running',
    run_count = j.run_count + 1,
    -- the run's fencing token: random, so that a crash or a failover that undid
    -- this commit cannot make the next claim hand out the same one (0007)
    claim_token = akadze.new_claim_token(),
    attempt = j.attempt + 1,
    worker_id = %(worker_id)s,
    started_at = COALESCE(%(now)s::timestamptz,
                          nullif(current_setting('akadze.claim_now', true), '')::timestamptz,
                          now()),
    -- a running job of a key with a limits row is flagged, so that the row's
    -- count (limits.running, migration 0017) counts it; one probe of
    -- limits_pkey for a keyed job that was queued unflagged, none otherwise
    limited = j.limited OR (j.limit_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM akadze.limits x WHERE x.key = j.limit_key))

-- fragment: job_summary_columns
-- A JobSummary, read by name: the job as stored but the three columns that can be
-- large (args, result and errors: megabytes each, up to the ceilings of migration
-- 0008; errors holds up to 20 entries with tracebacks). get_job adds them
-- (job_details_columns); list_jobs, which reads up to 10 000 jobs, adds the summary of
-- the errors instead (job_errors_summary): one row of 100 MB of arguments took
-- `akadze jobs list` to 540 MB. A column not named is not fetched from TOAST.
j.id, j.queue, j.task, j.state, j.priority, j.attempt, j.max_attempts, j.run_count,
-- meta (and args, errors, result and the last error below) come as text, decoded per
-- row by akadze.overview, for the reason given at job_columns: one row nested past
-- Python's recursion limit made get_job, `akadze jobs show`, the lists and the
-- dashboard raise RecursionError; now that row is shown, marked unreadable.
j.run_at, j.created_at, j.started_at, j.finished_at, j.limit_key, j.unique_key,
j.meta::text AS meta, j.worker_id, j.cancel_requested, j.expires_at, j.progress, j.progress_message,
j.progress_at,
-- How many parents a waiting job still waits for: its pending edges, on the partial
-- index of migration 0013 (no counter is kept in the row).
CASE WHEN j.state = 'waiting' THEN
    (SELECT count(*) FROM akadze.job_dependencies AS d WHERE d.child_id = j.id AND NOT d.done)
    ELSE 0 END AS waiting_for,
-- The job's place in a workflow (migration 0012): the ids of its parents and of its
-- children, at most 1 000 of each, oldest first (job_dependencies is indexed both
-- ways), and how many there are. A job that is nobody's parent (dependents false)
-- does not probe for children.
ARRAY(SELECT d.parent_id FROM akadze.job_dependencies AS d WHERE d.child_id = j.id
      ORDER BY d.parent_id LIMIT 1000) AS parents,
(SELECT count(*) FROM akadze.job_dependencies AS d WHERE d.child_id = j.id)
    AS parent_count,
CASE WHEN j.dependents THEN
    ARRAY(SELECT d.child_id FROM akadze.job_dependencies AS d WHERE d.parent_id = j.id
          ORDER BY d.child_id LIMIT 1000) ELSE '{}'::bigint[] END AS children,
CASE WHEN j.dependents THEN
    (SELECT count(*) FROM akadze.job_dependencies AS d WHERE d.parent_id = j.id)
    ELSE 0 END AS child_count

-- fragment: job_details_columns
j.args::text AS args, j.errors::text AS errors, j.result::text AS result

-- fragment: job_errors_summary
-- The count of a job's errors and the last one without its traceback. The CASEs keep
-- a row whose errors someone wrote as anything but an array of objects from failing
-- the whole list.
CASE WHEN jsonb_typeof(j.errors -> -1) = 'object'
     THEN ((j.errors -> -1) - 'traceback')::text END AS last_error,
CASE WHEN jsonb_typeof(j.errors) = 'array'
     THEN jsonb_array_length(j.errors) ELSE 0 END AS error_count
