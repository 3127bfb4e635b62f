"""The process-wide cache of object states shared by the instances of one storage."""
from zodbsql.cache.statecache import StateCache

__all__ = ["StateCache"]
