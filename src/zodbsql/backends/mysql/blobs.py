"""MySQL's insert-if-absent for blob chunks and contents (INSERT IGNORE).

Chunks are sized below ``max_allowed_packet`` (the connection's ``max_state_size``, read
from the server at connect), so one chunk always fits one statement.
"""
import dataclasses

from zodbsql.backends.base.blobs import Blobs

INSERT_CHUNK = "INSERT IGNORE INTO blob_chunk (content_hash, chunk_num, data) VALUES (%s, %s, %s)"
INSERT_CONTENT = "INSERT IGNORE INTO blob_content (content_hash, size, chunks) VALUES (%s, %s, %s)"


class MySQLBlobs(Blobs):
    STATEMENTS = dataclasses.replace(Blobs.STATEMENTS, insert_chunk=INSERT_CHUNK,
                                     insert_content=INSERT_CONTENT)
