-- Claim support, version 2.
--
-- A claim moves due queued jobs that are cancel-requested or expired to
-- 'cancelled' instead of running them. Both claims (the full-ranking oracle and
-- the windowed claim) find those rows through the two small partial indexes
-- below, so that the sweep costs a couple of index probes whatever the size of
-- the queue: a row enters them only when a cancel was requested or the job
-- carries an expiry, and leaves them when it stops being queued.
CREATE INDEX jobs_queued_cancel_idx ON akadze.jobs (queue, run_at)
    WHERE state = 'queued' AND cancel_requested;

CREATE INDEX jobs_queued_expiry_idx ON akadze.jobs (queue, expires_at)
    WHERE state = 'queued' AND expires_at IS NOT NULL;
