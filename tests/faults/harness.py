"""One crawl under one fault: real workers, Redis behind the fault proxy, the demo site.

A :class:`FaultRun` starts (all on 127.0.0.1) a redis-server, a
:class:`~faults.proxy.FaultProxy` in front of it, the demo site, an exporter
process scraped every 0.5 s, and N ``scrapy crawl site`` workers whose
REDIS_URL is the proxy. A scenario then injects its fault (waiting for a
fraction of the site with :meth:`FaultRun.wait_pages`, marking the fault's
end with :meth:`FaultRun.fault_over`), and :meth:`FaultRun.finish` waits,
bounded, for the crawl to end and the workers to close, and measures:

``lost``
    reachable pages the site never served (its ``missing``);
``fetched_twice``
    extra GETs of pages the site served more than once;
``items_duplicated``
    extra items stored in ``site:items`` for a page;
``items_lost``
    pages the site served that no item is stored for (their response was
    never processed, or its item was dropped);
``stats_error``
    ``|site:stats pages - responses the site served| + |site:stats items -
    page responses the site served|``: the ``site`` spider yields one item
    per page, so both shared counters have an exact count at the site
    (None for a contender without shared stats);
``recover_s``
    seconds from the end of the fault until the site served
    :data:`RECOVERED_PAGES` more pages (more than can have been in flight),
    or the last one (None: nothing was left to fetch; inf: never).

:meth:`Outcome.problems` checks the issue's invariants; a scenario relaxes
only what its docstring says cannot hold for that fault. The redis-server,
the exporter and the workers are the kit's (:mod:`kit.redis`,
:mod:`kit.exporter`, :mod:`kit.workers`): every process is stopped by the
pid it was started with, SIGCONT first when it was stopped.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import redis

from faults.proxy import FaultProxy

from kit.exporter import Exporter, Scrape
from kit.redis import RedisServer
from kit.wait import WaitTimeout, wait_until
from kit.workers import BASE_SETTINGS, Worker, merge_settings

POLL_S = 0.1
#: settings every worker of the suite gets, over the kit's: short leases, a quick idle
#: close, one host (the local site) whose budget is every worker's whole concurrency
FAULT_SETTINGS = merge_settings(BASE_SETTINGS, {
    "CONCURRENT_REQUESTS": "8",
    "MAX_IDLE_TIME_BEFORE_CLOSE": "1",
    "SCHEDULER_LEASE_TIMEOUT": "3",
    "SCHEDULER_REAP_INTERVAL": "1",
    "BLOOMFILTER_CAPACITY": "100000",
})
#: the crawl is over (or wedged) when no page was served for this long
NO_PROGRESS_S = 10.0
#: after that, every worker must have exited within this many seconds
CLOSE_BOUND_S = 30.0
#: how long a crawl may take at most, fault included
CRAWL_TIMEOUT_S = 120.0

#: pages served after a fault before the crawl counts as moving again: more than
#: 2 workers x CONCURRENT_REQUESTS can have had in flight when it ended
RECOVERED_PAGES = 17

#: the name under which a test's report carries an outcome's row of the summary table
SUMMARY_PROPERTY = "fault_outcome"
#: what the summary table's columns mean
SUMMARY_NOTE = (
    "pages lost: never fetched; items lost: fetched, no item stored; stats error:"
    " |pages - responses served| + |items - pages served|; recover s: from the end of"
    " the fault until 17 more pages (or the last one) were served")


@dataclass(frozen=True)
class Contender:
    """How to run a ``site`` worker: bloomcrawl's project, or a benchmark contender."""

    key: str
    label: str
    settings: dict[str, str]
    #: "redis": seeds go to ``site:start_urls``; "argument": ``-a start_url=``
    start: str = "redis"
    #: SCRAPY_SETTINGS_MODULE (None: scrapy.cfg's, i.e. bloomcrawl's project)
    settings_module: str | None = None
    #: import directories after crawler/ and tests/ (the benchmark's modules)
    pythonpath: tuple[Path, ...] = ()
    #: the contender keeps bloomcrawl's shared stats (``site:stats``)
    shared_stats: bool = True
    #: bytes only in the worker's packets that take a request from the queue
    #: (None: bloomcrawl's lease script, see :func:`faults.scenarios.lease_packet_marker`)
    pop_marker: bytes | None = None


BLOOMCRAWL = Contender("bloomcrawl", "bloomcrawl", {})


