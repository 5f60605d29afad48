-- Runs, their steps, and a journal of every capability call: the schema of
-- migrations/sqlite, in PostgreSQL's types. Ids compare byte by byte
-- (COLLATE "C"), as in SQLite, so pages of runs come in the same order.
CREATE TABLE runs (
    run_id          TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    workflow        TEXT NOT NULL,
    status          TEXT NOT NULL,
    input           TEXT NOT NULL,
    output          TEXT,
    error_code      TEXT,
    error_message   TEXT,
    -- The definition the run started with (JSON) and its hash: a run always
    -- continues on the graph and the code it started with.
    definition      TEXT NOT NULL,
    definition_hash TEXT NOT NULL,
    idempotency_key TEXT,
    created_ms      BIGINT NOT NULL,
    started_at      TEXT NOT NULL,
    finished_at     TEXT,
    finished_ms     BIGINT
);
CREATE UNIQUE INDEX runs_idempotency ON runs (workflow, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_status ON runs (status);
CREATE INDEX runs_created ON runs (created_ms, run_id);
CREATE INDEX runs_finished ON runs (finished_ms, run_id) WHERE status != 'running';

CREATE TABLE steps (
    run_id        TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step_id       TEXT NOT NULL,
    position      BIGINT NOT NULL,
    status        TEXT NOT NULL,
    attempts      BIGINT NOT NULL DEFAULT 0,
    input         TEXT,
    output        TEXT,
    error_code    TEXT,
    error_message TEXT,
    started_at    TEXT,
    finished_at   TEXT,
    PRIMARY KEY (run_id, step_id)
);

CREATE TABLE calls (
    run_id      TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step_id     TEXT NOT NULL,
    item        BIGINT NOT NULL,
    attempt     BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    name        TEXT NOT NULL,
    arguments   TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    error_code  TEXT,
    duration_us BIGINT NOT NULL,
    at          TEXT NOT NULL,
    PRIMARY KEY (run_id, step_id, item, attempt, seq)
);
