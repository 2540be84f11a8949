-- akadze schema, version 9: workers record the names of the tasks they run.
--
-- A claim takes only jobs of the tasks its worker runs, so a job whose task no live
-- worker of its queue runs is passed over by every claim and would wait in silence.
-- With the names recorded (at every heartbeat), `akadze queues list`, the metrics and
-- the workers themselves say so (queue_unserved_tasks, worker_unserved_tasks).
-- NULL is a worker of an older akadze, which may run any task.
ALTER TABLE akadze.workers ADD COLUMN tasks text[];
