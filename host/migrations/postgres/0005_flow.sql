-- Flow control: the schema of migrations/sqlite/0005_flow.sql (which says
-- what each column is), in PostgreSQL's types.
ALTER TABLE runs ADD COLUMN flow_key TEXT;
ALTER TABLE runs ADD COLUMN flow_limit BIGINT;
ALTER TABLE runs ADD COLUMN rate_key TEXT;
ALTER TABLE runs ADD COLUMN rate_limit BIGINT;
ALTER TABLE runs ADD COLUMN rate_period_ms BIGINT;
ALTER TABLE runs ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN admitted_ms BIGINT;
ALTER TABLE runs ADD COLUMN queued_reason TEXT;

-- What admission counts, without reading every run.
CREATE INDEX runs_flow ON runs (workflow, flow_key, status) WHERE flow_key IS NOT NULL;
CREATE INDEX runs_rate ON runs (workflow, rate_key, admitted_ms) WHERE rate_key IS NOT NULL;
-- The queue, in the order it is admitted.
CREATE INDEX runs_queued ON runs (priority DESC, created_ms, run_id) WHERE status = 'queued';
