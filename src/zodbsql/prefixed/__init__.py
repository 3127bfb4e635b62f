"""``%import zodbsql.prefixed``: zodbsql's ZConfig component without the short backend
section names (``<sqlite3>``, ``<postgresql>``, ``<mysql>``) that RelStorage defines too.

Its backend sections are ``<zodbsql-sqlite3>``, ``<zodbsql-postgresql>`` and
``<zodbsql-mysql>``, so one configuration can import RelStorage and zodbsql side by side
(RelStorage's ``zodbconvert``, a zope.conf mounting both, zodbshootout).  The package
holds only ``component.xml``.
"""
