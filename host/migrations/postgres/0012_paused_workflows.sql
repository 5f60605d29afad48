-- A workflow paused as a whole (`workflow.pause {workflow}`): its new runs
-- wait `queued` and none of its queued runs is admitted until it is
-- resumed; its schedules skip their ticks.
CREATE TABLE paused_workflows (
    workflow TEXT PRIMARY KEY,
    paused_at TEXT NOT NULL
);
