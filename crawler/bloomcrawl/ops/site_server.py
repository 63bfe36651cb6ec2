"""Serving a local website: from a daemon thread, or in the foreground until a signal.

The demo site (:mod:`bloomcrawl.ops.demo_site`) and the hosts site
(:mod:`bloomcrawl.ops.hosts_site`) are aiohttp apps served the same way, by
tests and benches in a thread and by ``python -m`` as a process; this module
is that way, once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar

from aiohttp import web

#: seconds a stopping site gives open connections
SHUTDOWN_TIMEOUT_S = 1.0
#: seconds a caller waits for the event loop's thread to do something for it
LOOP_ANSWER_TIMEOUT_S = 10.0


class SiteServer(Protocol):
    """What a site gives this module: its app, and a way to forget what it counted."""

    def make_app(self) -> web.Application: ...

    def reset(self) -> None: ...


ServerT = TypeVar("ServerT", bound=SiteServer)


async def serve(server: SiteServer, host: str, port: int, stop: asyncio.Event, *,
                on_ready: Callable[[int], None], access_log: bool = False) -> None:
    """Serve until ``stop`` is set; ``on_ready`` gets the bound port (``port=0`` picks one)."""
    runner = web.AppRunner(
        server.make_app(),
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
    )
    await runner.setup()
    try:
        tcp_site = web.TCPSite(runner, host, port, backlog=1024,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await tcp_site.start()
        on_ready(int(runner.addresses[0][1]))
        await stop.wait()
    finally:
        await runner.cleanup()


async def serve_until_signalled(server: SiteServer, host: str, port: int, *,
                                on_ready: Callable[[int], None],
                                access_log: bool = False) -> None:
    """Serve until SIGINT or SIGTERM (a process's main coroutine)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await serve(server, host, port, stop, on_ready=on_ready, access_log=access_log)


class ThreadedSite(Generic[ServerT]):
    """``server`` served from a daemon thread; also a context manager.

    :meth:`start` returns once the site listens (``port`` is then the bound
    one), or raises naming ``what`` and the address it could not take.
    """

    def __init__(self, server: ServerT, *, host: str, port: int, what: str) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.what = what
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="bloomcrawl: " + what,
                                        daemon=True)

    def start(self, timeout: float = 10.0) -> Self:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"{self.what} did not start within {timeout} s")
        if self._error is not None:
            raise RuntimeError(f"{self.what} could not listen on {self.host}:{self.port}:"
                               f" {self._error}") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def reset(self) -> None:
        """``server.reset()``, in the event loop's thread while it runs."""
        if self._loop is None:
            self.server.reset()
            return
        done = threading.Event()

        def reset_in_loop() -> None:
            self.server.reset()
            done.set()

        self._loop.call_soon_threadsafe(reset_in_loop)
        if not done.wait(LOOP_ANSWER_TIMEOUT_S):
            raise RuntimeError(f"the event loop of {self.what} did not answer within"
                               f" {LOOP_ANSWER_TIMEOUT_S:g} s")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        def ready(port: int) -> None:
            self.port = port
            self._ready.set()

        await serve(self.server, self.host, self.port, self._stop, on_ready=ready)
