-- The job row, defined once: the columns of akadze.jobs that code reads as a job,
-- spliced in (-- include:) by every query that returns one. Each query names its
-- jobs row `j`. Code reads these rows by column name (psycopg row factories), never
-- by position: akadze.jobs.job_rows / job_state_rows into a ClaimedJob (whose
-- fields are these columns), akadze.overview into a JobSummary.

-- fragment: job_columns
-- A ClaimedJob: what the claim, rescue, cancel and requeue return. run_count is
-- the fencing token of the run. Queries that also need the job's state add
-- ", j.state" on the line after the include.
j.id, j.queue, j.task, j.args, j.priority, j.run_at, j.limit_key, j.run_count,
j.attempt, j.max_attempts, j.meta, j.unique_key, j.expires_at, j.worker_id,
j.started_at

-- fragment: job_summary_columns
-- A JobSummary: the job as stored, for get_job and list_jobs.
j.id, j.queue, j.task, j.state, j.priority, j.attempt, j.max_attempts, j.run_count,
j.run_at, j.created_at, j.started_at, j.finished_at, j.limit_key, j.unique_key, j.meta,
j.args, j.errors, j.result, j.worker_id, j.cancel_requested, j.expires_at
