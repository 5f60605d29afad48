-- One write path: the writes of many runs in one round trip. The statements
-- come from the store's one SQL renderer (store/sql.rs), which turns each
-- move's effects into SQL; this function knows no move, only statements,
-- their guards, events and notes. Called as one statement outside an
-- explicit transaction, it is its own transaction: what it raises undoes
-- all it wrote, for every run in the call.
DROP FUNCTION wf_apply_moves(TEXT, TEXT, BIGINT, JSONB, TEXT[], TEXT[], TEXT, BIGINT, BIGINT, TEXT);
DROP FUNCTION wf_append_events(TEXT, TEXT[], TEXT[], TEXT, BIGINT, TEXT);

-- `p_writes` is a JSON array of writes, one per run:
--   {run, at, fence: [worker, epoch] | null, stmts: [{sql, args, guard, move}],
--    events: [[kind, data]], notes: [payload]}
-- With a fence, the write checks that the worker still holds the run in
-- that epoch before its first statement (past a new run's insert), and holds
-- the run's row (`FOR SHARE`) until it commits, so a claim cannot take the
-- run between the check and the writes; when it does not hold: SQLSTATE
-- WF001.
-- Each statement runs with `args` (a text array) as its `$1`. Its text is
-- prepared once per session (named by its hash) and its generic plan kept:
-- parsed and planned on every call, the statements cost more than they did.
-- A statement's guard says what a statement that changes no row means:
--   "refuse" the move's guard does not hold: SQLSTATE WF002, message
--            "<write> <move>";
--   "exists" (a run's insert) the run was there already: the write stops,
--            appends nothing, and its index is returned in `skipped`.
-- Then the events of every write, in order, are appended under the event
-- lock (so that ids become visible in order), with one `event` note; each
-- write's own notes go out as it is applied. Returns the events' ids,
-- ascending, and the writes skipped.
-- Whether write `w` (number `i` of its call) is still held by its fence's
-- worker in its epoch; held (`FOR SHARE`) until the transaction ends.
CREATE FUNCTION wf_held(w JSONB, i INT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs
    WHERE run_id = w->>'run' AND lease_owner = w->'fence'->>0
      AND lease_epoch = (w->'fence'->>1)::BIGINT AND status = 'running'
    FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%', i USING ERRCODE = 'WF001';
    END IF;
END
$$;

CREATE FUNCTION wf_apply(
    p_writes JSONB, p_event_lock BIGINT, p_channel TEXT,
    OUT ids BIGINT[], OUT skipped INT[]
) LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    w JSONB;
    s JSONB;
    stmt_name TEXT;
    held BOOLEAN;
    prepared TEXT;
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
        held := jsonb_typeof(w->'fence') IS DISTINCT FROM 'array';
        FOR s IN SELECT value FROM jsonb_array_elements(w->'stmts') LOOP
            -- The fence, before the first statement past a new run's insert.
            IF NOT held AND s->>'guard' IS DISTINCT FROM 'exists' THEN
                PERFORM wf_held(w, i);
                held := TRUE;
            END IF;
            stmt_name := 'wf_' || md5(s->>'sql');
            -- The session's prepared texts, as far as this session knows
            -- (a setting, which a rollback forgets though the statement
            -- stays: then the catalog says).
            prepared := coalesce(current_setting('wf.prepared', true), '');
            IF position(stmt_name IN prepared) = 0 THEN
                IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements p WHERE p.name = stmt_name) THEN
                    -- Prepared to return how many rows it changed (or
                    -- found): a prepared statement's own count does not
                    -- reach this function.
                    EXECUTE format(
                        CASE WHEN s->>'sql' ~* '^\s*select'
                             THEN 'PREPARE %I (text[]) AS SELECT count(*) FROM (%s) AS x'
                             ELSE 'PREPARE %I (text[]) AS WITH x AS (%s RETURNING 1) SELECT count(*) FROM x'
                        END, stmt_name, s->>'sql');
                END IF;
                PERFORM set_config('wf.prepared', prepared || ' ' || stmt_name, false);
            END IF;
            EXECUTE format('EXECUTE %I(%L)', stmt_name,
                           ARRAY(SELECT jsonb_array_elements_text(s->'args')))
            INTO changed;
            IF changed = 0 THEN
                CASE s->>'guard'
                WHEN 'refuse' THEN
                    RAISE EXCEPTION '% %', i, s->>'move' USING ERRCODE = 'WF002';
                WHEN 'exists' THEN
                    skip := TRUE;
                    EXIT;
                ELSE
                END CASE;
            END IF;
        END LOOP;
        IF NOT held AND NOT skip THEN
            PERFORM wf_held(w, i);
        END IF;
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