class Site(Protocol):
    """The demo site as the harness sees it (in a thread or in its own process)."""

    pages: int

    @property
    def url(self) -> str: ...

    def page_url(self, page: int) -> str: ...

    def progress(self) -> tuple[int, int]:
        """(GETs of pages, distinct pages served)."""
        ...

    def counts(self) -> dict[str, Any]:
        """``/__stats``: total, distinct, missing, robots, not_found, hits {page: n}."""
        ...


#: the longest a page waits while the site holds its answers (a scenario that never
#: releases them does not hang the site)
HOLD_MAX_S = 60.0


def _holding_server(site: Any, delay_ms: float) -> Any:
    """A demo site's server that can hold its pages' answers (:meth:`ThreadSite.hold`)."""
    from bloomcrawl.ops.demo_site import DemoServer

    class HoldingServer(DemoServer):
        def __init__(self) -> None:
            super().__init__(site, delay_ms=delay_ms)
            self.answering = threading.Event()
            self.answering.set()
            #: requests waiting for their answer now
            self.held = 0

        async def _serve_page(self, request: Any, page: int) -> Any:
            if not self.answering.is_set():
                self.held += 1
                deadline = time.monotonic() + HOLD_MAX_S
                try:
                    while not self.answering.is_set() and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                finally:
                    self.held -= 1
            return await super()._serve_page(request, page)

    return HoldingServer()


class ThreadSite:
    """:func:`bloomcrawl.ops.demo_site.serve_in_thread`, in the test process; it can hold
    its pages' answers for a while (:meth:`hold`)."""

    def __init__(self, pages: int, delay_ms: float = 0.0) -> None:
        from bloomcrawl.ops.demo_site import DemoSite, RunningSite

        self.pages = pages
        self.running = RunningSite(DemoSite(pages), host="127.0.0.1", port=0,
                                   delay_ms=delay_ms)
        self.running.server = _holding_server(self.running.site, delay_ms)
        self.running.start()

    def hold(self) -> None:
        """From now until :meth:`answer`, a page asked for is answered only then."""
        self.running.server.answering.clear()

    def answer(self) -> None:
        self.running.server.answering.set()

    @property
    def held(self) -> int:
        """Requests for pages waiting for their answer now."""
        return int(self.running.server.held)

    @property
    def url(self) -> str:
        return self.running.url

    def page_url(self, page: int) -> str:
        return self.running.page_url(page)

    def progress(self) -> tuple[int, int]:
        hits = self.running.hits()
        return sum(hits), sum(1 for h in hits if h)

    def counts(self) -> dict[str, Any]:
        return self.running.stats()

    def stop(self) -> None:
        self.answer()
        self.running.stop()


def start_worker(name: str, contender: Contender, workdir: Path, *, redis_url: str,
                 start_url: str, settings: dict[str, str], spider: str = "site") -> Worker:
    """One ``scrapy crawl`` worker of ``contender`` (the kit's launcher), started."""
    return Worker(name, redis_url, workdir, merge_settings(contender.settings, settings),
                  spider=spider, base=FAULT_SETTINGS,
                  args={"start_url": start_url} if contender.start == "argument" else None,
                  pythonpath=contender.pythonpath,
                  settings_module=contender.settings_module).start()


