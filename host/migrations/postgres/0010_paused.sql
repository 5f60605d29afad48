-- A paused run (`workflow.pause`) is still held by the worker that drives
-- it: its running steps finish and are recorded under its fence.
CREATE OR REPLACE FUNCTION wf_held(w JSONB, i INT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs
    WHERE run_id = w->>'run' AND lease_owner = w->'fence'->>0
      AND lease_epoch = (w->'fence'->>1)::BIGINT AND status IN ('running', 'paused')
    FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%', i USING ERRCODE = 'WF001';
    END IF;
END
$$;
