"""SQLite's insert-if-absent for blob chunks and contents."""
import dataclasses

from zodbsql.backends.base.blobs import Blobs

INSERT_CHUNK = "INSERT OR IGNORE INTO blob_chunk (content_hash, chunk_num, data) VALUES (%s, %s, %s)"
INSERT_CONTENT = "INSERT OR IGNORE INTO blob_content (content_hash, size, chunks) VALUES (%s, %s, %s)"


class SQLiteBlobs(Blobs):
    STATEMENTS = dataclasses.replace(Blobs.STATEMENTS, insert_chunk=INSERT_CHUNK,
                                     insert_content=INSERT_CONTENT)