@dataclass
class Outcome:
    """What one run measured; see the module docstring."""

    scenario: str
    contender: str
    pages: int
    lost: int
    fetched_twice: int
    items_duplicated: int
    items_lost: int
    stats_error: int | None
    recover_s: float | None
    site: dict[str, Any]
    shared: dict[str, int]
    items_stored: int
    exit_codes: dict[str, int | None]
    wedged: list[str]
    scrapes: int
    scrape_failures: list[str]
    seconds: float
    #: what the scenario saw while injecting its fault
    facts: dict[str, Any] = field(default_factory=dict)
    #: every GET /metrics, in order, and the exporter's log
    scrape_results: list[Scrape] = field(default_factory=list)
    exporter_log: str = ""
    logs: dict[str, str] = field(default_factory=dict)  # name -> log tail
    log_files: dict[str, Path] = field(default_factory=dict)
    #: the pages fetched with no item stored
    items_lost_pages: list[int] = field(default_factory=list)
    #: :meth:`FaultRun.moment`: a moment's label -> {page: GETs the site had served}
    moments: dict[str, dict[int, int]] = field(default_factory=dict)

    def log_text(self, worker: str) -> str:
        return self.log_files[worker].read_text(errors="replace")

    def all_logs(self) -> str:
        return "\n".join(self.log_text(name) for name in self.log_files)

    @property
    def requeued(self) -> int:
        return self.shared.get("requeued", 0)

    @property
    def site_responses(self) -> int:
        """Responses the site served to the crawl: pages, plus robots.txt."""
        return int(self.site["total"]) + int(self.site.get("robots", 0))

    @property
    def page_responses(self) -> int:
        """Pages the site served, re-fetches included: one item each."""
        return int(self.site["total"])

    def problems(self, *, lost: bool = True, items: bool = True, double_fetch: bool = True,
                 stats: bool = True, exits: bool = True, clean_logs: bool = True,
                 metrics: bool = True) -> list[str]:
        """The invariants that do not hold (those switched off are not checked).

        ``lost``: every reachable page crawled; ``items``: every page crawled
        has its item stored, and an item is stored twice only for a page
        fetched twice; ``double_fetch``: every extra fetch is a requeued
        lease; ``stats``: the shared ``pages`` and ``items`` equal the
        responses the site served; ``exits``: every worker closed by itself, with 0, in
        time; ``clean_logs``: no worker logged an unhandled exception (a
        dead loop); ``metrics``: /metrics answered 200 every time.
        """
        out = []
        if lost and self.lost:
            out.append("%d of %d pages never crawled" % (self.lost, self.pages))
        if items and self.items_lost:
            out.append("%d crawled pages have no item stored: %s" % (
                self.items_lost, self.describe_pages(self.items_lost_pages)))
        if items and self.items_duplicated > self.fetched_twice:
            out.append("%d extra items stored, but only %d pages fetched twice"
                       % (self.items_duplicated, self.fetched_twice))
        if double_fetch and self.fetched_twice > self.requeued:
            out.append("%d extra fetches, but only %d leases requeued"
                       % (self.fetched_twice, self.requeued))
        if stats and self.stats_error:
            out.append("shared stats pages=%s items=%s; the site served %d responses, %d of"
                       " them pages" % (self.shared.get("pages"), self.shared.get("items"),
                                        self.site_responses, self.page_responses))
        if exits:
            if self.wedged:
                out.append("workers %s did not close within %.0f s of the crawl's end"
                           % (self.wedged, CLOSE_BOUND_S))
            bad = {n: c for n, c in self.exit_codes.items() if c not in (0, None)}
            if bad:
                out.append("workers exited with %s" % bad)
        if clean_logs:
            dirty = [name for name in self.log_files if "Traceback" in self.log_text(name)]
            if dirty:
                out.append("unhandled exceptions (Traceback) in the logs of %s" % dirty)
        if metrics and self.scrape_failures:
            out.append("/metrics failed %d of %d times: %s" % (
                len(self.scrape_failures), self.scrapes, self.scrape_failures[:3]))
        return out

    def check(self, **switches: bool) -> None:
        """Raise AssertionError naming every invariant that does not hold, with the logs."""
        problems = self.problems(**switches)
        if problems:
            raise AssertionError("%s under %s:\n  %s\n%s" % (
                self.contender, self.scenario, "\n  ".join(problems), self.log_tails()))

    def describe_pages(self, pages: list[int], most: int = 10) -> str:
        """Each page's GETs at the end and at each recorded moment: when it was fetched."""
        hits = self.site.get("hits") or {}
        out = []
        for page in sorted(pages)[:most]:
            at = "".join(", %d by %s" % (seen.get(page, 0), label)
                          for label, seen in self.moments.items())
            out.append("page %d (%d GETs%s)" % (page, int(hits.get(str(page), 0)), at))
        return "; ".join(out) + ("; ..." if len(pages) > most else "")

    def log_tails(self) -> str:
        return "\n".join("--- %s\n%s" % (name, tail) for name, tail in self.logs.items())

    def row(self) -> list[str]:
        return [self.scenario, self.contender, str(self.lost), str(self.fetched_twice),
                str(self.items_lost), str(self.items_duplicated),
                "n/a" if self.stats_error is None else str(self.stats_error),
                format_seconds(self.recover_s),
                "%d/%d" % (sum(1 for c in self.exit_codes.values() if c == 0),
                           len(self.exit_codes)),
                "%.0f" % self.seconds]


TABLE_HEADER = ["fault", "contender", "pages lost", "fetched twice", "items lost",
                "items duplicated",
                "stats error", "recover s", "workers exit 0", "run s"]


def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value == float("inf"):
        return "never"
    return "%.1f" % value


def format_table(rows: list[list[str]], header: list[str] = TABLE_HEADER) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


