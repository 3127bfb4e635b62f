-- The final step of a history-free commit in one round trip (see txncontrol.py):
-- allocate the tid (procedures_common.sql), replace the states, delete the deleted ones
-- and replace their references.  Returns the new tid.
CREATE OR REPLACE FUNCTION zodbsql_finish(
    p_clock_tid BIGINT, p_requested_tid BIGINT, p_user BYTEA, p_description BYTEA,
    p_extension BYTEA, p_has_states BOOLEAN, p_lock_timeout_ms INTEGER,
    p_check_blobs BOOLEAN) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_tid BIGINT;
BEGIN
    v_tid := zodbsql_allocate_tid(p_clock_tid, p_requested_tid, p_lock_timeout_ms,
                                  p_check_blobs);
    IF p_has_states THEN
        INSERT INTO object_state (zoid, tid, checksum, state_size, state)
            SELECT zoid, v_tid, checksum, state_size, state FROM temp_store
            WHERE state IS NOT NULL
            ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid, checksum = excluded.checksum,
                state_size = excluded.state_size, state = excluded.state;
        DELETE FROM object_state WHERE zoid IN (SELECT zoid FROM temp_store WHERE state IS NULL);
        DELETE FROM object_ref WHERE zoid IN (SELECT zoid FROM temp_store);
        INSERT INTO object_ref (zoid, to_zoid) SELECT zoid, to_zoid FROM temp_ref;
        -- The new revision replaces the blob reference (or drops it: deleted, not a blob).
        DELETE FROM blob_ref WHERE zoid IN (SELECT zoid FROM temp_store);
        INSERT INTO blob_ref (zoid, tid, content_hash) SELECT zoid, v_tid, content_hash FROM temp_blob;
    END IF;
    RETURN v_tid;
END
$$;

-- Vote's locking and conflict check in one round trip (see locker.py for why no two
-- commits can wait for each other in a cycle).  First the current rows of the staged
-- objects are locked exclusively in oid order, waiting as long as lock_timeout allows;
-- then the rows read-current are share-locked without waiting: a row some other commit
-- holds for writing is a read conflict at once (SQLSTATE ZS003), never a wait.  Returns
-- every conflict as (oid, expected tid, current tid, 'w' for a write or 'r' for a read).
CREATE OR REPLACE FUNCTION zodbsql_lock_objects(p_read_oids BIGINT[], p_read_tids BIGINT[])
RETURNS TABLE (zoid BIGINT, expected BIGINT, actual BIGINT, kind "char")
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM object_state c WHERE c.zoid IN (SELECT t.zoid FROM temp_store t)
        ORDER BY c.zoid FOR UPDATE;
    IF cardinality(p_read_oids) > 0 THEN
        BEGIN
            PERFORM 1 FROM object_state c WHERE c.zoid = ANY(p_read_oids)
                AND c.zoid NOT IN (SELECT t.zoid FROM temp_store t)
                ORDER BY c.zoid FOR SHARE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'zodbsql: an object read-current is being changed by another commit'
                USING ERRCODE = 'ZS003';
        END;
    END IF;
    RETURN QUERY
        SELECT t.zoid, t.prev_tid, COALESCE(c.tid, 0), 'w'::"char" FROM temp_store t
            LEFT JOIN object_state c ON c.zoid = t.zoid
            WHERE COALESCE(c.tid, 0) <> t.prev_tid
        UNION ALL
        SELECT r.zoid, r.tid, COALESCE(c.tid, 0), 'r'::"char"
            FROM unnest(p_read_oids, p_read_tids) AS r (zoid, tid)
            LEFT JOIN object_state c ON c.zoid = r.zoid
            WHERE COALESCE(c.tid, 0) <> r.tid;
END
$$;
