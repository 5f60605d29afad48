-- A run whose only steps in flight are durable sleeps lets go of its driver
-- (`run.asleep`): it is `running` with `wake_ms`, the earliest of their
-- wake times, and a waker reads the runs due soon from this index and
-- drives them again then. It holds no memory while it sleeps.
ALTER TABLE runs ADD COLUMN wake_ms BIGINT;
CREATE INDEX runs_asleep ON runs (wake_ms, run_id) WHERE status = 'running' AND wake_ms IS NOT NULL;
