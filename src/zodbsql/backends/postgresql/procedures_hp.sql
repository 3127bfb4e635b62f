-- The final step of a history-preserving commit in one round trip (see txncontrol.py):
-- lock the commit row, allocate the tid, record the transaction, move the staged states,
-- point current_object at them and copy their references.  Returns the new tid.
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
    INSERT INTO transactions (tid, packed, username, description, extension)
        VALUES (v_tid, 0, p_user, p_description, p_extension);
    IF p_has_states THEN
        INSERT INTO object_state (zoid, tid, data_tid, checksum, state_size, state)
            SELECT zoid, v_tid, data_tid, checksum, state_size, state FROM temp_store;
        INSERT INTO current_object (zoid, tid) SELECT zoid, v_tid FROM temp_store
            ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid;
        INSERT INTO object_ref (zoid, tid, to_zoid) SELECT zoid, v_tid, to_zoid FROM temp_ref;
        INSERT INTO blob_ref (zoid, tid, content_hash) SELECT zoid, v_tid, content_hash FROM temp_blob;
    END IF;
    RETURN v_tid;
END
$$;
