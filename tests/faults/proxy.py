"""A TCP proxy between workers and Redis that injects network faults on command.

Stdlib only: an asyncio event loop in a daemon thread, controlled from the
calling thread. It listens on 127.0.0.1 (a free port) and forwards every
connection to ``127.0.0.1:<upstream port>``; nothing else is ever dialled.

Faults, each a method:

* :meth:`FaultProxy.set_delay`: every chunk, either way, waits this long first;
* :meth:`FaultProxy.stall`: hold every byte (forward nothing, either way) for
  N seconds, then deliver what was held, in order;
* :meth:`FaultProxy.cut`: close every connection (FIN to both sides);
* :meth:`FaultProxy.reset`: abort every connection (RST to the client);
* :meth:`FaultProxy.drop_replies`: for the next ``count`` client packets that
  contain ``match``: forward the packet to Redis, wait until Redis answered
  (so it applied the command), swallow the answer and close the client's
  connection. The client sees a lost reply for a command that was applied;
  redis-py's Retry then sends it again;
* :meth:`FaultProxy.set_upstream`: new connections go to another Redis port
  (a failover); existing ones are cut unless asked not to;
* :meth:`FaultProxy.hold_from`: in the next client packet that contains
  ``match``, forward the bytes before it and hold the rest (and everything
  after, either way) until :meth:`FaultProxy.resume`: Redis has read part of
  a pipeline, as when it arrives in several reads;
* :meth:`FaultProxy.hold_connections`: every connection that sends a packet
  containing ``match`` forwards nothing more, either way, until
  :meth:`FaultProxy.resume`; the others go on (a worker's frontier calls held
  while its items are stored).

Bounded: at most ``max_connections`` at once (more are closed on accept),
reads of 64 KiB, and :meth:`FaultProxy.stop` closes everything and joins the
thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

HOST = "127.0.0.1"
CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 5.0
#: after the first byte of a reply to be dropped, the rest of it is awaited this long
REPLY_QUIET_S = 0.1
CONTROL_TIMEOUT_S = 10.0


@dataclass
class _Drop:
    match: bytes
    remaining: int


@dataclass(eq=False)
class _Connection:
    client_reader: asyncio.StreamReader
    client_writer: asyncio.StreamWriter
    upstream_reader: asyncio.StreamReader
    upstream_writer: asyncio.StreamWriter
    #: the reply to the packet just forwarded is to be swallowed
    swallow: bool = False
    #: it sent what :meth:`FaultProxy.hold_connections` matches: held until resume()
    held: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False


class FaultProxy:
    """A fault-injecting TCP proxy to a Redis on 127.0.0.1; use as a context manager."""

    def __init__(self, upstream_port: int, *, max_connections: int = 256) -> None:
        self.upstream_port = upstream_port
        self.max_connections = max_connections
        self.port = 0
        #: client packets that matched :meth:`drop_replies`, and replies swallowed for them
        self.packets_matched = 0
        self.replies_dropped = 0
        #: connections accepted so far
        self.accepted = 0
        #: packets split by :meth:`hold_from`
        self.splits = 0
        self._hold_match: bytes | None = None
        #: connections held by :meth:`hold_connections`, so far
        self.held_connections = 0
        self._conn_hold_match: bytes | None = None
        self._conns_open: asyncio.Event | None = None  # clear: matching connections held
        self._delay = 0.0
        self._open: asyncio.Event | None = None  # set: bytes flow; clear: stalled
        self._stall_handle: asyncio.TimerHandle | None = None
        self._drop: _Drop | None = None
        self._connections: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- life cycle ------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``: what the workers get as REDIS_URL."""
        return "redis://%s:%d/0" % (HOST, self.port)

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(CONTROL_TIMEOUT_S):
            raise RuntimeError("the fault proxy did not start")
        if self._error is not None:
            raise RuntimeError("the fault proxy could not listen: %s" % self._error)
        return self

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop, join the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        with contextlib.suppress(RuntimeError, TimeoutError):
            self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CONTROL_TIMEOUT_S)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- faults (called from any thread but the proxy's) ---------------------------

    def set_delay(self, seconds: float) -> None:
        """Delay every chunk forwarded, either way, by ``seconds`` (0: no delay)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self._delay = seconds

    def stall(self, seconds: float) -> None:
        """Forward nothing for ``seconds`` (returns at once), then deliver what was held."""
        self._call(self._stall(seconds))

    def hold_from(self, match: bytes) -> None:
        """In the next client packet containing ``match``, forward only what comes before
        it; then hold every byte, either way, until :meth:`resume`."""
        if not match:
            raise ValueError("match must not be empty")
        self._hold_match = match

    def hold_connections(self, match: bytes) -> None:
        """From now until :meth:`resume`, a connection whose client sends a packet containing
        ``match`` forwards neither it nor anything after, either way; the others flow."""
        if not match:
            raise ValueError("match must not be empty")
        self._call(self._hold_connections(match))

    def resume(self) -> None:
        """End a stall (or a hold) now."""
        self._call(self._resume())

    def cut(self) -> int:
        """Close every connection (FIN both ways); returns how many."""
        return int(self._call(self._close_all(rst=False)))

    def reset(self) -> int:
        """Abort every connection with an RST to the client; returns how many."""
        return int(self._call(self._close_all(rst=True)))

    def drop_replies(self, match: bytes, count: int = 1) -> None:
        """Swallow Redis's reply to the next ``count`` client packets containing ``match``.

        Each such packet reaches Redis and is applied; its reply never reaches
        the client, whose connection is closed once Redis has answered.
        """
        if not match or count < 1:
            raise ValueError("give a non-empty match and count >= 1")
        self._drop = _Drop(match, count)

    @property
    def drops_pending(self) -> int:
        drop = self._drop
        return drop.remaining if drop is not None else 0

    def set_upstream(self, port: int, *, cut: bool = True) -> None:
        """Send new connections to ``127.0.0.1:port``; cut the existing ones unless told not to."""
        self.upstream_port = port
        if cut:
            self.cut()

    @property
    def connections(self) -> int:
        return len(self._connections)

    # -- inside the loop ------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the fault proxy is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(CONTROL_TIMEOUT_S)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._open = asyncio.Event()
            self._open.set()
            self._conns_open = asyncio.Event()
            self._conns_open.set()
            self._server = loop.run_until_complete(
                asyncio.start_server(self._handle, HOST, 0, limit=CHUNK))
            self.port = int(self._server.sockets[0].getsockname()[1])
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.sleep(0))
            loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all(rst=False)

    async def _stall(self, seconds: float) -> None:
        assert self._open is not None and self._loop is not None
        if self._stall_handle is not None:
            self._stall_handle.cancel()
        self._open.clear()
        self._stall_handle = self._loop.call_later(seconds, self._open.set)

    async def _hold_connections(self, match: bytes) -> None:
        assert self._conns_open is not None
        self._conn_hold_match = match
        self._conns_open.clear()

    async def _resume(self) -> None:
        assert self._open is not None and self._conns_open is not None
        if self._stall_handle is not None:
            self._stall_handle.cancel()
            self._stall_handle = None
        self._open.set()
        self._conn_hold_match = None
        self._conns_open.set()

    async def _gate_connection(self, conn: _Connection, data: bytes | None) -> None:
        """Wait while ``conn`` is held by :meth:`hold_connections` (``data``: a client
        packet, which holds it when it matches)."""
        match = self._conn_hold_match
        if match is None:
            return
        if not conn.held and data is not None and match in data:
            conn.held = True
            self.held_connections += 1
        if conn.held:
            assert self._conns_open is not None
            await self._conns_open.wait()

    async def _close_all(self, *, rst: bool) -> int:
        connections = list(self._connections)
        for conn in connections:
            self._close(conn, rst=rst)
        return len(connections)

    def _close(self, conn: _Connection, *, rst: bool = False) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._connections.discard(conn)
        if rst:
            sock = conn.client_writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.client_writer.transport.abort()
        else:
            conn.client_writer.close()
        conn.upstream_writer.transport.abort()
        current = asyncio.current_task()
        for task in conn.tasks:
            if task is not current:
                task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if len(self._connections) >= self.max_connections:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.upstream_port, limit=CHUNK),
                CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            writer.transport.abort()  # Redis is down: the client sees the connection fail
            return
        conn = _Connection(reader, writer, up_reader, up_writer)
        self._connections.add(conn)
        conn.tasks = [asyncio.ensure_future(self._client_to_redis(conn)),
                      asyncio.ensure_future(self._redis_to_client(conn))]
        await asyncio.gather(*conn.tasks, return_exceptions=True)
        self._close(conn)

    async def _gate(self) -> None:
        assert self._open is not None
        await self._open.wait()
        if self._delay:
            await asyncio.sleep(self._delay)
            await self._open.wait()  # a stall that began meanwhile holds this chunk too

    async def _client_to_redis(self, conn: _Connection) -> None:
        try:
            while True:
                data = await conn.client_reader.read(CHUNK)
                if not data:
                    break
                await self._gate()
                await self._gate_connection(conn, data)
                match = self._hold_match
                if match is not None and match in data:
                    self._hold_match = None
                    at = data.index(match)
                    conn.upstream_writer.write(data[:at])
                    await conn.upstream_writer.drain()
                    assert self._open is not None
                    self._open.clear()  # held from here until resume()
                    self.splits += 1
                    await self._gate()
                    data = data[at:]
                drop = self._drop
                if drop is not None and drop.remaining > 0 and drop.match in data:
                    drop.remaining -= 1
                    if drop.remaining == 0:
                        self._drop = None
                    self.packets_matched += 1
                    conn.swallow = True
                conn.upstream_writer.write(data)
                await conn.upstream_writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._close(conn)

    async def _redis_to_client(self, conn: _Connection) -> None:
        try:
            while True:
                data = await conn.upstream_reader.read(CHUNK)
                if not data:
                    break
                if conn.swallow:
                    # Redis answered, so it applied the command: read the rest of the
                    # answer, forward none of it, and hang up on the client
                    deadline = time.monotonic() + CONNECT_TIMEOUT_S
                    while time.monotonic() < deadline:
                        try:
                            more = await asyncio.wait_for(conn.upstream_reader.read(CHUNK),
                                                          REPLY_QUIET_S)
                        except TimeoutError:
                            break
                        if not more:
                            break
                    self.replies_dropped += 1
                    break
                await self._gate()
                await self._gate_connection(conn, None)
                conn.client_writer.write(data)
                await conn.client_writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._close(conn)
