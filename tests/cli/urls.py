"""The tools' STORAGE argument for a test database: a plain URL or a ZConfig file."""
from __future__ import annotations

import pathlib
from urllib.parse import quote

from tests.databases import MYSQL_SERVER, POSTGRESQL_DSN


def postgresql_params() -> dict[str, str]:
    import psycopg
    return {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(POSTGRESQL_DSN).items()
            if v is not None}


def _login(user: str, password: str | None) -> str:
    return quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")


def url_for(backend: str, path: str, password: str | None = None,
            keep_history: bool = True, user: str | None = None) -> str:
    """A plain URL naming the test database ``path`` (a file, schema or database),
    logging in as ``user`` (default: the test login) with ``password``."""
    mode = "" if keep_history else "&keep_history=false"
    return _url(backend, path, password, user) + mode


def _url(backend: str, path: str, password: str | None, user: str | None) -> str:
    if backend == "sqlite":
        return f"sqlite://{path}?synchronous=normal"
    if backend == "postgresql":
        p = postgresql_params()
        host = quote(p.get("host", "localhost"), safe="")
        login = _login(user or p.get("user", "postgres"), password)
        return (f"postgresql://{login}@{host}:{p.get('port', '5432')}"
                f"/{p.get('dbname', 'postgres')}?schema={path}")
    s = MYSQL_SERVER
    socket = f"&unix_socket={s['unix_socket']}" if s["unix_socket"] else ""
    login = _login(user or str(s["user"]), password or str(s["passwd"]) or None)
    return f"mysql://{login}@{s['host']}:{s['port']}/{path}?driver={s['driver']}{socket}"


def zconfig_for(backend: str, path: str, directory: pathlib.Path) -> str:
    """A ZConfig file with one <zodb main> section on the test database ``path``."""
    if backend == "sqlite":
        section = f"<sqlite3>\n path {path}\n</sqlite3>"
    elif backend == "postgresql":
        section = f"<postgresql>\n dsn {POSTGRESQL_DSN}\n schema {path}\n</postgresql>"
    else:
        s = MYSQL_SERVER
        lines = [f"host {s['host']}", f"port {s['port']}", f"user {s['user']}", f"db {path}",
                 f"driver {s['driver']}"]
        lines += [f"passwd {s['passwd']}"] if s["passwd"] else []
        lines += [f"unix-socket {s['unix_socket']}"] if s["unix_socket"] else []
        section = "<mysql>\n" + "\n".join(lines) + "\n</mysql>"
    conf = directory / "zodb.conf"
    conf.write_text(f"%import zodbsql\n<zodb main>\n<zodbsql>\n{section}\n</zodbsql>\n</zodb>\n")
    return str(conf)
