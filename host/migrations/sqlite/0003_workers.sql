-- Workers and leases. A shared store (PostgreSQL) has several workers; each
-- run is driven by the worker holding its lease, and a result is committed
-- only while that lease is still the writer's (`lease_owner`, `lease_epoch`).
-- SQLite has one worker (the state file is locked), so it keeps the columns
-- only to have the same schema, and records which worker ran each attempt.
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_until_ms INTEGER;
ALTER TABLE runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
-- A JSON array of {"attempt": n, "worker": id}, oldest first.
ALTER TABLE steps ADD COLUMN workers TEXT;

CREATE TABLE workers (
    id            TEXT PRIMARY KEY NOT NULL,
    started_at    TEXT NOT NULL,
    heartbeat_ms  INTEGER NOT NULL,
    running_steps INTEGER NOT NULL DEFAULT 0
);
