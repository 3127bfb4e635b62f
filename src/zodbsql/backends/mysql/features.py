"""MySQL/MariaDB (InnoDB) capabilities: the portable answers.

What depends on the server (max_allowed_packet, the spelling of a share lock that
never waits) is read at connect and kept on each ``MySQLConnection``.
"""
from zodbsql.backends.base.features import Features


class MySQLFeatures(Features):
    pass
