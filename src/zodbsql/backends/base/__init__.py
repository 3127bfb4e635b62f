"""The backend contract.

A backend is a :class:`~zodbsql.backends.base.adapter.Backend` subclass that names one
class per role (connections, schema, locker, mover, poller, oid allocator, history,
packer, checker, transaction control, inspector, blobs) and a ``Features`` class of
capability flags.  :mod:`~zodbsql.backends.base.contract` types each role as a
``Protocol`` (what it returns, what it raises) with the named rows the roles hand back;
the storage core and the roles see a backend only through it.  The roles here hold the
portable SQL as module-level constants, gathered into one statement set per role and
history mode (:mod:`~zodbsql.backends.base.statements`); a backend's module of the same
name overrides only the statements its dialect writes differently, by name.
"""
