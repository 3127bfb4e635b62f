-- Vote's locking and conflict check in one round trip, for both history modes ({current}
-- holds the current tids: current_object, or object_state when history-free; schema.py
-- fills it in).  See locker.py for why no two commits can wait for each other in a
-- cycle.  First the pack gate is taken shared (a pack batch deleting objects waits for
-- it: see zodbsql_pack_gate); then the current rows of the staged objects are locked
-- exclusively in oid order, waiting as long as lock_timeout allows; then the rows
-- read-current are share-locked without waiting: a row some other commit holds for writing is a read
-- conflict at once (SQLSTATE ZS003), never a wait.  Returns every conflict as (oid,
-- expected tid, current tid, 'w' for a write or 'r' for a read).
--
-- The oids whose rows it locked are left in the transaction's setting zodbsql.existing
-- for zodbsql_finish: those rows stay until the commit ends (locked), every other staged
-- object is new, and finish inserts its rows plainly instead of upserting them (for
-- 10,000 new objects, INSERT ... ON CONFLICT took twice the time of a plain INSERT).
CREATE OR REPLACE FUNCTION zodbsql_lock_objects(p_read_oids BIGINT[], p_read_tids BIGINT[])
RETURNS TABLE (zoid BIGINT, expected BIGINT, actual BIGINT, kind "char")
LANGUAGE plpgsql AS $$
DECLARE
    v_zoids BIGINT[];
    v_locked BIGINT[];
    v_tids BIGINT[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(zodbsql_pack_gate());
    -- The staged oids as an array, so the rows are found through the primary key:
    -- temp_store has no statistics, and the planner, guessing 810 rows, hash-joined it
    -- with a sequential scan of {current} (a 30-object commit at 97,000 objects: 7.8 ms,
    -- against 0.14 ms through the index; at a million objects it turns to the index).
    SELECT array_agg(t.zoid) INTO v_zoids FROM temp_store t;
    -- The write locks: FOR UPDATE gives each row as it is once locked (its newest
    -- committed tid), every row locked, in oid order.
    SELECT array_agg(l.zoid), array_agg(l.tid) INTO v_locked, v_tids FROM (
        SELECT c.zoid, c.tid FROM {current} c WHERE c.zoid = ANY(v_zoids)
            ORDER BY c.zoid FOR UPDATE) l;
    PERFORM set_config('zodbsql.existing', COALESCE(v_locked, '{}')::TEXT, true);
    -- The write conflicts: a staged object without a row (new, or deleted since) has
    -- tid 0.
    RETURN QUERY
        SELECT t.zoid, t.prev_tid, COALESCE(l.tid, 0), 'w'::"char" FROM temp_store t
            LEFT JOIN unnest(v_locked, v_tids) AS l (zoid, tid) ON l.zoid = t.zoid
            WHERE COALESCE(l.tid, 0) <> t.prev_tid;
    IF cardinality(p_read_oids) > 0 THEN
        BEGIN
            PERFORM 1 FROM {current} c WHERE c.zoid = ANY(p_read_oids)
                AND c.zoid <> ALL(COALESCE(v_zoids, '{}'))
                ORDER BY c.zoid FOR SHARE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'zodbsql: an object read-current is being changed by another commit'
                USING ERRCODE = 'ZS003';
        END;
    END IF;
    -- The read-current rows through the primary key too: joined with unnest, a plan
    -- cached while the table was small kept scanning it whole as it grew (a loading
    -- process's vote went from 2 to 11 ms in 45 s, 8 of them this scan).
    RETURN QUERY
        WITH found AS MATERIALIZED (
            SELECT c.zoid, c.tid FROM {current} c WHERE c.zoid = ANY(p_read_oids))
        SELECT r.zoid, r.tid, COALESCE(f.tid, 0), 'r'::"char"
            FROM unnest(p_read_oids, p_read_tids) AS r (zoid, tid)
            LEFT JOIN found f ON f.zoid = r.zoid
            WHERE COALESCE(f.tid, 0) <> r.tid;
END
$$;
-- Vote in one round trip: stage the commit's states (each column one array, as mover.py's
-- as_arrays gives them; each state's references a JSON array's text, turned into the
-- BIGINT[] object_state.refs keeps) and then lock and check as zodbsql_lock_objects
-- does.
-- Staging must come first, in a statement of its own: the lock reads temp_store, and a
-- data-modifying CTE's rows are not visible to the rest of its statement.
CREATE OR REPLACE FUNCTION zodbsql_stage_and_lock(
    p_zoids BIGINT[], p_prev_tids BIGINT[], p_data_tids BIGINT[], p_checksums BIGINT[],
    p_sizes BIGINT[], p_states BYTEA[], p_refs TEXT[],
    p_read_oids BIGINT[], p_read_tids BIGINT[])
RETURNS TABLE (zoid BIGINT, expected BIGINT, actual BIGINT, kind "char")
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO temp_store (zoid, prev_tid, data_tid, checksum, state_size, state, refs)
        SELECT u.zoid, u.prev_tid, u.data_tid, u.checksum, u.state_size, u.state,
               translate(u.refs, '[]', '{}')::BIGINT[]
        FROM unnest(p_zoids, p_prev_tids, p_data_tids, p_checksums, p_sizes, p_states,
                    p_refs) AS u (zoid, prev_tid, data_tid, checksum, state_size, state, refs);
    RETURN QUERY SELECT * FROM zodbsql_lock_objects(p_read_oids, p_read_tids);
END
$$;
