"""Politeness benchmark: what a domain sees from 3 workers, bloomcrawl beside scrapy-redis.

Scrapy keeps DOWNLOAD_DELAY and CONCURRENT_REQUESTS_PER_DOMAIN per process:
N scrapy-redis workers sharing a queue hit a domain N times as often as the
settings say. bloomcrawl's frontier (issue 11) leases a request only when
its host may be fetched now, cluster-wide, so N workers together keep the
budget one crawler would. This benchmark measures it where it matters, at
the website: the hosts site (:mod:`bloomcrawl.ops.hosts_site`, its own
process) serves ``h<i>.localhost`` on one 127.0.0.1 port and records every
request's arrival; workers resolve ``*.localhost`` to 127.0.0.1 with
:class:`bloomcrawl.crawl.resolver.LocalhostResolver`.

Scenarios, each with 3 ``scrapy crawl site`` processes on one private
redis-server (CONCURRENT_REQUESTS_PER_DOMAIN=1, RANDOMIZE_DOWNLOAD_DELAY=False,
no robots.txt, items dropped, each worker with its own User-Agent; every page
links to 10 new pages of its host, a tree reached from ``/``):

a. bloomcrawl, one domain of 50 pages, DOWNLOAD_DELAY=0.2: the shortest gap
   between two requests over the delay, the crawl's span against
   pages x delay, pages per worker;
b. bloomcrawl, 50 domains of 20 pages, DOWNLOAD_DELAY=0.5: throughput
   against the ideal (every domain at its budget: pages / (pages per domain x
   delay)), and the busiest domain's rate over its budget;
c. scrapy-redis (its Scheduler and RFPDupeFilter, PriorityQueue,
   SCHEDULER_PERSIST=True), the same as (a): the same ``site`` spider
   started from a spider argument, as ``bench/crawl.py`` runs it.

bloomcrawl's workers open their spiders before the seeds are pushed into
``site:start_urls``; scrapy-redis's workers each yield the start URL as they
start (its dupefilter drops the copies). A scrapy-redis worker pulls up to
CONCURRENT_REQUESTS requests into its own downloader and spaces them there,
so the others get work once a domain's queue is longer than that.

Rates: ``mean`` is (requests - 1) over the host's first-to-last arrival;
``peak`` the fastest pace over 10 consecutive gaps (10 over their sum:
1/delay for a host paced at the delay).
Targets are printed next to the values (PASS/MISS); nothing is asserted.
Run ``--quick`` for a smaller run that checks the benchmark works.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CRAWLER = ROOT / "crawler"
# the working tree's bloomcrawl (installed or not) and the test kit
sys.path[:0] = [str(CRAWLER), str(ROOT / "tests")]

import redis  # noqa: E402
from _crawl import BLOOMCRAWL, ITEM_PIPELINES, SCRAPY_REDIS, Contender, Worker  # noqa: E402
from _redis import cpu_sample  # noqa: E402
from _report import fmt, ratio, verdict  # noqa: E402

from bloomcrawl.ops.cluster.processes import (  # noqa: E402
    ManagedProcess,
    spawn,
    start_on_free_port,
)
from bloomcrawl.ops.hosts_site import (  # noqa: E402
    Arrival,
    HostsSiteClient,
    crawl_settings,
    gaps,
    max_outstanding,
    min_gaps,
    pages_only,
    peak_rates,
    per_agent,
    rates,
    span,
)
from bloomcrawl.ops.noproxy import http_ok  # noqa: E402

from kit.redis import RedisServer  # noqa: E402
from kit.wait import WaitTimeout, wait_until  # noqa: E402
from kit.workers import logs, wait_opened  # noqa: E402

WORKERS = 3
MAX_IDLE_S = 1
START_TIMEOUT_S = 60.0
SITE_START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
#: after the last page, for every worker to find the frontier empty for MAX_IDLE_S and close
CLOSE_TIMEOUT_S = 30.0
POLL_S = 0.2
#: after the last page was fetched, before the workers are waited for
SETTLE_S = 0.5
#: the peak rate is the fastest pace over this many consecutive gaps
PEAK_INTERVALS = 10
GAP_TARGET = 0.9
SPAN_TARGET = 1.1
THROUGHPUT_TARGET = 0.8
PEAK_TARGET = 1.1


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    contender: Contender
    domains: int
    pages: int  # per domain
    delay: float
    timeout: float
    #: links from a page to new ones: a real page links to many, and a worker
    #: that hoards what it leased (scrapy-redis's) leaves the others some only then
    fanout: int = 10

    @property
    def total_pages(self) -> int:
        return self.domains * self.pages

    @property
    def ideal_s(self) -> float:
        """Every domain at its budget, in parallel: pages per domain x delay."""
        return self.pages * self.delay


def scenarios(quick: bool) -> dict[str, Scenario]:
    one, many, pages = (20, 10, 8) if quick else (50, 50, 20)
    return {
        "a": Scenario("a", "bloomcrawl, one domain", BLOOMCRAWL, 1, one, 0.2, 120.0),
        "b": Scenario("b", "bloomcrawl, %d domains" % many, BLOOMCRAWL, many, pages, 0.5,
                      180.0),
        "c": Scenario("c", "scrapy-redis, one domain", SCRAPY_REDIS, 1, one, 0.2, 120.0),
    }


class HostsSiteProcess:
    """``python -m bloomcrawl.ops.hosts_site`` on a free port; use as a context manager."""

    def __init__(self, domains: int, pages: int, fanout: int, log: Path) -> None:
        self.domains = domains
        self.pages = pages
        self.fanout = fanout
        self.log = log
        self.process: ManagedProcess | None = None
        self.client = HostsSiteClient(0)

    def start(self) -> HostsSiteProcess:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(CRAWLER)

        def start_on(port: int) -> ManagedProcess:
            process = spawn("hosts site", [
                sys.executable, "-m", "bloomcrawl.ops.hosts_site", "--port", str(port),
                "--hosts", str(self.domains), "--pages", str(self.pages),
                "--fanout", str(self.fanout)],
                env=env, port=port, log=self.log)
            return process.wait_ready(
                lambda: http_ok("http://127.0.0.1:%d/__stats" % port), SITE_START_TIMEOUT_S)

        self.process = start_on_free_port(start_on)
        self.client = HostsSiteClient(self.process.port or 0)
        return self

    def stop(self) -> None:
        """Stop the process this object started, by its pid."""
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout=STOP_TIMEOUT_S)

    def __enter__(self) -> HostsSiteProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class RedisWork:
    """What a crawl cost its Redis, from seeding to the workers' exit: the main
    thread's CPU, the exchanges (one MULTI/EXEC each on one Redis) and the script
    calls (EVALSHA) in them."""

    cpu_s: float
    exchanges: int
    script_calls: int


def redis_counters(client: redis.Redis) -> tuple[float, int, int]:
    stats = client.info("commandstats")
    return (cpu_sample(client).main_thread_s, int(stats.get("cmdstat_exec", {}).get("calls", 0)),
            int(stats.get("cmdstat_evalsha", {}).get("calls", 0)))


@dataclass
class Run:
    """What one scenario measured, from the site's arrivals."""

    scenario: Scenario
    arrivals: list[Arrival]
    exit_codes: list[int | None]
    failure: str = ""
    redis: RedisWork | None = None

    @property
    def pages(self) -> list[Arrival]:
        return pages_only(self.arrivals)

    @property
    def distinct(self) -> int:
        return len({(a.host, a.path) for a in self.pages})

    @property
    def duplicates(self) -> int:
        return len(self.pages) - self.distinct

    @property
    def span_s(self) -> float:
        return span(self.arrivals)

    @property
    def min_gap(self) -> float | None:
        gaps = min_gaps(self.arrivals)
        return min(gaps.values()) if gaps else None

    def gap_quantiles(self) -> tuple[float, float] | None:
        """(10th percentile, median) of all gaps between a host's consecutive requests."""
        values = [gap for host_gaps in gaps(self.arrivals).values() for gap in host_gaps]
        if len(values) < 2:
            return None
        deciles = statistics.quantiles(values, n=10)
        return deciles[0], statistics.median(values)

    @property
    def over_budget(self) -> int:
        """Domains that had two requests closer than GAP_TARGET x the delay."""
        return sum(1 for gap in min_gaps(self.arrivals).values()
                   if gap < GAP_TARGET * self.scenario.delay)

    @property
    def mean_rate(self) -> float | None:
        values = rates(self.arrivals).values()
        return max(values) if values else None

    @property
    def peak_rate(self) -> float | None:
        values = peak_rates(self.arrivals, PEAK_INTERVALS).values()
        return max(values) if values else None

    @property
    def outstanding(self) -> int:
        values = max_outstanding(self.arrivals).values()
        return max(values) if values else 0

    @property
    def throughput(self) -> float:
        return len(self.pages) / self.span_s if self.span_s > 0 else 0.0

    @property
    def ideal_throughput(self) -> float:
        return self.scenario.total_pages / self.scenario.ideal_s

    def per_worker(self) -> list[int]:
        counts = per_agent(self.pages)
        return [counts.get(agent(self.scenario, i), 0) for i in range(WORKERS)]


