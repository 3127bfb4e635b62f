-- How long a database keeps a commit in commit_log, in tid units: an hour
-- (a tid's high 32 bits count minutes).  A lost COMMIT is looked up within
-- commit-lock-timeout, so an hour leaves ample room.
CREATE OR REPLACE FUNCTION zodbsql_commit_log_window() RETURNS BIGINT
LANGUAGE sql IMMUTABLE AS $$
    SELECT 60::BIGINT << 32
$$;
-- Names the procedures' generation: a database whose procedures lack it gets them all
-- installed again (schema.py, PROCEDURES).  Generation 2: vote and the history-free
-- finish reach the staged objects' rows through an array of their oids.  Generation 3:
-- so does vote's check of the objects read-current, and the history-free finish
-- replaces only the references that changed.  Generation 4: vote leaves the oids it
-- found a row of in zodbsql.existing, and finish inserts the other objects' rows
-- without ON CONFLICT.  Generation 5 (schema version 2): a state's references are a
-- column of its row (object_state.refs), staged with it.  Generation 6: the
-- history-preserving finish logs its commit in commit_log too, and returns the tid
-- committed before its own.  Generation 7: the history-free finish records the objects
-- it deletes in object_gone (backends/base/poller.py).  Generation 8: a staged blob
-- content freed meanwhile is reported with its object's oid (the error's DETAIL).
CREATE OR REPLACE FUNCTION zodbsql_procedures_8() RETURNS INTEGER
LANGUAGE sql IMMUTABLE AS $$
    SELECT 8
$$;
-- The advisory lock between votes and pack batches (locker.py): each commit holds it
-- shared from vote to its end, a pack batch that deletes objects holds it exclusively,
-- so no batch runs while a voted commit (whose new references are not visible yet)
-- has not finished.  Named after the schema, as the channel below.
CREATE OR REPLACE FUNCTION zodbsql_pack_gate() RETURNS BIGINT
LANGUAGE sql STABLE AS $$
    SELECT hashtext('zodbsql:pack-gate:' || current_schema())::BIGINT
$$;
-- The channel this schema's commits are announced on (listener.py listens on it): named
-- after the schema, hashed to fit the 63 bytes of a channel name.
CREATE OR REPLACE FUNCTION zodbsql_channel() RETURNS TEXT
LANGUAGE sql STABLE AS $$
    SELECT 'zodbsql_' || left(encode(sha256(convert_to(current_schema(), 'UTF8')), 'hex'), 40)
$$;
-- The part of a commit's final step both history modes share (see txncontrol.py): take
-- the commit lock (commit_row) within commit-lock-timeout, allocate the tid (the clock's,
-- or one past the last; a restore's own, which must come after the last), check that the
-- blob contents vote found are still complete, record the tid as the last one (the one
-- before it stays in the setting zodbsql.previous) and announce it to the listening
-- processes.
CREATE OR REPLACE FUNCTION zodbsql_allocate_tid(
    p_clock_tid BIGINT, p_requested_tid BIGINT, p_lock_timeout_ms INTEGER,
    p_check_blobs BOOLEAN) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    v_last BIGINT;
    v_tid BIGINT;
    v_vanished BIGINT;
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
    IF p_check_blobs THEN
        SELECT t.zoid INTO v_vanished FROM temp_blob t LEFT JOIN blob_content c
            ON c.content_hash = t.content_hash WHERE c.content_hash IS NULL
            OR c.chunks <> (SELECT COUNT(*) FROM blob_chunk k
                            WHERE k.content_hash = t.content_hash)
            LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'zodbsql: the blob content of oid % was freed by a pack',
                v_vanished USING ERRCODE = 'ZS002', DETAIL = v_vanished::text;
        END IF;
    END IF;
    UPDATE commit_row SET last_tid = v_tid;
    -- The tid before this one, which the finish query reads back (txncontrol.py).
    PERFORM set_config('zodbsql.previous', v_last::text, true);
    -- Delivered when this transaction commits, and only if it does: no round trip.
    PERFORM pg_notify(zodbsql_channel(), v_tid::text);
    RETURN v_tid;
END
$$;
