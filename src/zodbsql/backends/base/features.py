"""Capability flags: each a question with a conservative default; backends override.

Every flag here is read by the core or a role (``tests/contract/test_features.py``
fails on one that nothing reads).  A value a backend learns from its server when it
connects (MySQL's packet size, its spelling of a share lock) is not a flag: it lives
on the connection (``DBConnection.max_state_size``, ``MySQLConnection``).
"""
from __future__ import annotations


class Features:
    """The portable answers; a ``FeaturesRole``."""

    #: Are the staging tables empty at the start of every transaction (ON COMMIT DELETE
    #: ROWS)?  Then a commit does not clear them first.
    staging_emptied_by_transaction_end = False

    #: Does a commit hold the database's only write lock from vote to finish (no row
    #: locks: SQLite)?  Then a commit of states alone (no deletion, copy or blob) takes
    #: its tid at vote and writes its states there (``MoverRole.write_states``) instead
    #: of staging them for finish to move.
    writes_at_vote = False
