"""The Prometheus exporter as a process of the test's own, and its scrapes.

An :class:`Exporter` is ``python -m bloomcrawl.ops.exporter`` on a free
127.0.0.1 port, started by the project's process manager and stopped by pid;
:meth:`~Exporter.scrape` is one GET /metrics, and :meth:`~Exporter.poll`
scrapes it from a thread every ``interval`` seconds (the fault suite checks
that every scrape answered). :func:`collector_registry` is the same collector
in the test's own process, for a test that reads the metrics without HTTP.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.error
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from bloomcrawl.ops.cluster.processes import ManagedProcess, free_port, spawn
from bloomcrawl.ops.noproxy import OPENER

from kit import CRAWLER
from kit.wait import wait_until

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass
class Scrape:
    """One GET /metrics."""

    at: float  # time.monotonic() when it was sent
    seconds: float
    status: int | None  # None: no HTTP answer at all
    body: str
    error: str = ""

    def value(self, name: str, labels: str = "") -> float | None:
        """The value of the sample ``name{labels}`` (labels as written by the exporter)."""
        wanted = name + ("{%s}" % labels if labels else "")
        for line in self.body.splitlines():
            if line.startswith(wanted + " "):
                return float(line.split()[-1])
        return None


def collector_registry(url: str) -> CollectorRegistry:
    """The exporter's collector of Redis at ``url``, in this process: every read of the
    registry is a fresh scrape of Redis."""
    from bloomcrawl.ops.exporter import ClusterCollector, build_registry, redis_client

    return build_registry(ClusterCollector(redis_client(url)))


class Exporter:
    """The exporter of ``redis_url`` (and of the scrapyd ``nodes``, if any), in ``workdir``.

    ``env``: more environment variables (SCRAPYD_USERNAME, ...); nothing of the
    caller's cluster is inherited. ``args``: more command-line options.
    ``http_timeout``: seconds a scrape may take.
    """

    def __init__(self, redis_url: str, workdir: Path, *, nodes: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, args: Sequence[str] = (),
                 http_timeout: float = 10.0) -> None:
        self.redis_url = redis_url
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "exporter.log"
        self.http_timeout = http_timeout
        self.cmd = [sys.executable, "-m", "bloomcrawl.ops.exporter", "--port", str(self.port),
                    "--bind", "127.0.0.1", "--redis-url", redis_url]
        if nodes:
            self.cmd += ["--scrapyd-nodes", ",".join(nodes)]
        self.cmd += args
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SCRAPYD_", "BLOOMCRAWL_", "REDIS_"))}
        self.env["PYTHONPATH"] = str(CRAWLER)
        self.env.update(env or {})
        self.process: ManagedProcess | None = None
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d/metrics" % self.port

    def start(self) -> Exporter:
        """Start it; returns once it answers HTTP. Nothing is scraped yet: the readiness
        check asks for /favicon.ico, which the exporter answers without collecting."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = spawn("exporter", self.cmd, log=self.log, cwd=self.workdir, env=self.env,
                             port=self.port)
        self.process.wait_ready(self._answers, START_TIMEOUT_S, what="the exporter")
        return self

    def _answers(self) -> bool:
        with OPENER.open(self.url.replace("/metrics", "/favicon.ico"), timeout=2):
            return True

    def scrape(self) -> Scrape:
        started = time.monotonic()
        try:
            with OPENER.open(self.url, timeout=self.http_timeout) as response:
                return Scrape(started, time.monotonic() - started, response.status,
                              response.read().decode(errors="replace"))
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            return Scrape(started, time.monotonic() - started, exc.code, body, str(exc))
        except OSError as exc:
            return Scrape(started, time.monotonic() - started, None, "", str(exc))

    def wait_for(self, check: str, timeout: float = 30.0) -> Scrape:
        """Scrape until the body holds the line ``check``; that scrape."""
        last: list[Scrape] = []

        def holds() -> bool:
            last[:] = [self.scrape()]
            return check in last[0].body.splitlines()

        wait_until(holds, timeout, interval=0.2,
                   what=lambda: "%r on /metrics; last: %s" % (check, last[:1]))
        return last[0]

    def poll(self, interval: float) -> Exporter:
        """Scrape every ``interval`` s from a thread, into :attr:`scrapes`, until stopped."""

        def run() -> None:
            while not self._stop.wait(interval):
                self.scrapes.append(self.scrape())

        self._thread = threading.Thread(target=run, name="exporter-poll", daemon=True)
        self._thread.start()
        return self

    def failures(self) -> list[Scrape]:
        """Scrapes that did not answer 200 within the HTTP timeout."""
        return [s for s in self.scrapes if s.status != 200]

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(self.http_timeout + 1)
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout=STOP_TIMEOUT_S)

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
