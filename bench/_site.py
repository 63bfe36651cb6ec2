"""The demo site for the crawl benchmarks, served from its own process.

The crawl benchmarks measure Scrapy processes, so the site must not share
their interpreter (nor its GIL). ``python bench/_site.py --pages N`` serves
:class:`bloomcrawl.ops.demo_site.DemoSite` with every page pre-rendered (the first
contender would otherwise pay for rendering) and prints ``PORT <n>`` once it
listens. It adds to ``GET /__stats``:

* ``first_hit`` / ``last_hit``: ``time.monotonic()`` of the first and last
  page GET since the last reset (CLOCK_MONOTONIC is system-wide on Linux, so
  the benchmark process can compare them with its own clock);
* ``GET /__stats?brief=1``: the same document without the per-page ``hits``,
  cheap enough to poll several times a second during a crawl.

:class:`SiteProcess` starts it on a free port through the project's process
manager (:mod:`bloomcrawl.ops.cluster.processes`) and stops exactly that
process, by pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "crawler"))  # the working tree's bloomcrawl, installed or not

from bloomcrawl.ops.cluster.processes import (  # noqa: E402
    ManagedProcess,
    spawn,
    start_on_free_port,
)
from bloomcrawl.ops.noproxy import OPENER, http_ok  # noqa: E402

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 10.0


def _server_main(argv: list[str] | None = None) -> None:
    from aiohttp import web

    from bloomcrawl.ops.demo_site import DemoServer, DemoSite

    class TimedDemoServer(DemoServer):
        """Counts distinct pages as they are hit and remembers the first and last hit."""

        def __init__(self, site: DemoSite) -> None:
            super().__init__(site)
            self.first_hit: float | None = None
            self.last_hit: float | None = None
            self.distinct = 0

        def reset(self) -> None:
            super().reset()
            self.first_hit = self.last_hit = None
            self.distinct = 0

        async def _serve_page(self, request: web.Request, page: int) -> web.Response:
            if request.method == "GET":
                now = time.monotonic()
                if self.first_hit is None:
                    self.first_hit = now
                self.last_hit = now
                if self.hit_counts[page] == 0:
                    self.distinct += 1
            return await super()._serve_page(request, page)

        def brief(self) -> dict[str, Any]:
            total = sum(self.hit_counts)
            return {
                "pages": self.site.pages, "total": total, "distinct": self.distinct,
                "duplicates": total - self.distinct, "missing": self.site.pages - self.distinct,
                "not_found": self.not_found, "first_hit": self.first_hit,
                "last_hit": self.last_hit,
            }

        async def _stats(self, request: web.Request) -> web.Response:
            if request.query.get("brief"):
                return web.json_response(self.brief())
            return web.json_response({**self.stats(), **self.brief()})

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    site = DemoSite(args.pages)
    for page in range(site.pages):
        site.body(page, "127.0.0.1")  # render and cache every page now
    server = TimedDemoServer(site)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        runner = web.AppRunner(server.make_app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            tcp = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024,
                              shutdown_timeout=1.0)
            await tcp.start()
            sys.stdout.write("PORT %d\n" % runner.addresses[0][1])
            sys.stdout.flush()
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(serve())


class SiteProcess:
    """A demo-site process owned by the caller; use as a context manager."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.port = 0
        self.process: ManagedProcess | None = None

    @property
    def base(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    @property
    def url(self) -> str:
        return self.base + "/"

    def start(self) -> SiteProcess:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)

        def start_on(port: int) -> ManagedProcess:
            process = spawn("demo site", [sys.executable, str(Path(__file__).resolve()),
                                          "--pages", str(self.pages), "--port", str(port)],
                            env=env, port=port)
            stats = "http://127.0.0.1:%d/__stats?brief=1" % port
            return process.wait_ready(lambda: http_ok(stats), START_TIMEOUT_S)

        # a free port, and another one when a process bound it first
        self.process = start_on_free_port(start_on)
        self.port = self.process.port or 0
        return self

    def stop(self) -> None:
        """Stop the process this object started, by its pid."""
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout=STOP_TIMEOUT_S)

    def _request(self, path: str, method: str = "GET") -> dict[str, Any]:
        request = urllib.request.Request(self.base + path, method=method)
        with OPENER.open(request, timeout=HTTP_TIMEOUT_S) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data

    def brief(self) -> dict[str, Any]:
        """Counters without the per-page hits: pages, total, distinct, first_hit, last_hit..."""
        return self._request("/__stats?brief=1")

    def stats(self) -> dict[str, Any]:
        """Everything, with ``hits`` as {page: count} for the pages fetched at least once."""
        return self._request("/__stats")

    def reset(self) -> None:
        self._request("/__reset", method="POST")

    def __enter__(self) -> SiteProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    _server_main()
