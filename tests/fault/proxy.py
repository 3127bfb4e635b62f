"""A TCP proxy that can cut a database session exactly while its COMMIT is in flight.

It relays bytes both ways between clients and one server.  The client-to-server stream
is parsed into protocol messages (PostgreSQL or MySQL framing) so the proxy knows when a
COMMIT goes by.  Armed (``arm``), it treats the next COMMITs in one of two ways:

* ``FORWARD``: the COMMIT reaches the server, the proxy waits for the server's answer
  (so the commit has certainly happened), drops that answer and closes both sockets.
  The client is left not knowing whether its transaction committed.
* ``DROP``: the COMMIT is never sent; both sockets are closed.  The server sees the
  session end inside a transaction and rolls it back: certainly not committed.

The server is never touched, so the proxy may front a shared server.  TLS must be off
between client and proxy (``sslmode=disable``; MariaDB without TLS), else the proxy can't
see the statements; ``cuts`` stays 0 then, and the tests assert it.
"""
from __future__ import annotations

import enum
import re
import socket
import struct
import threading
from typing import Callable

# COMMIT in its spellings, and the commit of a prepared (PostgreSQL) or XA (MySQL)
# transaction, as the last statement of what one message carries.
_COMMIT = re.compile(rb"^\s*(XA\s+)?(COMMIT|END)\b[^;]*;?\s*$", re.IGNORECASE)
ANSWER_TIMEOUT = 10.0
ACCEPT_POLL = 0.1
PG_SPECIAL_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest


class Mode(enum.Enum):
    FORWARD = "forward"   # the server commits; its answer never reaches the client
    DROP = "drop"         # the server never receives the COMMIT


def is_commit(sql: bytes) -> bool:
    """Is the last statement of ``sql`` a COMMIT?"""
    last = sql.rstrip().rstrip(b";").rsplit(b";", 1)[-1]
    return bool(_COMMIT.match(last))


class Cut(Exception):
    """Raised inside a session's client pump to end it."""


