-- Debounce: starts of a workflow with `debounce` that have the same key
-- within its period make one run. The run is `queued` while later starts
-- may join it (they update its input and `not_before_ms`), and is not
-- admitted before `not_before_ms`; no start moves that past
-- `debounce_deadline_ms` (the first start plus `max_wait`).
ALTER TABLE runs ADD COLUMN debounce_key TEXT;
ALTER TABLE runs ADD COLUMN not_before_ms BIGINT;
ALTER TABLE runs ADD COLUMN debounce_deadline_ms BIGINT;

-- At most one run per workflow and key can be joined: a second start's
-- insert conflicts here, and joins the run it conflicts with.
CREATE UNIQUE INDEX runs_debounce ON runs (workflow, debounce_key)
    WHERE status = 'queued' AND debounce_key IS NOT NULL;
