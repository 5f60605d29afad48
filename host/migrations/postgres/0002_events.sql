-- Run events, in order, for the event streams (`/runs/{run_id}/events`,
-- `/events`): an event's id is its position in the stream, so a client that
-- reconnects with `Last-Event-ID` misses nothing. Ids are drawn under an
-- advisory lock held until commit (see `append_event`), so they also become
-- visible in order across workers.
CREATE TABLE events (
    id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    kind   TEXT NOT NULL,
    data   TEXT NOT NULL,
    at     TEXT NOT NULL
);
CREATE INDEX events_run ON events (run_id, id);