def agent(scenario: Scenario, i: int) -> str:
    return "bloomcrawl-bench/%s-%s-w%d" % (scenario.key, scenario.contender.key, i)


def run_scenario(scenario: Scenario, server: RedisServer, workdir: Path) -> Run:
    """One crawl of the scenario's site by WORKERS processes; never raises for a bad crawl."""
    client = server.client()
    client.flushall()
    settings = {
        **crawl_settings(scenario.delay),
        "ROBOTSTXT_OBEY": "False",
        "MAX_IDLE_TIME_BEFORE_CLOSE": str(MAX_IDLE_S),
        "ITEM_PIPELINES": ITEM_PIPELINES["none"],
    }
    rundir = workdir / scenario.key
    with HostsSiteProcess(scenario.domains, scenario.pages, scenario.fanout,
                          rundir / "site.log") as site:
        hosts = ["h%d.localhost" % i for i in range(scenario.domains)]
        urls = [site.client.url(host) for host in hosts]
        workers = [Worker("%s-w%d" % (scenario.contender.key, i), scenario.contender, rundir,
                          redis_url=server.url, start_url=urls[0],
                          settings={**settings, "USER_AGENT": agent(scenario, i)})
                   for i in range(WORKERS)]
        failure = ""
        before = redis_counters(client)
        try:
            if scenario.contender.start == "redis":
                failure = open_failure(workers)
                if not failure:
                    client.rpush("site:start_urls", *urls)
            if not failure:
                failure = wait_crawled(scenario, site.client, workers)
            if not failure:
                time.sleep(SETTLE_S)
                deadline = time.monotonic() + CLOSE_TIMEOUT_S
                for w in workers:
                    if w.wait(deadline - time.monotonic()) is None:
                        failure = "worker %s did not close by itself" % w.name
            arrivals = site.client.arrivals()
            cpu, exchanges, calls = (b - a for a, b in zip(before, redis_counters(client),
                                                           strict=True))
            work = RedisWork(float(cpu), int(exchanges), int(calls))
        finally:
            for w in workers:
                w.kill()
            client.close()
        codes = [w.returncode for w in workers]
        if not failure and any(code != 0 for code in codes):
            failure = "workers exited with %s" % codes
        if failure:
            failure += "\n" + logs(workers)
        return Run(scenario, arrivals, codes, failure, work)


