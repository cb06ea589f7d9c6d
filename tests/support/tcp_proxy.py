"""A fault-injection TCP proxy for tests: put it between a client and Redis (or HTTP).

    with FaultProxy(("127.0.0.1", redis_port)) as proxy:
        client = redis.Redis(port=proxy.port)
        proxy.drop_replies(1, match=b"EVALSHA")   # Redis runs it, the client never hears back
        proxy.set_mode(Mode.BLACKHOLE)            # accept, never answer
        proxy.set_mode(Mode.PASS)                 # heal

Loopback only. One thread per connection multiplexes both directions with a
short ``select`` timeout, so a fault switched on from the test thread takes
effect within ~20 ms, and every socket is touched only by the thread that owns
it (no close-while-blocked-in-recv races). Faults:

- ``Mode.PASS``: forward both ways.
- ``Mode.RESET``: every open connection is reset (TCP RST to the client), and
  new ones are accepted and reset at once. ``reset_all()`` resets the open ones
  but stays in the current mode.
- ``drop_replies(n, match=..., then=...)``: the next ``n`` requests (client
  chunks containing ``match``, if given) are forwarded, and the upstream's
  reply to each is swallowed; then the connection is reset (``then="reset"``,
  the client sees ECONNRESET) or left hanging (``then="hang"``, the client
  times out). This is the "lost reply": the server did the work.
- ``Mode.BLACKHOLE``: accept, read and discard; never answer (open
  connections stop forwarding too).
- ``Mode.REFUSE``: the listening socket is closed, so connects are refused;
  open connections carry on. Leaving the mode listens on the same port again.
"""

from __future__ import annotations

import contextlib
import enum
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

_TICK_SECONDS = 0.02
_CHUNK_BYTES = 65536


class Mode(enum.StrEnum):
    PASS = "pass"
    RESET = "reset"
    BLACKHOLE = "blackhole"
    REFUSE = "refuse"


