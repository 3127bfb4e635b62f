"""The backend contract.

A backend is a :class:`~zodbsql.backends.base.adapter.Backend` subclass that names one
class per role (connections, schema, locker, mover, poller, oid allocator, packer) and a
``Features`` class of capability flags.  The roles here hold the portable SQL as
module-level constants; a backend's module of the same name overrides only what its
dialect does differently.
"""
