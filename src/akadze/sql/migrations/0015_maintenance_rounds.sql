-- akadze schema, version 15: one maintenance round per period for the whole
-- cluster, not one per worker.
--
-- Every worker tries a maintenance round about once a second (the rescue of
-- dead workers' jobs, ending claims that stopped answering, due schedule
-- fires, pruning). The round's advisory lock (maintenance_try_lock) is scoped
-- to the rescue's transaction, so that it works through a pooler in
-- transaction mode; it is free again a few milliseconds later, and nearly
-- every try got it and ran the whole round. A hundred idle workers ran a
-- hundred rounds a second: measured at about a third of a core of the
-- server's CPU (benchmarks/idle.md), where one round a second does the same
-- work.
--
-- This row remembers when the last round began and when the last prune did
-- (server time, now(): the period is about the server's load, not the jobs'
-- time, so an injected clock does not move it). The lock holder runs the round
-- only when the last one began a period ago (maintenance_try_lock), so the
-- cluster runs one round per period whatever the number of workers, and each
-- other try is one cheap statement. One row, updated at most once per period:
-- its updates are HOT and its dead versions few.
CREATE TABLE akadze.maintenance (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    last_round_at timestamptz NOT NULL DEFAULT '-infinity',
    last_pruned_at timestamptz NOT NULL DEFAULT '-infinity'
);

INSERT INTO akadze.maintenance DEFAULT VALUES;