class FaultRun:
    """One crawl of the demo site by real workers through the fault proxy; see the module doc."""

    def __init__(self, workdir: Path, scenario: str, *, contender: Contender = BLOOMCRAWL,
                 pages: int = 200, workers: int = 2, settings: dict[str, str] | None = None,
                 redis_server: RedisServer | None = None, site: Site | None = None,
                 seeds: list[str] | None = None, exporter: bool = True,
                 spider: str = "site", site_delay_ms: float = 0.0) -> None:
        if site is not None and site_delay_ms:
            raise ValueError("site_delay_ms is for the run's own site: give the site its delay")
        self.workdir = workdir
        self.scenario = scenario
        self.contender = contender
        self.n_workers = workers
        self.settings = dict(settings or {})
        self.spider = spider
        workdir.mkdir(parents=True, exist_ok=True)
        self.redis = redis_server or RedisServer(workdir / "redis")
        #: more redis-servers a scenario started (a replica); stopped with the run
        self.other_servers: list[RedisServer] = []
        self._own_site = site is None
        self.site: Site = site if site is not None else ThreadSite(pages, site_delay_ms)
        self.pages = self.site.pages
        self.seeds = seeds
        self.want_exporter = exporter
        self.proxy: FaultProxy | None = None
        self.exporter: Exporter | None = None
        self.workers: list[Worker] = []
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, GETs, distinct)
        self.started = 0.0
        self.fault_end: float | None = None
        #: :meth:`moment`'s records
        self.moments: dict[str, dict[int, int]] = {}
        #: what :meth:`finish` measured
        self.outcome: Outcome | None = None
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="fault-monitor", daemon=True)

    # -- set-up -----------------------------------------------------------------

    def start(self, *, workers: bool = True) -> FaultRun:
        self.started = time.monotonic()
        if not self.redis.running():
            self.redis.start()
        self.proxy = FaultProxy(self.redis.port).start()
        if self.want_exporter:
            self.exporter = Exporter(self.proxy.url, self.workdir).start().poll(0.5)
        if self.contender.start == "redis":
            self.seed(self.seeds if self.seeds is not None else [self.site.url])
        self._monitor.start()
        if workers:
            self.start_workers()
        return self

    def seed(self, entries: list[str]) -> None:
        client = self.client()
        try:
            client.rpush("%s:start_urls" % self.spider, *entries)
        finally:
            client.close()

    def start_workers(self, n: int | None = None) -> None:
        for _ in range(self.n_workers if n is None else n):
            name = "%s-w%d" % (self.contender.key, len(self.workers))
            self.workers.append(start_worker(
                name, self.contender, self.workdir, redis_url=self.redis_url,
                start_url=self.site.url, settings=self.settings, spider=self.spider))

    @property
    def redis_url(self) -> str:
        assert self.proxy is not None
        return self.proxy.url

    def client(self) -> redis.Redis:
        """A client straight to Redis (not through the proxy)."""
        return self.redis.client()

    # -- during the crawl ---------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                total, distinct = self.site.progress()
                self.samples.append((time.monotonic(), total, distinct))
            except OSError:  # the site's process is busy; the next sample will do
                pass
            self._stop.wait(POLL_S)

    def distinct(self) -> int:
        return self.site.progress()[1]

    def wait_pages(self, fraction: float, timeout: float = 60.0) -> int:
        """Wait until ``fraction`` of the pages were served; returns how many were."""
        want = max(1, int(fraction * self.pages))

        def served() -> int:
            distinct = self.distinct()
            if distinct < want and not any(w.running for w in self.workers):
                raise AssertionError("%s: the workers exited with %d of %d pages served\n%s"
                                     % (self.scenario, distinct, self.pages, self._tails()))
            return distinct if distinct >= want else 0

        try:
            return wait_until(served, timeout, interval=0.02)
        except WaitTimeout:
            raise AssertionError("%s: the crawl reached %d of %d pages (waiting for %d)\n%s"
                                 % (self.scenario, self.distinct(), self.pages, want,
                                    self._tails())) from None

    def moment(self, label: str) -> None:
        """Record which pages the site has served now (a failure names them by it)."""
        hits = self.site.counts().get("hits") or {}
        self.moments[label] = {int(page): int(n) for page, n in hits.items()}

    def fault_over(self) -> None:
        """The fault is gone (or, for an instant one, was injected) now."""
        self.fault_end = time.monotonic()

    # -- the end ------------------------------------------------------------------------

    def finish(self, *, no_progress_s: float = NO_PROGRESS_S,
               close_bound_s: float = CLOSE_BOUND_S) -> Outcome:
        """Wait (bounded) for the crawl to end and every worker to exit, then measure."""
        last = {"total": -1, "change": time.monotonic()}

        def over() -> bool:
            """Every page served, no worker left, or no page served for no_progress_s."""
            total, distinct = self.site.progress()
            if total != last["total"]:
                last.update(total=total, change=time.monotonic())
            return (distinct >= self.pages or not any(w.running for w in self.workers)
                    or time.monotonic() - last["change"] > no_progress_s)

        try:
            wait_until(over, CRAWL_TIMEOUT_S, interval=POLL_S)
        except WaitTimeout:
            pass  # measured as it is: the outcome shows what was not done
        end = time.monotonic() + close_bound_s
        wedged = []
        for w in self.workers:
            if w.paused:
                w.resume()
            if w.wait(max(0.1, end - time.monotonic())) is None:
                wedged.append(w.name)
        self._stop.set()
        return self._measure(wedged)

    def _measure(self, wedged: list[str]) -> Outcome:
        for w in self.workers:
            w.kill()
        if self.exporter is not None:
            self.exporter.stop()
        site = self.site.counts()
        hits = site.get("hits") or {}
        fetched_twice = sum(n - 1 for n in hits.values() if n > 1)
        client = self.client()
        try:
            shared = {k.decode(): int(v) for k, v in client.hgetall(
                "%s:stats" % self.spider).items()}
            raw_items = client.lrange("%s:items" % self.spider, 0, -1)
        finally:
            client.close()
        per_page = Counter(_item_page(raw) for raw in raw_items)
        items_duplicated = sum(n - 1 for page, n in per_page.items() if page is not None)
        items_lost_pages = sorted(int(page) for page in hits if int(page) not in per_page)
        items_lost = len(items_lost_pages)
        outcome = Outcome(
            scenario=self.scenario, contender=self.contender.label, pages=self.pages,
            lost=int(site["missing"]), fetched_twice=fetched_twice,
            items_duplicated=items_duplicated, items_lost=items_lost, stats_error=None,
            recover_s=self._recovery(), site=site, shared=shared, items_stored=len(raw_items),
            exit_codes={w.name: w.returncode for w in self.workers}, wedged=wedged,
            scrapes=len(self.exporter.scrapes) if self.exporter else 0,
            scrape_failures=[self._describe(s) for s in self.exporter.failures()]
            if self.exporter else [],
            seconds=time.monotonic() - self.started,
            scrape_results=list(self.exporter.scrapes) if self.exporter else [],
            exporter_log=self.exporter.text() if self.exporter else "",
            logs={w.name: w.tail() for w in self.workers},
            log_files={w.name: w.log for w in self.workers},
            items_lost_pages=items_lost_pages, moments=self.moments)
        if self.contender.shared_stats:
            outcome.stats_error = (abs(shared.get("pages", 0) - outcome.site_responses)
                                   + abs(shared.get("items", 0) - outcome.page_responses))
        self.outcome = outcome
        return outcome

    def _recovery(self) -> float | None:
        if self.fault_end is None:
            return None
        before = [s for s in self.samples if s[0] <= self.fault_end]
        total_then = before[-1][1] if before else 0
        distinct_then = before[-1][2] if before else 0
        if distinct_then >= self.pages:
            return None
        for at, total, distinct in self.samples:
            if at > self.fault_end and (total >= total_then + RECOVERED_PAGES
                                        or distinct >= self.pages):
                return max(0.0, at - self.fault_end)
        return float("inf")

    @staticmethod
    def _describe(scrape: Any) -> str:
        return "status %s after %.1f s %s" % (scrape.status, scrape.seconds,
                                              (scrape.error or scrape.body)[:200].strip())

    def _tails(self) -> str:
        return "\n".join("--- %s\n%s" % (w.name, w.tail()) for w in self.workers)

    def close(self) -> None:
        """Stop everything this run started, by pid."""
        self._stop.set()
        for w in self.workers:
            w.kill()
        if self.exporter is not None:
            self.exporter.stop()
        if self.proxy is not None:
            self.proxy.stop()
        self.redis.close()
        for server in self.other_servers:
            server.close()
        if self._own_site and isinstance(self.site, ThreadSite):
            self.site.stop()
        if self._monitor.is_alive():
            self._monitor.join(5)


def _item_page(raw: bytes) -> int | None:
    from bloomcrawl.ops.demo_site import page_id

    try:
        return page_id(json.loads(raw)["url"])
    except (ValueError, KeyError, TypeError):
        return None
