"""Records compressed and encrypted at rest.

A stored state is either a plain pickle (every record written before, or below the
compression threshold, or with both features off) or a *sealed* record: a short header
and a payload (``codec.py``).  A pickle never starts with a zero byte, so the two are
told apart by their first bytes and old and new records are read alike.

Compression (zstd) comes before encryption (AES-GCM, ``keys.py``); the oid and the
header are the associated data, so a sealed record can't be moved to another object
or have its flags changed unnoticed.  The checksum a record carries is of its plain
state, computed before sealing, so every comparison the core makes between states
(undo, the commit-outcome check) is unchanged; with encryption on it is keyed with
the database's checksum key (``opening.py``), since it stays in clear.  A sealed record
that was altered fails AES-GCM's tag or decompression, and then the checksum.
"""