@dataclass
class ProxyStats:
    accepted: int = 0
    resets: int = 0
    replies_dropped: int = 0
    refused_upstream: int = 0


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN: the peer sees 'connection reset by peer'."""
    with contextlib.suppress(OSError):  # already dead: closing is all that is left
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Connection(threading.Thread):
    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        super().__init__(daemon=True, name=f"tcp-proxy-conn-{client.fileno()}")
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        self.reset_requested = False
        self.drop_pending: Literal["reset", "hang"] | None = None
        self.hanging = False

    def run(self) -> None:
        try:
            self._serve()
        finally:
            self.proxy._forget(self)

    def _serve(self) -> None:
        proxy = self.proxy
        if proxy.mode is Mode.RESET:
            proxy._count("resets")
            _reset(self.client)
            return
        if proxy.mode is not Mode.BLACKHOLE:
            try:
                self.upstream = socket.create_connection(proxy.upstream, timeout=2)
            except OSError:
                proxy._count("refused_upstream")
                _reset(self.client)
                return
            self.upstream.settimeout(None)
        open_ends = {self.client} | ({self.upstream} if self.upstream else set())
        with selectors.DefaultSelector() as selector:
            for sock in open_ends:
                selector.register(sock, selectors.EVENT_READ)
            while open_ends:
                if self.reset_requested or proxy.mode is Mode.RESET or proxy.closed:
                    proxy._count("resets")
                    self._close(reset=True)
                    return
                for key, _ in selector.select(_TICK_SECONDS):
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = sock.recv(_CHUNK_BYTES)
                    except OSError:
                        self._close(reset=True)
                        return
                    if not data:
                        # half-close: pass the FIN on, keep reading the other way
                        selector.unregister(sock)
                        open_ends.discard(sock)
                        other = self.upstream if sock is self.client else self.client
                        if other is not None:
                            try:
                                other.shutdown(socket.SHUT_WR)
                            except OSError:
                                open_ends.clear()
                        continue
                    if not self._forward(sock, data):
                        return
        self._close(reset=False)

    def _forward(self, source: socket.socket, data: bytes) -> bool:
        """Pass one chunk on, or apply a fault. False when the connection is gone."""
        proxy = self.proxy
        if proxy.mode is Mode.BLACKHOLE or self.hanging or self.upstream is None:
            return True
        try:
            if source is self.client:
                then = proxy._take_drop(data)
                if then is not None:
                    self.drop_pending = then  # armed before Redis can possibly answer
                self.upstream.sendall(data)
            elif self.drop_pending is not None:
                then, self.drop_pending = self.drop_pending, None
                proxy._count("replies_dropped")
                if then == "reset":
                    proxy._count("resets")
                    self._close(reset=True)
                    return False
                self.hanging = True
            else:
                self.client.sendall(data)
        except OSError:
            self._close(reset=True)
            return False
        return True

    def _close(self, *, reset: bool) -> None:
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            if reset:
                _reset(sock)
            else:
                sock.close()


class FaultProxy:
    """A TCP proxy on a free loopback port in front of ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int], *, port: int = 0) -> None:
        self.upstream = upstream
        self.mode = Mode.PASS
        self.stats = ProxyStats()
        self.closed = False
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._drops_left = 0
        self._drop_match: bytes | None = None
        self._drop_then: Literal["reset", "hang"] = "reset"
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self.port = port

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._listen()
        return self

    def stop(self) -> None:
        self.closed = True
        self._stop_listening()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.join(timeout=2)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    # -- faults ----------------------------------------------------------------

    def set_mode(self, mode: Mode) -> None:
        previous, self.mode = self.mode, Mode(mode)
        if self.mode is Mode.REFUSE and previous is not Mode.REFUSE:
            self._stop_listening()
        elif self.mode is not Mode.REFUSE and previous is Mode.REFUSE:
            self._listen()
        if self.mode is Mode.PASS:
            with self._lock:
                self._drops_left = 0

    @contextmanager
    def fault(self, mode: Mode) -> Iterator[FaultProxy]:
        """``with proxy.fault(Mode.BLACKHOLE): ...`` — back to PASS afterwards."""
        self.set_mode(mode)
        try:
            yield self
        finally:
            self.set_mode(Mode.PASS)

    def reset_all(self) -> int:
        """Reset every open connection now; returns how many were open."""
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            connection.reset_requested = True
        return len(connections)

    def drop_replies(
        self, count: int = 1, *, match: bytes | None = None, then: Literal["reset", "hang"] = "reset"
    ) -> None:
        """Forward the next ``count`` requests (containing ``match``) but swallow their replies."""
        with self._lock:
            self._drops_left = count
            self._drop_match = match
            self._drop_then = then

    def set_upstream(self, upstream: tuple[str, int]) -> None:
        """New connections go to ``upstream``; open ones keep theirs."""
        self.upstream = upstream

    def wait_for(self, stat: str, at_least: int, timeout_seconds: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_seconds
        while getattr(self.stats, stat) < at_least:
            if time.monotonic() > deadline:
                raise TimeoutError(f"proxy {stat}={getattr(self.stats, stat)}, expected >= {at_least}")
            time.sleep(_TICK_SECONDS / 2)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    # -- internals ---------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        listener.settimeout(_TICK_SECONDS * 5)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._accept_thread = threading.Thread(
            target=self._accept_loop, args=(listener,), daemon=True, name=f"tcp-proxy-{self.port}"
        )
        self._accept_thread.start()

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        thread, self._accept_thread = self._accept_thread, None
        if listener is not None:
            listener.close()
        if thread is not None:
            thread.join(timeout=2)

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by _stop_listening
            client.settimeout(None)
            connection = _Connection(self, client)
            with self._lock:
                self.stats.accepted += 1
                self._connections.add(connection)
            connection.start()

    def _forget(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _count(self, stat: str) -> None:
        with self._lock:
            setattr(self.stats, stat, getattr(self.stats, stat) + 1)

    def _take_drop(self, request: bytes) -> Literal["reset", "hang"] | None:
        with self._lock:
            if self._drops_left <= 0 or (self._drop_match is not None and self._drop_match not in request):
                return None
            self._drops_left -= 1
            return self._drop_then
