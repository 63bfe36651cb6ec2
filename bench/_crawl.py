"""Shared by ``bench/crawl.py`` and ``bench/worker_kill.py``: contenders and one crawl run.

A run: flush the private Redis, zero the demo site's counters, start N
``scrapy crawl site`` processes (``SCRAPY_SETTINGS_MODULE=crawlbench.settings``,
the contender's scheduler and dupefilter given with ``-s``), wait until every
page was fetched (or the workers gave up), sample Redis, let the workers
close on their own (MAX_IDLE_TIME_BEFORE_CLOSE) and collect what they and the
site counted. Nothing here prints; a run that fails raises
:class:`CrawlFailed` with the tail of the workers' logs.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# the working tree's bloomcrawl (installed or not) and the test kit
sys.path[:0] = [str(ROOT / "crawler"), str(ROOT / "tests")]

import redis  # noqa: E402
from _exchange_floor import ExchangeFloor, measure_exchange_floor  # noqa: E402
from _redis import CpuSample, cpu_sample  # noqa: E402
from _site import SiteProcess  # noqa: E402

from bloomcrawl.ops.demo_site import page_id  # noqa: E402

from kit.wait import WaitTimeout, wait_until  # noqa: E402
from kit.workers import Worker as KitWorker  # noqa: E402
from kit.workers import logs  # noqa: E402

POLL_S = 0.1
#: after the last page is fetched, its links are enqueued and its lease acked
SETTLE_S = 0.5
#: the "steady" Redis CPU is measured from this fraction of the pages on
STEADY_FROM = 0.1
#: the crawl's phases: Redis CPU is sampled when each quarter of the pages is fetched
PHASES = 4
#: the ``site`` spider's keys: bloomcrawl's queue keys and scrapy-redis's queue start with
#: QUEUE_PREFIX; its filter's (meta, partition states, bit chunks, call records) and the
#: scrapy-redis dupefilters' hold one of FILTER_MARKS
QUEUE_PREFIX = "site:requests"
FILTER_MARKS = ("site:bloomfilter", "site:dupefilter")
#: the kinds :func:`key_memory` sums the keys' memory by
KEY_KINDS = ("filter", "queue", "other")


@dataclass(frozen=True)
class Contender:
    """A scheduler + dupefilter combination, run by the same ``site`` spider."""

    key: str
    label: str
    settings: dict[str, str]
    #: "redis": the start URL goes into ``site:start_urls`` (bloomcrawl's scheduler
    #: reads it); "argument": each worker yields it from ``start()``
    start: str
    #: several processes can share the crawl (False: Scrapy's in-memory scheduler)
    shared: bool = True


_SCRAPY_REDIS_COMMON = {
    "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
    "SCHEDULER_PERSIST": "True",  # a worker closing first must not flush the others' queue
    "SPIDER_MODULES": "crawlbench.spiders",
    "SPIDER_MIDDLEWARES": "{}",
    "DOWNLOADER_MIDDLEWARES": "{}",
    "EXTENSIONS": json.dumps({"crawlbench.probe.Probe": 0, "crawlbench.probe.IdlePoll": 0}),
}

BLOOMCRAWL = Contender(
    # the site is one host: its cluster-wide budget is every worker's whole concurrency,
    # as each scrapy-redis process has its own. The bench counts every page, and the
    # recipe's 128 MiB filter has no false positive at this size: bloomcrawl's filter,
    # whose memory follows the URLs, gets a rate at which it has none either
    "bloomcrawl", "bloomcrawl", {"CONCURRENT_REQUESTS_PER_DOMAIN": "64",
                                 "BLOOMFILTER_ERROR_RATE": "1e-6"}, start="redis")
SCRAPY_REDIS = Contender(
    "scrapy_redis", "scrapy-redis (SADD dupefilter)",
    {**_SCRAPY_REDIS_COMMON, "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter"},
    start="argument")
RECIPE = Contender(
    "recipe", "scrapy-redis + bloomfilter recipe",
    {**_SCRAPY_REDIS_COMMON,
     "DUPEFILTER_CLASS": "scrapy_redis_bloomfilter.dupefilter.RFPDupeFilter"},
    start="argument")
MEMORY = Contender(
    "memory", "Scrapy in-memory (ceiling)",
    {"SCHEDULER": "scrapy.core.scheduler.Scheduler",
     "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
     "SPIDER_MODULES": "crawlbench.spiders",
     "SPIDER_MIDDLEWARES": "{}",
     "DOWNLOADER_MIDDLEWARES": "{}"},
    start="argument", shared=False)

ITEM_PIPELINES = {
    "none": "{}",
    "redis": json.dumps({"bloomcrawl.crawl.pipelines.RedisItemsPipeline": 300}),
}


class CrawlFailed(RuntimeError):
    """A worker failed or the crawl did not finish in time."""


@dataclass(frozen=True)
class RedisSample:
    commands: dict[str, tuple[int, int]]  # name: (calls, usec) from INFO commandstats
    cpu: CpuSample
    used_memory: int


def redis_sample(client: redis.Redis) -> RedisSample:
    stats = client.info("commandstats")
    commands = {name.removeprefix("cmdstat_"): (int(value["calls"]), int(value["usec"]))
                for name, value in stats.items()}
    cpu = cpu_sample(client)
    memory = int(client.info("memory")["used_memory"])
    return RedisSample(commands, cpu, memory)


def command_delta(before: RedisSample, after: RedisSample) -> dict[str, tuple[int, int]]:
    """Commands executed between two samples as name: (calls, usec), Lua's calls included.

    A script's usec include those of the commands it calls. INFO itself is left out.
    """
    delta = {}
    for name, (calls, usec) in after.commands.items():
        calls0, usec0 = before.commands.get(name, (0, 0))
        if name != "info" and calls > calls0:
            delta[name] = (calls - calls0, usec - usec0)
    return delta


class Worker(KitWorker):
    """One ``scrapy crawl site`` process of ``contender`` with the bench settings (the test
    kit's launcher, ``SCRAPY_SETTINGS_MODULE=crawlbench.settings``), started; it reports
    through its probe (:mod:`crawlbench.probe`)."""

    def __init__(self, name: str, contender: Contender, workdir: Path, *, redis_url: str,
                 start_url: str, settings: dict[str, str]) -> None:
        self.probe_file = workdir / ("%s.json" % name)
        super().__init__(
            name, redis_url, workdir,
            {**contender.settings, **settings, "BENCH_PROBE_FILE": str(self.probe_file)},
            args={"start_url": start_url} if contender.start == "argument" else None,
            pythonpath=(BENCH,), settings_module="crawlbench.settings", base={})
        self.start()

    def responses_so_far(self) -> int:
        """Responses this worker has had, as its probe last wrote them (every 10)."""
        try:
            return int(self.probe_file.with_name(self.probe_file.name + ".progress").read_text())
        except (OSError, ValueError):
            return 0

    def probe(self) -> dict[str, Any]:
        if not self.probe_file.exists():
            return {}
        data: dict[str, Any] = json.loads(self.probe_file.read_text())
        return data


@dataclass
class CrawlRun:
    """What one run measured."""

    contender: Contender
    workers: int
    pages: int
    site: dict[str, Any]  # the demo site's /__stats at the end, hits included
    span_s: float  # first page fetched to last page fetched
    commands: dict[str, tuple[int, int]]  # Redis (calls, usec) during the crawl, by command
    redis_cpu_s: float  # Redis main thread CPU during the crawl
    #: Redis main thread CPU per page once a tenth of the pages were fetched (the
    #: filter's memory is allocated, workers are up), or None when not sampled
    steady_redis_cpu_per_page_s: float | None
    used_memory: int  # Redis used_memory at the end of the crawl
    probes: list[dict[str, Any]]  # per worker, see crawlbench.probe.Probe
    exit_codes: list[int | None]
    killed: list[str] = field(default_factory=list)
    killed_at: int | None = None  # distinct pages fetched when the worker was killed
    killed_responses: int | None = None  # the killed worker's responses by then (to 10)
    #: bloomcrawl's shared crawl stats (``site:stats``) at the end; empty for the others
    shared_stats: dict[str, int] = field(default_factory=dict)
    #: items per page number, from ``site:items`` (when items go to Redis)
    item_pages: dict[int, int] = field(default_factory=dict)
    #: Redis CPU during the crawl, the whole process (used_cpu_sys + used_cpu_user)
    redis_process_cpu_s: float = 0.0
    #: at the start and as each of the PHASES quarters of the pages is fetched: (seconds
    #: from the start, distinct pages, Redis main-thread CPU s, requests queued so far
    #: by the shared stats, None for a contender that keeps none)
    phases: list[tuple[float, int, float, int | None]] = field(default_factory=list)
    #: the workers did not share a crawl: each crawled the whole site on its own (the
    #: in-memory scheduler with 2 processes: what the machine allows 2 processes)
    separate: bool = False
    #: Redis used_memory right after the run's FLUSHALL, before the crawl (None: not
    #: measured, see run_crawl's ``memory``)
    empty_memory: int | None = None
    #: at the end of the crawl, with used_memory: kind (KEY_KINDS) -> (keys, bytes of
    #: MEMORY USAGE summed over them); empty when not measured
    key_memory: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def added_memory(self) -> int | None:
        """used_memory at the end over the empty server's: what the crawl added."""
        return None if self.empty_memory is None else self.used_memory - self.empty_memory

    @property
    def items_missing(self) -> int:
        """Pages no item was stored for: their response was never processed."""
        return self.pages - len(self.item_pages)

    @property
    def items_twice(self) -> int:
        return sum(n - 1 for n in self.item_pages.values())

    @property
    def distinct(self) -> int:
        return int(self.site["distinct"])

    @property
    def missing(self) -> int:
        return int(self.site["missing"])

    @property
    def duplicates(self) -> int:
        return int(self.site["duplicates"])

    @property
    def fetched(self) -> int:
        """Pages the workers crawled: the distinct pages, each worker's for separate crawls."""
        return int(self.site.get("total", 0)) if self.separate else self.distinct

    @property
    def pages_per_second(self) -> float:
        return self.fetched / self.span_s if self.span_s > 0 else 0.0

    @property
    def join_s(self) -> float:
        """How long after the first worker's first response the last worker got its first."""
        firsts = [p["first_response"] for p in self.probes if p.get("first_response")]
        if len(firsts) < len(self.probes):
            return float("inf")  # a worker never got a response
        return max(firsts) - min(firsts) if firsts else 0.0

    @property
    def command_count(self) -> int:
        return sum(calls for calls, _ in self.commands.values())

    @property
    def worker_cpu_s(self) -> float:
        """CPU time of the workers between their first and last responses, added up."""
        return sum(float(p.get("cpu_s", 0.0)) for p in self.probes)

    @property
    def round_trips(self) -> int:
        return sum(int(p.get("round_trips_at_last_response", 0)) for p in self.probes)

    def per_page(self, value: float) -> float:
        return value / self.fetched if self.fetched else float("nan")


def run_of(runs: Sequence[CrawlRun], contender: Contender,
           workers: int = 1) -> CrawlRun | None:
    """The run of ``contender`` with ``workers`` processes (None: not run, or failed); the
    in-memory scheduler's with 2 is its separate crawls."""
    return next((r for r in runs if r.contender is contender and r.workers == workers), None)


def run_crawl(
    contender: Contender,
    *,
    workers: int,
    site: SiteProcess,
    client: redis.Redis,
    redis_url: str,
    workdir: Path,
    timeout: float,
    settings: dict[str, str],
    kill_at: float | None = None,
    sample: Callable[[], RedisSample] | None = None,
    memory: bool = False,
) -> CrawlRun:
    """One crawl of the whole site by ``workers`` processes of ``contender``.

    ``kill_at``: SIGKILL the busiest worker once this fraction of the pages
    was fetched; the run then ends when the other workers close by themselves.
    ``sample``: how to read Redis's counters (default: :func:`redis_sample` of
    ``client``; a Redis Cluster's are summed over its masters by the caller).
    A contender that cannot share a crawl (the in-memory scheduler) run with
    several workers makes as many separate crawls of the site, side by side.
    ``memory``: also read used_memory right after the FLUSHALL and, at the end,
    the MEMORY USAGE of every key by kind (:func:`key_memory`; one server, not
    with ``sample``), after the end's sample so that its commands are not counted.
    """
    read: Callable[[], RedisSample] = sample or functools.partial(redis_sample, client)
    memory = memory and sample is None
    client.flushall()
    empty_memory = int(client.info("memory")["used_memory"]) if memory else None
    site.reset()
    if contender.start == "redis":
        client.rpush("site:start_urls", site.url)
    pages = site.pages
    before = read()
    procs = [Worker("%s-%dw-%d" % (contender.key, workers, i), contender, workdir,
                    redis_url=redis_url, start_url=site.url, settings=settings)
             for i in range(workers)]
    killed: list[str] = []
    killed_at: int | None = None
    killed_responses: int | None = None
    mid: tuple[int, RedisSample] | None = None
    started = time.monotonic()

    def phase(distinct: int, cpu: CpuSample) -> tuple[float, int, float, int | None]:
        queued = client.hget("site:stats", "queued")
        return (time.monotonic() - started, distinct, cpu.main_thread_s,
                None if queued is None else int(queued))

    phases = [phase(0, before.cpu)]
    try:
        deadline = time.monotonic() + timeout
        brief = site.brief()

        def step() -> bool:
            """Sample, kill when it is time; whether the crawl is over."""
            nonlocal brief, mid, killed_at, killed_responses
            brief = site.brief()
            if mid is None and brief["distinct"] >= STEADY_FROM * pages:
                mid = (brief["distinct"], read())
            if len(phases) < PHASES and brief["distinct"] >= len(phases) / PHASES * pages:
                phases.append(phase(int(brief["distinct"]), cpu_sample(client)
                                    if sample is None else read().cpu))
            if kill_at is not None and not killed and brief["distinct"] >= kill_at * pages:
                # the busiest worker: one that is surely crawling, holding requests
                victim = max(procs, key=Worker.responses_so_far)
                killed_responses = victim.responses_so_far()
                victim.kill()
                killed.append(victim.name)
                killed_at = int(brief["distinct"])
            return bool(brief["distinct"] >= pages or not any(w.running for w in procs))

        try:
            wait_until(step, timeout, interval=POLL_S)
        except WaitTimeout:
            raise CrawlFailed("%s, %d workers: %d of %d pages after %.0f s\n%s" % (
                contender.label, workers, brief["distinct"], pages, timeout,
                logs(procs))) from None
        time.sleep(SETTLE_S)
        after = read()
        keys_memory = key_memory(client) if memory else {}
        phases.append(phase(int(site.brief()["distinct"]), after.cpu))
        for w in procs:
            if w.wait(deadline - time.monotonic()) is None:
                raise CrawlFailed("%s: worker %s did not close by itself\n%s" % (
                    contender.label, w.name, w.tail()))
        failed = [w for w in procs if w.name not in killed and w.returncode != 0]
        if failed:
            raise CrawlFailed("%s: worker exited with %s\n%s" % (
                contender.label, [w.returncode for w in failed], logs(failed)))
        stats = site.stats()
        shared_stats = {k.decode() if isinstance(k, bytes) else k: int(v)
                        for k, v in client.hgetall("site:stats").items()}
        item_pages = stored_item_pages(client)
    finally:
        for w in procs:
            w.kill()
    first, last = stats["first_hit"], stats["last_hit"]
    steady = None
    if mid is not None and stats["distinct"] > mid[0]:
        steady = (after.cpu - mid[1].cpu).main_thread_s / (stats["distinct"] - mid[0])
    return CrawlRun(
        contender=contender,
        workers=workers,
        pages=pages,
        site=stats,
        span_s=(last - first) if first is not None and last is not None else 0.0,
        commands=command_delta(before, after),
        redis_cpu_s=(after.cpu - before.cpu).main_thread_s,
        steady_redis_cpu_per_page_s=steady,
        used_memory=after.used_memory,
        probes=[w.probe() for w in procs],
        exit_codes=[w.returncode for w in procs],
        killed=killed,
        killed_at=killed_at,
        killed_responses=killed_responses,
        shared_stats=shared_stats,
        phases=phases,
        item_pages=item_pages,
        redis_process_cpu_s=(after.cpu - before.cpu).process_s,
        separate=workers > 1 and not contender.shared,
        empty_memory=empty_memory,
        key_memory=keys_memory,
    )


def key_kind(key: str) -> str:
    """Which of KEY_KINDS a key of the ``site`` spider's crawl is."""
    if key.startswith(QUEUE_PREFIX):
        return "queue"
    if any(mark in key for mark in FILTER_MARKS):
        return "filter"
    return "other"


def key_memory(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Every key SCAN finds, by kind: (keys, bytes of MEMORY USAGE, every element
    counted)."""
    names = [k.decode() if isinstance(k, bytes) else str(k)
             for k in client.scan_iter(count=1000)]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.memory_usage(name, samples=0)
    found = {kind: (0, 0) for kind in KEY_KINDS}
    for name, usage in zip(names, pipe.execute(), strict=True):
        keys, size = found[key_kind(name)]
        found[key_kind(name)] = (keys + 1, size + int(usage or 0))  # None: gone since
    return found


def stored_item_pages(client: redis.Redis, key: str = "site:items") -> dict[int, int]:
    """How many items ``key`` holds for each demo-site page."""
    counts: dict[int, int] = {}
    for raw in client.lrange(key, 0, -1):
        page = page_id(json.loads(raw)["url"])
        if page is not None:
            counts[page] = counts.get(page, 0) + 1
    return counts


def pick_contenders(parser: argparse.ArgumentParser, spec: str,
                    contenders: tuple[Contender, ...]) -> list[Contender]:
    """The contenders a comma-separated ``--contenders`` names, or a usage error."""
    by_key = {c.key: c for c in contenders}
    try:
        return [by_key[k.strip()] for k in spec.split(",") if k.strip()]
    except KeyError as exc:
        parser.error("unknown contender %s; choose from %s" % (exc, ", ".join(by_key)))


# --- the floors: bloomcrawl's own calls for the least a page needs, and its commands alone --

#: requests in each run of the floor probe, the runs at a crawl's rate too (about 10 s
#: at 200 pages/s: a VM's wake-up costs vary from second to second); and the pages per
#: exchange it tries
FLOOR_PAGES = 2000
FLOOR_BATCHES = (1, 8)
#: how long Redis is left idle to measure what it spends doing nothing
FLOOR_IDLE_S = 2.0
#: the payload of a probe request: what the site spider queues (URL, Referer, depth, ...)
FLOOR_PAYLOAD = ('{"url": "http://127.0.0.1:8000/page/%d", "method": "GET", "callback": "parse",'
                 ' "headers": {"Referer": ["http://127.0.0.1:8000/page/%d"]}, "meta": {"depth": 3,'
                 ' "download_slot": "127.0.0.1"}, "priority": -3, "dont_filter": false}')


@dataclass(frozen=True)
class Floor:
    """Redis main-thread CPU, microseconds, of the least work a crawled page needs: through
    bloomcrawl's own calls, sent back to back (Redis kept busy: a floor of this code, not
    of Redis), and the command floor under them (:attr:`commands`: no Lua work)."""

    idle_us_per_s: float  # Redis doing nothing, per second
    round_trip_us: float  # one PING, one round trip each
    call_us: float  # an empty EVALSHA, 100 to a pipeline: a script call's own cost
    #: pages per exchange -> us per page: each page one new link (enqueue-if-new into
    #: its host's queue, politeness on), its ack, and one lease; the exchange's stats
    per_page_us: dict[int, float]
    #: the Bloom filter's part of a new link (bloom_add.lua, same filter settings)
    decision_us: float
    #: pages per exchange -> us per page, idle included, the exchanges sent at a crawl's
    #: rate (a sleep between them) instead of back to back: what a Redis woken for each
    #: exchange pays, which a crawl pays too (empty: no crawl to take the rate from)
    paced_us: dict[int, float] = field(default_factory=dict)
    #: the rate (pages/s) the paced runs went at
    paced_rate: float = 0.0
    #: the command floor (bench/_exchange_floor.py, main thread): only the commands a
    #: page cannot do without, no Lua work; what no change to the scripts goes under
    commands: ExchangeFloor | None = None

    def per_exchange_us(self) -> tuple[float, float]:
        """(fixed us per exchange, us per page) fitted to the pages-per-exchange runs."""
        (b1, c1), (b2, c2) = sorted(self.per_page_us.items())[:2]
        per_page = (b2 * c2 - b1 * c1) / (b2 - b1)
        return (c1 - per_page) * b1, per_page

    def at(self, pages_per_s: float, exchanges_per_page: float) -> float:
        """bloomcrawl's calls for a crawl at this rate and batching, back to back: Redis's
        idle CPU per page, plus each exchange's fixed cost shared by its pages, plus each
        page's own."""
        fixed, per_page = self.per_exchange_us()
        return self.idle_us_per_s / pages_per_s + fixed * exchanges_per_page + per_page


def _main_cpu(client: redis.Redis) -> float:
    return cpu_sample(client).main_thread_s


def measure_floor(client: redis.Redis, error_rate: float = 1e-6,
                  pace: tuple[float, float] | None = None, pages: int = FLOOR_PAGES) -> Floor:
    """What this Redis spends on the least a page needs through bloomcrawl's own calls,
    and on its commands alone (a fresh keyspace; flushed after).

    The frontier's own calls (:class:`~bloomcrawl.core.frontier.Frontier`), one
    host partitioned by host as the demo crawl, CONCURRENT_REQUESTS_PER_DOMAIN
    64 as bloomcrawl's contender: a page sends one new link, acks its lease and
    leases the next, one exchange per page (an I/O-bound worker) or several,
    back to back. ``pace``: (pages/s, exchanges a page) of a crawl; the same
    exchanges are then also sent at that rate, with that many pages in each
    and with twice as many (:attr:`Floor.paced_us`). ``pages``: requests in each run.
    Then the command floor (:attr:`Floor.commands`): the probes of
    ``bench/_exchange_floor.py``, ``2 x pages`` calls each, the main thread's CPU.
    """
    import hashlib

    from bloomcrawl.core import keys
    from bloomcrawl.core.bloom import BloomFilter, partition_of
    from bloomcrawl.core.frontier import Frontier, Outgoing
    from bloomcrawl.core.politeness import Politeness, filter_fingerprint
    from bloomcrawl.core.scripts import Script, ScriptCall

    client.flushall()
    before = _main_cpu(client)
    time.sleep(FLOOR_IDLE_S)
    idle = (_main_cpu(client) - before) / FLOOR_IDLE_S * 1e6

    calls = 5000
    client.ping()
    before = _main_cpu(client)
    for _ in range(calls):
        client.ping()
    round_trip = (_main_cpu(client) - before) / calls * 1e6

    empty = client.script_load("return 1")
    before = _main_cpu(client)
    for _ in range(calls // 100):
        pipe = client.pipeline(transaction=False)
        for _ in range(100):
            pipe.evalsha(empty, 0)
        pipe.execute()
    call = (_main_cpu(client) - before) / calls * 1e6

    per_page: dict[int, float] = {}
    paced: dict[int, float] = {}
    host = "127.0.0.1"
    runs: list[tuple[int, float | None]] = [(batch, None) for batch in FLOOR_BATCHES]
    if pace is not None:
        batch = max(1, round(1 / max(pace[1], 1e-6)))
        runs += [(batch, pace[0]), (2 * batch, pace[0])]
    for batch, rate in runs:
        client.flushall()
        frontier_keys = keys.FrontierKeys("floor")
        bloom = BloomFilter(client, frontier_keys.filter, error_rate=error_rate)
        frontier = Frontier(client, bloom, frontier_keys, queue_type="priority",
                            lease_timeout=30, worker_id="floor", node="floor",
                            politeness=Politeness(concurrency=64))
        frontier.record_layout()
        partition_by = bloom.params.partition_by

        def outgoing(i: int, partition_by: str = partition_by) -> Outgoing:
            payload = FLOOR_PAYLOAD % (i, i // 20)
            fp = hashlib.sha1(payload.encode()).digest()
            return Outgoing(filter_fingerprint(fp, host, partition_by), False,
                            -3.0, payload, host)

        # a queue to lease from, and the scripts loaded
        first = [outgoing(-i - 1) for i in range(batch)]
        home = partition_of(first[0].fingerprint, frontier_keys.partitions)
        frontier.exchange(first, {})
        acks: dict[int, list[str]] = {}
        before = _main_cpu(client)
        due = time.monotonic()
        for number, start in enumerate(range(0, pages, batch), 1):
            if rate is not None:  # Redis sleeps between exchanges, as in the crawl
                due += batch / rate
                time.sleep(max(0.0, due - time.monotonic()))
            done = frontier.exchange([outgoing(i) for i in range(start, start + batch)], acks,
                                     [(number, {"pages": batch})], lease_from=home, want=batch)
            acks = {home: [lease.token for lease in done.leases]}
        (per_page if rate is None else paced)[batch] = (
            _main_cpu(client) - before) / pages * 1e6

    # the filter's share: the same number of new fingerprints through bloom_add.lua
    client.flushall()
    bloom = BloomFilter(client, "floor:bloomfilter", error_rate=error_rate, partitions=1)
    add = Script.for_backend("bitmap", "bloom_add.lua")
    fps = [hashlib.sha1(b"floor-%d" % i).digest() for i in range(pages + 1)]
    bloom.add_many(fps[:1])
    before = _main_cpu(client)
    for start in range(1, pages + 1, 100):
        bloom.run_scripts([ScriptCall(add, [keys.state_key("floor:bloomfilter", 0)], [fp])
                           for fp in fps[start:start + 100]])
    decision = (_main_cpu(client) - before) / pages * 1e6 - call
    commands = measure_exchange_floor(client, calls=2 * pages, main_thread=True)
    client.flushall()
    return Floor(idle, round_trip, call, per_page, decision, paced,
                 pace[0] if pace is not None else 0.0, commands)