class Framer:
    """Splits one direction of a protocol into messages; ``commit_at`` says whether a
    message completes a COMMIT (then the proxy cuts the session after/instead of it)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        messages: list[bytes] = []
        while True:
            size = self.next_size()
            if size is None or len(self.buffer) < size:
                return messages
            messages.append(self.buffer[:size])
            self.buffer = self.buffer[size:]

    def next_size(self) -> int | None:
        raise NotImplementedError

    def commit_at(self, message: bytes) -> bool:
        """True when ``message`` is the one after which the server has committed."""
        raise NotImplementedError

    def starts_commit(self, message: bytes) -> bool:
        """True when ``message`` is the first one that would make the server commit."""
        return self.commit_at(message)

    @staticmethod
    def answered(reply: bytes) -> bool:
        """Does ``reply`` (the server's bytes since the COMMIT) hold its whole answer?"""
        raise NotImplementedError


class PostgreSQLFramer(Framer):
    """PostgreSQL frontend messages: untyped startup messages first, then type + length.

    A simple query ``Q`` whose text is COMMIT commits by itself.  In the extended
    protocol (psycopg prepares a statement it runs often, COMMIT included) the Bind of a
    statement whose Parse text was COMMIT starts it and the next Sync completes it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.startup = True
        self.statements: dict[bytes, bytes] = {}   # prepared name -> SQL text
        self.commit_bound = False

    def next_size(self) -> int | None:
        if self.startup:
            if len(self.buffer) < 8:
                return None
            length, code = struct.unpack("!ii", self.buffer[:8])
            if code not in PG_SPECIAL_REQUESTS:
                self.startup = False  # the StartupMessage itself; typed messages follow
            return length
        if len(self.buffer) < 5:
            return None
        return 1 + struct.unpack("!i", self.buffer[1:5])[0]

    def _note(self, message: bytes) -> None:
        kind, body = message[:1], message[5:]
        if kind == b"P":
            name, rest = body.split(b"\0", 1)
            self.statements[name] = rest.split(b"\0", 1)[0]
        elif kind == b"C" and body[:1] == b"S":
            self.statements.pop(body[1:].split(b"\0", 1)[0], None)
        elif kind == b"B":
            statement = body.split(b"\0", 2)[1]
            self.commit_bound = is_commit(self.statements.get(statement, b""))

    def starts_commit(self, message: bytes) -> bool:
        if message[:1] == b"Q":
            return is_commit(message[5:].rstrip(b"\0"))
        if message[:1] == b"B":
            statement = message[5:].split(b"\0", 2)[1]
            return is_commit(self.statements.get(statement, b""))
        return False

    @staticmethod
    def answered(reply: bytes) -> bool:
        # Backend messages up to ReadyForQuery ('Z'): the COMMIT (and Sync) are done.
        while len(reply) >= 5:
            size = 1 + struct.unpack("!i", reply[1:5])[0]
            if reply[:1] == b"Z" and len(reply) >= size:
                return True
            reply = reply[size:]
        return False

    def commit_at(self, message: bytes) -> bool:
        if self.startup or len(message) < 5:
            return False
        if message[:1] == b"Q":
            return is_commit(message[5:].rstrip(b"\0"))
        self._note(message)
        if message[:1] == b"S" and self.commit_bound:
            self.commit_bound = False
            return True
        return False


class MySQLFramer(Framer):
    """MySQL client packets: 3-byte length, sequence number, payload.  COMMIT is a
    COM_QUERY (0x03) whose text is COMMIT (mysqlclient's mysql_commit and PyMySQL's
    commit() both send that)."""

    COM_QUERY = 0x03

    def next_size(self) -> int | None:
        if len(self.buffer) < 4:
            return None
        return 4 + int.from_bytes(self.buffer[:3], "little")

    def commit_at(self, message: bytes) -> bool:
        return len(message) > 5 and message[4] == self.COM_QUERY and is_commit(message[5:])

    @staticmethod
    def answered(reply: bytes) -> bool:
        # One whole packet: the OK (or error) packet of the COMMIT.
        return len(reply) >= 4 and len(reply) >= 4 + int.from_bytes(reply[:3], "little")


FRAMERS: dict[str, Callable[[], Framer]] = {
    "postgresql": PostgreSQLFramer,
    "mysql": MySQLFramer,
}


class Session:
    """One client connection and its server connection, with a pump thread each way."""

    def __init__(self, proxy: "CommitCutProxy", client: socket.socket,
                 server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.framer = FRAMERS[proxy.protocol]()
        self.muted = threading.Event()      # server bytes are no longer relayed
        self.answered = threading.Event()   # the server answered after muting
        self.closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        for target in (self._client_to_server, self._server_to_client):
            threading.Thread(target=target, daemon=True, name="proxy-pump").start()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _client_to_server(self) -> None:
        try:
            while True:
                data = self.client.recv(65536)
                if not data:
                    return
                for message in self.framer.feed(data):
                    self._relay(message)
        except (OSError, Cut):
            pass
        finally:
            self.close()

    def _relay(self, message: bytes) -> None:
        starts = self.framer.starts_commit(message)
        done = self.framer.commit_at(message)
        mode = self.proxy.take_cut(starts and self.proxy.mode is Mode.DROP or
                                   done and self.proxy.mode is Mode.FORWARD)
        if mode is Mode.DROP:
            raise Cut()  # not sent: the server rolls back when the session ends
        if mode is Mode.FORWARD:
            self.muted.set()
            self.server.sendall(message)
            if not self.answered.wait(ANSWER_TIMEOUT):
                self.proxy.unanswered += 1
            raise Cut()
        self.server.sendall(message)

    def _server_to_client(self) -> None:
        reply = b""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    return
                if self.muted.is_set():
                    reply += data  # the commit's answer: swallowed
                    if self.framer.answered(reply):
                        self.answered.set()
                    continue
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            self.answered.set()
            if not self.muted.is_set():
                self.close()


class CommitCutProxy:
    """Listens on a free loopback port and relays to ``(host, port)``.

    ``arm(mode, count)`` makes the next ``count`` COMMITs (any session) be cut in
    ``mode``; ``cuts`` counts the cuts made.  Unarmed, it only relays.
    """

    def __init__(self, protocol: str, host: str, port: int) -> None:
        if protocol not in FRAMERS:
            raise ValueError(f"protocol must be one of {sorted(FRAMERS)}, got {protocol!r}")
        self.protocol = protocol
        self.upstream = (host, port)
        self.mode: Mode | None = None
        self.remaining = 0
        self.cuts = 0
        self.unanswered = 0   # FORWARD cuts whose answer never came (server trouble)
        self.sessions: list[Session] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(ACCEPT_POLL)  # so close() needn't wake a blocked accept
        self.port: int = self._listener.getsockname()[1]
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="proxy-accept")
        self._thread.start()

    def arm(self, mode: Mode, count: int = 1) -> None:
        with self._lock:
            self.mode = mode
            self.remaining = count

    def disarm(self) -> None:
        with self._lock:
            self.mode = None
            self.remaining = 0

    def take_cut(self, wanted: bool) -> Mode | None:
        """The mode to cut in if this COMMIT is to be cut (one of the armed ones)."""
        if not wanted:
            return None
        with self._lock:
            if self.mode is None or self.remaining <= 0:
                return None
            self.remaining -= 1
            self.cuts += 1
            mode = self.mode
            if self.remaining == 0:
                self.mode = None
            return mode

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self.upstream, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = Session(self, client, server)
            with self._lock:
                self.sessions = [s for s in self.sessions if not s.closed] + [session]
            session.start()

    def close(self) -> None:
        self._stopped = True
        self._listener.close()
        with self._lock:
            sessions = list(self.sessions)
        for session in sessions:
            session.close()
        self._thread.join(5)

    def __enter__(self) -> "CommitCutProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
