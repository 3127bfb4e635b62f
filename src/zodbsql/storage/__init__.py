"""The ZODB-facing core: it speaks ZODB's storage interfaces and the backend contract."""
from zodbsql.storage.storage import SQLStorage

__all__ = ["SQLStorage"]
