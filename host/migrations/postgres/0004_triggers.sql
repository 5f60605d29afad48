-- Runs that start on their own, and runs that wait: the schema of
-- migrations/sqlite/0004_triggers.sql, in PostgreSQL's types.
ALTER TABLE runs ADD COLUMN run_trigger TEXT;

CREATE TABLE schedules (
    workflow     TEXT NOT NULL,
    name         TEXT NOT NULL,
    last_tick_ms BIGINT NOT NULL,
    last_run_id  TEXT,
    PRIMARY KEY (workflow, name)
);

CREATE TABLE signals (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id  TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    signal  TEXT NOT NULL,
    payload TEXT NOT NULL,
    sent_at TEXT NOT NULL,
    step_id TEXT
);
CREATE INDEX signals_run ON signals (run_id, signal, id);

-- The wait steps waiting now (`workflow.waiting`, `host.status`), found
-- without reading every step ever stored.
CREATE INDEX steps_waiting ON steps (started_at, run_id) WHERE status = 'waiting';

-- Upstream tasks (the MCP tasks extension) that steps' calls made, by the
-- call's idempotency key: a step run again after a restart follows its task
-- instead of calling the tool again.
CREATE TABLE upstream_tasks (
    call_key   TEXT PRIMARY KEY NOT NULL,
    run_id     TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    connection TEXT NOT NULL,
    task_id    TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX upstream_tasks_run ON upstream_tasks (run_id);

-- Questions upstream servers ask during steps' calls (elicitation), while
-- they wait for an answer (`workflow.answer`; the answer is a signal named
-- `answer:<step>/<item>`).
CREATE TABLE questions (
    run_id   TEXT COLLATE "C" NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    step_id  TEXT COLLATE "C" NOT NULL,
    item     INTEGER NOT NULL,
    question TEXT NOT NULL,
    asked_at TEXT NOT NULL,
    PRIMARY KEY (run_id, step_id, item)
);

-- What each journaled call answered (its result, or `{"error": {code,
-- message}}`), up to 64 KiB of JSON: `wf-host replay` answers a new build of
-- a node from it.
ALTER TABLE calls ADD COLUMN result TEXT;
