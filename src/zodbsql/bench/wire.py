"""Statements counted on the wire: a PostgreSQL relay between a contender and its server.

``zodbsql bench --server-statements`` routes the PostgreSQL contenders it creates through
a :class:`StatementRelay`, which forwards every byte and, in the client's direction,
notes the time of each statement the server is asked to run: a simple query (``Q``, one
per line of the server's log with ``log_statement = all``, even when it holds several
statements) and an extended-protocol execute (``E``: a prepared or parameterised
statement).  So RelStorage, which counts nothing itself, gets a statement count beside
zodbsql's own, and zodbsql's client-side count is checked against what the server sees.

The relay answers a TLS or GSS encryption request with "no" (the connection then goes on
in clear, on loopback), since it must read the messages.  Each forwarded message costs a
thread hop, so the relay slows the contenders it carries: compare seconds only between
contenders that all go through it, or leave it off.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from bisect import bisect_left, bisect_right

#: Startup codes (int32 after the length) of the requests to encrypt the connection.
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
#: Client messages that make the server run a statement.
STATEMENT_MESSAGES = (ord("Q"), ord("E"))


class StatementRelay:
    """Listens on a free loopback port and relays each connection to ``host:port``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._times: list[float] = []
        self._lock = threading.Lock()
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="zodbsql-bench-relay", daemon=True).start()

    # -- what the bench reads ----------------------------------------------------------------
    def statements_between(self, start: float, end: float) -> int:
        """Statements sent from ``start`` to ``end`` (``time.perf_counter()`` values:
        the monotonic clock every process of this machine shares)."""
        with self._lock:
            return bisect_right(self._times, end) - bisect_left(self._times, start)

    def forget_before(self, moment: float) -> None:
        with self._lock:
            del self._times[:bisect_left(self._times, moment)]

    def close(self) -> None:
        self._closed = True
        for each in [self._listener, *self._sockets]:
            try:
                each.close()
            except OSError:
                pass

    # -- relaying ----------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        for each in (client, server):
            each.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sockets += [client, server]
        try:
            if not self._start(client, server):
                return
            threading.Thread(target=_copy, args=(server, client), daemon=True).start()
            self._count_and_copy(client, server)
        except OSError:
            pass        # either side went away (or close() closed them): the relay ends
        finally:
            for each in (client, server):
                self._sockets.remove(each)
                try:
                    each.close()
                except OSError:
                    pass

    def _start(self, client: socket.socket, server: socket.socket) -> bool:
        """The startup phase: refuse encryption, forward the startup (or cancel) packet."""
        while True:
            head = _read_exactly(client, 8)
            if head is None:
                return False
            length, code = struct.unpack("!ii", head)
            body = _read_exactly(client, length - 8) if length > 8 else b""
            if body is None:
                return False
            if code in (SSL_REQUEST, GSSENC_REQUEST):
                client.sendall(b"N")
                continue
            server.sendall(head + body)
            return True

    def _count_and_copy(self, client: socket.socket, server: socket.socket) -> None:
        # Messages are a type byte, an int32 length (itself included) and the body:
        # only the five header bytes are read, bodies are skipped (a commit's states
        # may be megabytes).
        head = b""
        skip = 0
        while True:
            data = client.recv(65536)
            if not data:
                return
            # Timed before it goes on: the client can't have its answer (and end its
            # test) before the statement is noted.
            now = time.perf_counter()
            server.sendall(data)
            at, size = 0, len(data)
            while at < size:
                if skip:
                    step = min(skip, size - at)
                    skip -= step
                    at += step
                    continue
                step = min(5 - len(head), size - at)
                head += data[at:at + step]
                at += step
                if len(head) == 5:
                    if head[0] in STATEMENT_MESSAGES:
                        with self._lock:
                            self._times.append(now)
                    skip = struct.unpack_from("!i", head, 1)[0] - 4
                    head = b""


def _copy(source: socket.socket, target: socket.socket) -> None:
    while True:
        try:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
        except OSError:
            break
    for each in (source, target):
        try:
            each.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data
