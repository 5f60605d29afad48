-- One write path: the writes of many runs in one round trip. The statements
-- come from the store's one SQL renderer (store/sql.rs), which turns each
-- move's effects into SQL; this function knows no move, only statements,
-- their guards, events and notes. Called as one statement outside an
-- explicit transaction, it is its own transaction: what it raises undoes
-- all it wrote, for every run in the call.
DROP FUNCTION wf_apply_moves(TEXT, TEXT, BIGINT, JSONB, TEXT[], TEXT[], TEXT, BIGINT, BIGINT, TEXT);
DROP FUNCTION wf_append_events(TEXT, TEXT[], TEXT[], TEXT, BIGINT, TEXT);

-- `p_writes` is a JSON array of writes, one per run:
--   {run, at, stmts: [{sql, args, guard, move}], events: [[kind, data]], notes: [payload]}
-- Each statement runs as `EXECUTE sql USING args` (args a text array, `$1`).
-- A statement's guard says what a statement that changes no row means:
--   "fence"  the run is no longer held by the write's worker: SQLSTATE WF001;
--   "refuse" the move's guard does not hold: SQLSTATE WF002, message
--            "<write> <move>";
--   "exists" (a run's insert) the run was there already: the write stops,
--            appends nothing, and its index is returned in `skipped`.
-- Then the events of every write, in order, are appended under the event
-- lock (so that ids become visible in order), with one `event` note; each
-- write's own notes go out as it is applied. Returns the events' ids,
-- ascending, and the writes skipped.
CREATE FUNCTION wf_apply(
    p_writes JSONB, p_event_lock BIGINT, p_channel TEXT,
    OUT ids BIGINT[], OUT skipped INT[]
) LANGUAGE plpgsql AS $$
DECLARE
    w JSONB;
    s JSONB;
    i INT := 0;
    changed BIGINT;
    skip BOOLEAN;
    e_runs TEXT[] := '{}';
    e_kinds TEXT[] := '{}';
    e_data TEXT[] := '{}';
    e_ats TEXT[] := '{}';
BEGIN
    skipped := '{}';
    FOR w IN SELECT value FROM jsonb_array_elements(p_writes) LOOP
        skip := FALSE;
        FOR s IN SELECT value FROM jsonb_array_elements(w->'stmts') LOOP
            EXECUTE s->>'sql' USING ARRAY(SELECT jsonb_array_elements_text(s->'args'));
            GET DIAGNOSTICS changed = ROW_COUNT;
            IF changed = 0 THEN
                CASE s->>'guard'
                WHEN 'fence' THEN
                    RAISE EXCEPTION '%', i USING ERRCODE = 'WF001';
                WHEN 'refuse' THEN
                    RAISE EXCEPTION '% %', i, s->>'move' USING ERRCODE = 'WF002';
                WHEN 'exists' THEN
                    skip := TRUE;
                    EXIT;
                ELSE
                END CASE;
            END IF;
        END LOOP;
        IF skip THEN
            skipped := skipped || i;
        ELSE
            IF jsonb_array_length(w->'events') > 0 THEN
                SELECT e_runs || array_agg(w->>'run' ORDER BY e.n),
                       e_kinds || array_agg(e.value->>0 ORDER BY e.n),
                       e_data || array_agg(e.value->>1 ORDER BY e.n),
                       e_ats || array_agg(w->>'at' ORDER BY e.n)
                INTO e_runs, e_kinds, e_data, e_ats
                FROM jsonb_array_elements(w->'events') WITH ORDINALITY AS e (value, n);
            END IF;
            PERFORM pg_notify(p_channel, n) FROM jsonb_array_elements_text(w->'notes') AS n;
        END IF;
        i := i + 1;
    END LOOP;
    ids := '{}';
    IF cardinality(e_kinds) > 0 THEN
        PERFORM pg_advisory_xact_lock(p_event_lock), pg_notify(p_channel, 'event');
        WITH ins AS (
            INSERT INTO events (run_id, kind, data, at)
            SELECT e.run, e.kind, e.data, e.at
            FROM unnest(e_runs, e_kinds, e_data, e_ats) WITH ORDINALITY AS e (run, kind, data, at, n)
            ORDER BY e.n
            RETURNING id
        )
        SELECT coalesce(array_agg(id ORDER BY id), '{}') INTO ids FROM ins;
    END IF;
END
$$;