def open_failure(workers: list[Worker]) -> str:
    """"" once every worker opened its spider (the kit's wait), else what went wrong."""
    try:
        wait_opened(workers, START_TIMEOUT_S)
    except AssertionError as exc:  # a worker exited first, or time was up
        return str(exc).splitlines()[0]
    return ""


def wait_crawled(scenario: Scenario, site: HostsSiteClient, workers: list[Worker]) -> str:
    """"" when every page was fetched, else what went wrong."""
    stats: dict[str, Any] = {}

    def crawled() -> bool:
        stats.update(site.stats())
        return bool(stats["distinct"] >= scenario.total_pages
                    or not any(w.running for w in workers))

    try:
        wait_until(crawled, scenario.timeout, interval=POLL_S)
    except WaitTimeout:
        return "%d of %d pages after %.0f s" % (stats.get("distinct", 0), scenario.total_pages,
                                                scenario.timeout)
    if stats["distinct"] < scenario.total_pages:
        return "the workers closed with %d of %d pages fetched" % (
            stats["distinct"], scenario.total_pages)
    return ""


def print_one_domain(runs: dict[str, Run]) -> None:
    mine, theirs = runs.get("a"), runs.get("c")
    shown = [(label, run) for label, run in (("bloomcrawl", mine), ("scrapy-redis", theirs))
             if run is not None]
    if not shown:
        return
    scenario = shown[0][1].scenario
    print("(a)/(c) one domain, %d pages, DOWNLOAD_DELAY=%g s (budget %g requests/s),"
          " 3 workers" % (scenario.pages, scenario.delay, 1 / scenario.delay))
    header = "%-34s" % "" + "".join(" %14s" % label for label, _ in shown) + "   target"
    print(header)
    print("-" * len(header))

    def row(name: str, values: list[str], target: str = "") -> None:
        print("%-34s" % name + "".join(" %14s" % v for v in values) + "   " + target)

    def with_verdict(value: float | None, ok: bool | None) -> str:
        return "%s %s" % (fmt(value), verdict(ok)[0] if ok is not None else "")

    delay = scenario.delay
    gaps = [ratio(r.min_gap, delay) for _, r in shown]
    row("min gap / delay", [with_verdict(g, None if g is None else g >= GAP_TARGET)
                            for g in gaps], ">= %g" % GAP_TARGET)
    quantiles = [r.gap_quantiles() for _, r in shown]
    row("gap p10 / delay", [fmt(None if q is None else q[0] / delay) for q in quantiles])
    row("gap median / delay", [fmt(None if q is None else q[1] / delay) for q in quantiles])
    peaks = [ratio(r.peak_rate, 1 / delay) for _, r in shown]
    row("peak rate / budget (%d gaps)" % PEAK_INTERVALS,
        [with_verdict(p, None if p is None else p <= PEAK_TARGET) for p in peaks],
        "<= %g" % PEAK_TARGET)
    row("mean rate / budget", [fmt(ratio(r.mean_rate, 1 / delay)) for _, r in shown])
    row("crawl span s", [fmt(r.span_s) for _, r in shown])
    # a polite crawl can be no shorter than (pages - 1) delays, nor much longer than pages
    low = (scenario.pages - 1) / scenario.pages * GAP_TARGET
    spans = [r.span_s / r.scenario.ideal_s for _, r in shown]
    row("span / (pages x delay)", [with_verdict(s, low <= s <= SPAN_TARGET) for s in spans],
        "%.2f .. %g" % (low, SPAN_TARGET))
    row("max outstanding requests", [str(r.outstanding) for _, r in shown], "<= 1")
    row("pages fetched / twice", ["%d / %d" % (r.distinct, r.duplicates) for _, r in shown])
    row("pages per worker", ["/".join(map(str, r.per_worker())) for _, r in shown])
    print()


