"""Capability flags: each a question with a conservative default; backends override."""
from __future__ import annotations


class Features:
    #: Can two processes commit disjoint objects at the same time?  (SQLite: no, one writer.)
    supports_parallel_commit = False
    #: Does ``SELECT ... FOR UPDATE`` lock rows?  When False the whole commit is serialised.
    supports_row_locks = False
    #: Can one statement insert-or-replace a row (upsert)?
    has_native_upsert = True
    #: Are several processes on several machines expected to share the database?
    is_networked = False
    #: Does the database keep one file whose size getSize() can report?
    is_single_file = False
    #: The largest state one statement may carry, in bytes (None: no limit known).
    max_state_size: int | None = None
    #: What sets ``max_state_size`` and how to raise it, for the error message.
    max_state_size_detail: str | None = None
    #: Statements the connection must run at most once per commit may be batched into one.
    supports_multiple_statements = False
    #: Are the staging tables empty at the start of every transaction (ON COMMIT DELETE
    #: ROWS)?  Then a commit does not clear them first.
    staging_emptied_by_transaction_end = False
