-- Flow control: a run of a workflow with `concurrency`, `rate` or `priority`
-- is created `queued` with its limits (evaluated on its input when it
-- started), and admitted to `running` only while they allow it.
--
-- `flow_key`/`flow_limit`: at most `flow_limit` runs of the workflow with
-- this key run at once (`''` is the workflow's one global limit).
-- `rate_key`/`rate_limit`/`rate_period_ms`: at most `rate_limit` runs with
-- this key are admitted within any `rate_period_ms`.
-- `admitted_ms`: when it was admitted (what a rate counts).
-- `queued_reason`: while queued, why it waits.
ALTER TABLE runs ADD COLUMN flow_key TEXT;
ALTER TABLE runs ADD COLUMN flow_limit INTEGER;
ALTER TABLE runs ADD COLUMN rate_key TEXT;
ALTER TABLE runs ADD COLUMN rate_limit INTEGER;
ALTER TABLE runs ADD COLUMN rate_period_ms INTEGER;
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN admitted_ms INTEGER;
ALTER TABLE runs ADD COLUMN queued_reason TEXT;

-- What admission counts, without reading every run.
CREATE INDEX runs_flow ON runs (workflow, flow_key, status) WHERE flow_key IS NOT NULL;
CREATE INDEX runs_rate ON runs (workflow, rate_key, admitted_ms) WHERE rate_key IS NOT NULL;
-- The queue, in the order it is admitted.
CREATE INDEX runs_queued ON runs (priority DESC, created_ms, run_id) WHERE status = 'queued';