def print_many_domains(run: Run | None) -> None:
    if run is None:
        return
    s = run.scenario
    print("(b) bloomcrawl, %d domains x %d pages, DOWNLOAD_DELAY=%g s, 3 workers" % (
        s.domains, s.pages, s.delay))
    rows = [
        ("throughput pages/s", fmt(run.throughput, ".1f"), "", ""),
        ("ideal pages/s (domains x pages / (pages x delay))", fmt(run.ideal_throughput, ".1f"),
         "", ""),
        ("throughput / ideal", fmt(ratio(run.throughput, run.ideal_throughput)),
         ">= %g" % THROUGHPUT_TARGET,
         verdict(run.throughput >= THROUGHPUT_TARGET * run.ideal_throughput)),
        ("crawl span s (ideal %g)" % s.ideal_s, fmt(run.span_s), "", ""),
        ("busiest domain, peak rate / budget", fmt(ratio(run.peak_rate, 1 / s.delay)),
         "<= %g" % PEAK_TARGET,
         verdict(None if run.peak_rate is None else run.peak_rate * s.delay <= PEAK_TARGET)),
        ("busiest domain, mean rate / budget", fmt(ratio(run.mean_rate, 1 / s.delay)), "", ""),
        ("min gap / delay, over all domains", fmt(ratio(run.min_gap, s.delay)),
         ">= %g" % GAP_TARGET,
         verdict(None if run.min_gap is None else run.min_gap >= GAP_TARGET * s.delay)),
        ("domains with a gap < %g x delay" % GAP_TARGET, str(run.over_budget), "0",
         verdict(run.over_budget == 0)),
        ("max outstanding requests per domain", str(run.outstanding), "<= 1",
         verdict(run.outstanding <= 1)),
        ("pages fetched / twice", "%d / %d" % (run.distinct, run.duplicates), "", ""),
        ("pages per worker", "/".join(map(str, run.per_worker())), "", ""),
    ]
    pages = len(run.pages)
    if run.redis is not None and pages:
        # a paced crawl's exchanges: docs/scale.md's estimate assumes one a page
        rows += [
            ("Redis: exchanges a page (one MULTI/EXEC each)",
             fmt(run.redis.exchanges / pages), "", ""),
            ("Redis: script calls a page", fmt(run.redis.script_calls / pages), "", ""),
            ("Redis: main thread CPU us a page", fmt(run.redis.cpu_s * 1e6 / pages, ".0f"),
             "", ""),
        ]
    for name, value, target, result in rows:
        print("  %-52s %10s  %-6s %s" % (name, value, target, result))
    print()


