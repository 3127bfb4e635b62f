"""PostgreSQL's insert-if-absent for blob chunks and contents.

A second commit uploading the same content waits on the first one's uncommitted rows and
then skips them; the finish function checks, under the commit lock, that every staged
content is complete (``p_check_blobs``).
"""
import dataclasses

from zodbsql.backends.base.blobs import Blobs

INSERT_CHUNK = ("INSERT INTO blob_chunk (content_hash, chunk_num, data) VALUES (%s, %s, %s)"
                " ON CONFLICT (content_hash, chunk_num) DO NOTHING")
INSERT_CONTENT = ("INSERT INTO blob_content (content_hash, size, chunks) VALUES (%s, %s, %s)"
                  " ON CONFLICT (content_hash) DO NOTHING")


class PostgreSQLBlobs(Blobs):
    STATEMENTS = dataclasses.replace(Blobs.STATEMENTS, insert_chunk=INSERT_CHUNK,
                                     insert_content=INSERT_CONTENT)
