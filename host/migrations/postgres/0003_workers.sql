-- Workers and leases. Several workers share this database; each run is driven
-- by the worker holding its lease, and a result is committed only while that
-- lease is still the writer's (`lease_owner`, `lease_epoch`). Lease times are
-- the database's clock (ms since the epoch of `clock_timestamp()`), never a
-- worker's, so clock skew between workers does not matter.
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_until_ms BIGINT;
ALTER TABLE runs ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE;
-- A JSON array of {"attempt": n, "worker": id}, oldest first.
ALTER TABLE steps ADD COLUMN workers TEXT;

CREATE TABLE workers (
    id            TEXT PRIMARY KEY NOT NULL,
    started_at    TEXT NOT NULL,
    heartbeat_ms  BIGINT NOT NULL,
    running_steps BIGINT NOT NULL DEFAULT 0
);
