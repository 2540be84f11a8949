-- The helpers of akadze.testing, for the tests of applications.

-- name: testing_ready_queues
-- The queues that hold queued jobs of the app's tasks: drain works on them too.
SELECT DISTINCT queue FROM akadze.jobs
WHERE state = 'queued' AND task = ANY(%(tasks)s::text[])

-- name: testing_jobs_of_task
-- Every job of a task, in any state, for assert_enqueued (which matches the
-- arguments in Python, to name the jobs it saw when none matches).
SELECT id, queue, state::text, args FROM akadze.jobs
WHERE task = %(task)s
ORDER BY id