def as_json(runs: dict[str, Run]) -> dict[str, Any]:
    return {key: {
        "title": r.scenario.title, "domains": r.scenario.domains, "pages": r.scenario.pages,
        "delay": r.scenario.delay, "span_s": r.span_s, "min_gap_s": r.min_gap,
        "peak_rate": r.peak_rate, "mean_rate": r.mean_rate, "throughput": r.throughput,
        "ideal_throughput": r.ideal_throughput, "max_outstanding": r.outstanding,
        "distinct": r.distinct, "duplicates": r.duplicates, "per_worker": r.per_worker(),
        "failure": r.failure.split("\n")[0],
        "redis": None if r.redis is None else {
            "cpu_s": r.redis.cpu_s, "exchanges": r.redis.exchanges,
            "script_calls": r.redis.script_calls},
    } for key, r in runs.items()}


def scrapy_redis_missing() -> str:
    try:
        import scrapy_redis  # noqa: F401
    except ImportError:
        return "scrapy-redis is not installed in this environment (it is a dependency in" \
               " pyproject.toml: make venv)"
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller sites: checks that the benchmark works")
    parser.add_argument("--scenarios", default="a,b,c", help="comma-separated subset of a,b,c")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    plan = scenarios(args.quick)
    keys = [k.strip() for k in args.scenarios.split(",") if k.strip()]
    unknown = [k for k in keys if k not in plan]
    if unknown:
        parser.error("unknown scenario(s) %s; choose from a, b, c" % ", ".join(unknown))
    missing = scrapy_redis_missing()
    if missing and "c" in keys:
        print("skipping (c): %s" % missing, file=sys.stderr)
        keys.remove("c")

    print("bloomcrawl politeness benchmark: %d workers, CONCURRENT_REQUESTS_PER_DOMAIN=1,"
          " RANDOMIZE_DOWNLOAD_DELAY=False" % WORKERS)
    print("%s, Python %s, %d CPUs, load average before: %s" % (
        platform.platform(terse=True), platform.python_version(), os.cpu_count() or 0,
        " ".join("%.2f" % x for x in os.getloadavg())))
    sys.stdout.flush()
    started = time.monotonic()
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-bench-polite-") as tmp, \
            RedisServer() as server:
        for key in keys:
            scenario = plan[key]
            print("  running (%s) %s ..." % (key, scenario.title), file=sys.stderr, flush=True)
            run = run_scenario(scenario, server, Path(tmp))
            if run.failure:
                print("(%s) %s: %s" % (key, scenario.title, run.failure), file=sys.stderr)
            runs[key] = run
    print("redis-py %s; finished in %.0f s, load average after: %s" % (
        redis.__version__, time.monotonic() - started,
        " ".join("%.2f" % x for x in os.getloadavg())))
    print()
    print_one_domain(runs)
    print_many_domains(runs.get("b"))
    print("gaps: between consecutive requests to one host, at the site (robots.txt off);"
          " peak: %d / the shortest sum of %d consecutive gaps; mean: (requests - 1) /"
          " the host's first-to-last arrival" % (PEAK_INTERVALS, PEAK_INTERVALS))
    print("span: first to last request at the site; pages per worker: by User-Agent;"
          " scrapy-redis keeps the delay per process, so N workers may reach N x the budget")
    failed = [key for key, run in runs.items() if run.failure]
    if args.json:
        args.json.write_text(json.dumps(as_json(runs), indent=2))
    if failed:
        print()
        print("FAILED runs: %s (details on stderr)" % ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
