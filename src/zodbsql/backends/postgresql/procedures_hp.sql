-- The final step of a history-preserving commit in one round trip (see txncontrol.py):
-- allocate the tid (procedures_common.sql), record the transaction, log it with the
-- client's nonce (commit_log: how a lost COMMIT is looked up before its tid is known),
-- move the staged states, and point current_object at them.  Returns the new tid, and
-- the last tid before it: when that is the committing instance's snapshot, nothing else
-- was committed in between, and its next start need not poll (storage.py).
-- (Databases made before generation 6 keep the finish without the nonce, for processes
-- of an older zodbsql.)
CREATE OR REPLACE FUNCTION zodbsql_finish(
    p_clock_tid BIGINT, p_requested_tid BIGINT, p_user BYTEA, p_description BYTEA,
    p_extension BYTEA, p_has_states BOOLEAN, p_lock_timeout_ms INTEGER,
    p_check_blobs BOOLEAN, p_nonce BIGINT, OUT o_tid BIGINT, OUT o_previous BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    v_tid BIGINT;
    v_existing BIGINT[];
BEGIN
    v_tid := zodbsql_allocate_tid(p_clock_tid, p_requested_tid, p_lock_timeout_ms,
                                  p_check_blobs);
    o_tid := v_tid;
    o_previous := current_setting('zodbsql.previous')::BIGINT;
    INSERT INTO transactions (tid, packed, username, description, extension)
        VALUES (v_tid, 0, p_user, p_description, p_extension);
    INSERT INTO commit_log (tid, nonce) VALUES (v_tid, p_nonce);
    DELETE FROM commit_log WHERE tid < v_tid - zodbsql_commit_log_window();
    IF p_has_states THEN
        INSERT INTO object_state (zoid, tid, data_tid, checksum, state_size, refs, state)
            SELECT zoid, v_tid, data_tid, checksum, state_size, refs, state FROM temp_store;
        -- The objects vote found a row of (zodbsql_lock_objects) are updated, the others
        -- are new.  Not a restore's or an undo's prev_tid 0: they stage existing objects
        -- so.  (Another commit creating the same oid meanwhile fails this INSERT.)
        v_existing := NULLIF(current_setting('zodbsql.existing', true), '')::BIGINT[];
        IF v_existing IS NULL THEN  -- not locked by this transaction's vote
            INSERT INTO current_object (zoid, tid) SELECT zoid, v_tid FROM temp_store
                ON CONFLICT (zoid) DO UPDATE SET tid = excluded.tid;
        ELSIF cardinality(v_existing) = 0 THEN
            INSERT INTO current_object (zoid, tid) SELECT zoid, v_tid FROM temp_store;
        ELSE
            UPDATE current_object SET tid = v_tid WHERE zoid = ANY(v_existing);
            INSERT INTO current_object (zoid, tid) SELECT t.zoid, v_tid FROM temp_store t
                LEFT JOIN unnest(v_existing) AS e (zoid) ON e.zoid = t.zoid
                WHERE e.zoid IS NULL;
        END IF;
        INSERT INTO blob_ref (zoid, tid, content_hash) SELECT zoid, v_tid, content_hash FROM temp_blob;
    END IF;
END
$$;
