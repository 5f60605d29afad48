-- A driven run's writes in one round trip each (store/postgres.rs says what
-- every move writes; these are the same statements, in the same order).
-- Called as one statement outside an explicit transaction, a function is
-- its own transaction: what it raises undoes all it wrote.

-- Appends events of one run in order, under the event lock (so that ids
-- become visible in order), with the `event` note; their ids, ascending.
CREATE FUNCTION wf_append_events(
    p_run TEXT, p_kinds TEXT[], p_data TEXT[], p_at TEXT,
    p_event_lock BIGINT, p_channel TEXT
) RETURNS BIGINT[] LANGUAGE plpgsql AS $$
DECLARE
    ids BIGINT[];
BEGIN
    PERFORM pg_advisory_xact_lock(p_event_lock), pg_notify(p_channel, 'event');
    WITH ins AS (
        INSERT INTO events (run_id, kind, data, at)
        SELECT p_run, e.kind, e.data, p_at
        FROM unnest(p_kinds, p_data) WITH ORDINALITY AS e (kind, data, n)
        ORDER BY e.n
        RETURNING id
    )
    SELECT array_agg(id ORDER BY id) INTO ids FROM ins;
    RETURN coalesce(ids, '{}');
END
$$;

-- The fenced moves of a driven run, then their events. `p_moves` is a JSON
-- array of moves, each `{move, step, to, attempt, input, output, code,
-- message, guard}` with every value a string (`input` and `output` the
-- JSON text to store) and `guard` the states it may start from.
--
-- Raises SQLSTATE WF001 when the fence no longer holds the run, and WF002
-- with the index of the first move whose guard does not hold.
CREATE FUNCTION wf_apply_moves(
    p_run TEXT, p_worker TEXT, p_epoch BIGINT, p_moves JSONB,
    p_kinds TEXT[], p_data TEXT[], p_now TEXT, p_now_ms BIGINT,
    p_event_lock BIGINT, p_channel TEXT
) RETURNS BIGINT[] LANGUAGE plpgsql AS $$
DECLARE
    m JSONB;
    i INT := 0;
    changed BIGINT;
    guard TEXT[];
BEGIN
    -- Held until the transaction ends: a claim cannot take the run between
    -- this check and the writes.
    PERFORM 1 FROM runs
    WHERE run_id = p_run AND lease_owner = p_worker AND lease_epoch = p_epoch
      AND status = 'running'
    FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is no longer held by %', p_run, p_worker USING ERRCODE = 'WF001';
    END IF;
    FOR m IN SELECT value FROM jsonb_array_elements(p_moves) LOOP
        guard := ARRAY(SELECT jsonb_array_elements_text(m->'guard'));
        CASE m->>'move'
        WHEN 'start' THEN
            UPDATE steps SET status = m->>'to', attempts = (m->>'attempt')::BIGINT,
                             input = m->>'input', output = NULL,
                             error_code = NULL, error_message = NULL,
                             started_at = p_now, finished_at = NULL,
                             workers = (coalesce(workers, '[]')::jsonb || jsonb_build_array(
                                 jsonb_build_object('attempt', (m->>'attempt')::BIGINT,
                                                    'worker', p_worker)))::text
            WHERE run_id = p_run AND step_id = m->>'step' AND status = ANY(guard);
        WHEN 'attempt' THEN
            UPDATE steps SET attempts = greatest(attempts, (m->>'attempt')::BIGINT),
                             workers = (coalesce(workers, '[]')::jsonb || jsonb_build_array(
                                 jsonb_build_object('attempt', (m->>'attempt')::BIGINT,
                                                    'worker', p_worker)))::text
            WHERE run_id = p_run AND step_id = m->>'step' AND status = ANY(guard);
        WHEN 'finish' THEN
            UPDATE steps SET status = m->>'to', output = m->>'output',
                             error_code = m->>'code', error_message = m->>'message',
                             finished_at = p_now
            WHERE run_id = p_run AND step_id = m->>'step' AND status = ANY(guard);
        WHEN 'run_finish' THEN
            UPDATE runs SET status = m->>'to', output = m->>'output',
                            error_code = m->>'code', error_message = m->>'message',
                            finished_at = p_now, finished_ms = p_now_ms,
                            lease_owner = NULL, lease_until_ms = NULL
            WHERE run_id = p_run AND lease_owner = p_worker AND lease_epoch = p_epoch
              AND status = ANY(guard);
        ELSE
            RAISE EXCEPTION 'unknown move %', m->>'move';
        END CASE;
        GET DIAGNOSTICS changed = ROW_COUNT;
        IF changed = 0 THEN
            RAISE EXCEPTION '%', i USING ERRCODE = 'WF002';
        END IF;
        IF m->>'move' = 'run_finish' THEN
            PERFORM pg_notify(p_channel, 'finished:' || p_run);
        END IF;
        i := i + 1;
    END LOOP;
    RETURN wf_append_events(p_run, p_kinds, p_data, p_now, p_event_lock, p_channel);
END
$$;
