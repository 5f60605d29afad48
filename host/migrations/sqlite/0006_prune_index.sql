-- Pruning finds its cut (the newest finished run past `keep_runs`) by
-- walking `runs_finished`. Since queued runs, its filter also says
-- `status != 'queued'`, which the index did not cover: every run walked was
-- read from the table (3 ms for 10,000 kept runs, once every 64 finished
-- runs). The index now holds finished runs only.
DROP INDEX runs_finished;
CREATE INDEX runs_finished ON runs (finished_ms, run_id)
    WHERE status != 'running' AND status != 'queued';
