-- The final step of a history-free commit in one round trip (see txncontrol.py):
-- allocate the tid (procedures_common.sql), replace the states (their references with
-- them), delete the deleted ones, and log the commit with the client's nonce.  Returns the
-- new tid.
--
-- A history-free database keeps no record of old transactions, so when COMMIT's answer
-- is lost and later commits have replaced the states, the data alone can't say whether
-- the commit happened.  commit_log can: a row (tid, nonce) is there if and only if this
-- very commit is durable (a later commit may get the same tid, and after a crash the same
-- xid, but not the same random nonce).  Rows older than zodbsql_commit_log_window() go.
-- The history-preserving finish logs its commits the same way.
CREATE OR REPLACE FUNCTION zodbsql_finish(
    p_clock_tid BIGINT, p_requested_tid BIGINT, p_user BYTEA, p_description BYTEA,
    p_extension BYTEA, p_has_states BOOLEAN, p_lock_timeout_ms INTEGER,
    p_check_blobs BOOLEAN, p_nonce BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_tid BIGINT;
    v_existing BIGINT[];
    v_deleted BIGINT[];
BEGIN
    v_tid := zodbsql_allocate_tid(p_clock_tid, p_requested_tid, p_lock_timeout_ms,
                                  p_check_blobs);
    INSERT INTO commit_log (tid, nonce) VALUES (v_tid, p_nonce);
    DELETE FROM commit_log WHERE tid < v_tid - zodbsql_commit_log_window();
    IF p_has_states THEN
        -- The objects vote found a row of (zodbsql_lock_objects, which keeps them locked)
        -- are replaced, the others are new: inserted plainly.  Another commit creating the same oid meanwhile fails this INSERT.
        v_existing := NULLIF(current_setting('zodbsql.existing', true), '')::BIGINT[];
        IF v_existing IS NULL THEN  -- not locked by this transaction's vote
            SELECT array_agg(zoid) INTO v_existing FROM object_state
                WHERE zoid = ANY(ARRAY(SELECT zoid FROM temp_store));
        END IF;
        v_existing := COALESCE(v_existing, '{}');
        IF cardinality(v_existing) > 0 THEN
            UPDATE object_state o SET tid = v_tid, checksum = t.checksum,
                    state_size = t.state_size, refs = t.refs, state = t.state
                FROM temp_store t
                WHERE o.zoid = ANY(v_existing) AND t.zoid = o.zoid AND t.state IS NOT NULL;
        END IF;
        INSERT INTO object_state (zoid, tid, checksum, state_size, refs, state)
            SELECT t.zoid, v_tid, t.checksum, t.state_size, t.refs, t.state FROM temp_store t
            LEFT JOIN unnest(v_existing) AS e (zoid) ON e.zoid = t.zoid
            WHERE e.zoid IS NULL AND t.state IS NOT NULL;
        SELECT array_agg(zoid) FILTER (WHERE state IS NULL) INTO v_deleted FROM temp_store;
        DELETE FROM object_state WHERE zoid = ANY(v_deleted);
        IF cardinality(v_deleted) > 0 THEN
            -- Polls can't name a row that is gone: they read the record (backends/base/poller.py).
            UPDATE gone_row SET last_seq = last_seq + 1;
            INSERT INTO object_gone (seq, tid, zoids)
                SELECT g.last_seq, v_tid, array_to_json(v_deleted)::TEXT FROM gone_row g;
        END IF;
        -- The new revision replaces the blob reference (or drops it: deleted, not a blob).
        DELETE FROM blob_ref WHERE zoid = ANY(v_existing);
        INSERT INTO blob_ref (zoid, tid, content_hash) SELECT zoid, v_tid, content_hash FROM temp_blob;
    END IF;
    RETURN v_tid;
END
$$;
