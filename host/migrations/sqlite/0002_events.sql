-- Run events, in order, for the event streams (`/runs/{run_id}/events`,
-- `/events`): an event's id is its position in the stream, so a client that
-- reconnects with `Last-Event-ID` misses nothing.
CREATE TABLE events (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    kind   TEXT NOT NULL,
    data   TEXT NOT NULL,
    at     TEXT NOT NULL
);
CREATE INDEX events_run ON events (run_id, id);
