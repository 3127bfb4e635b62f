-- The final step of a history-free commit in one round trip (see txncontrol.py):
-- lock the commit row, allocate the tid, replace the states, delete the deleted ones
-- and replace their references.  Returns the new tid.
CREATE OR REPLACE FUNCTION zodbsql_finish(
    p_clock_tid BIGINT, p_requested_tid BIGINT, p_user BYTEA, p_description BYTEA,
    p_extension BYTEA, p_has_states BOOLEAN, p_lock_timeout_ms INTEGER,
    p_check_blobs BOOLEAN) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_last BIGINT;
    v_tid BIGINT;
BEGIN
    -- The commit lock has its own timeout (commit-lock-timeout), for this transaction.
    PERFORM set_config('lock_timeout', p_lock_timeout_ms::text, true);
    SELECT last_tid INTO v_last FROM commit_row FOR UPDATE;
    IF p_requested_tid IS NULL THEN
        v_tid := GREATEST(p_clock_tid, v_last + 1);
    ELSIF p_requested_tid > v_last THEN
        v_tid := p_requested_tid;
    ELSE
        RAISE EXCEPTION 'zodbsql: tid % is not after the last committed tid %',
            p_requested_tid, v_last USING ERRCODE = 'ZS001';
    END IF;
    -- Blob contents vote found in the database must still be complete: a pack (which
    -- frees contents under the commit lock) may have removed one since.
    IF p_check_blobs AND EXISTS (
            SELECT 1 FROM temp_blob t LEFT JOIN blob_content c
            ON c.content_hash = t.content_hash WHERE c.content_hash IS NULL
            OR c.chunks <> (SELECT COUNT(*) FROM blob_chunk k
                            WHERE k.content_hash = t.content_hash)) THEN
        RAISE EXCEPTION 'zodbsql: a staged blob content was freed by a pack; retry'
            USING ERRCODE = 'ZS002';
    END IF;
    UPDATE commit_row SET last_tid = v_tid;
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
