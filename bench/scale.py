"""Scale benchmark: one Redis beside a Redis Cluster of 1, 2 and 3 masters.

Each target gets fresh servers on 127.0.0.1 (persistence off; the clusters
have no replicas: a replica would add the replication stream's CPU to the
same two cores and measure nothing about the masters' work). On each:

* decisions/s: Bloom-filter check-and-set decisions, ``BloomFilter.add_many``
  in batches of 1,000 from several client processes at once (started
  together, timed from the start to the last one's end), first on
  fingerprints never seen (every decision inserts), then the same ones again
  (every decision finds its item). The filter has the product's partitions
  for the target: BLOOMFILTER_PARTITIONS' default, 4 on one Redis, 8 per
  master on a cluster (``bloomcrawl.crawl.config.default_partitions``);
* Redis CPU per decision: ``used_cpu_sys + used_cpu_user`` of every master
  (INFO cpu, the whole process), before and after, summed over the masters,
  minus what the idle servers use in the same time (measured first);
* pages/s: a real crawl of the demo site (``bench/_site.py``, no delay, its
  own process) by 1, 2 and 3 ``scrapy crawl site`` processes with the
  project's scheduler (``REDIS_URL=redis+cluster://...`` on a cluster), as
  ``bench/crawl.py`` runs them; Redis CPU per page the same way as per
  decision; commands per page (INFO commandstats, Lua's calls included);
  round trips per page as the workers' redis-py connections count them (one
  per packet sent: a pipeline reaching k masters counts k); stats calls per
  page (the exchanges counted in ``{site:stats}:applied``: each one was one
  ``frontier_stats.lua`` call on the one stats slot).

Then, on one Redis: what one stats call costs the stats slot's master
(alone, and pipelined), the memory of a queued request (MEMORY USAGE of a
priority queue and of a list of serialized requests), and what one
exporter snapshot (``bloomcrawl.ops.inspection.snapshot``) costs Redis as
the partitions grow.

Everything here shares 2 cores: the client processes, the workers, the demo
site and every redis-server. A cluster's wall-clock rates are capped by that,
not by Redis; the CPU figures are not. The projection columns say what the
measured CPU per decision and per page give on dedicated cores: they are
arithmetic, not measurements, and are marked so. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the working tree's bloomcrawl (installed or not) and the test kit
sys.path[:0] = [str(ROOT / "crawler"), str(ROOT / "tests")]

import redis  # noqa: E402
from _cluster import BenchCluster  # noqa: E402
from _crawl import (  # noqa: E402
    BLOOMCRAWL,
    CrawlFailed,
    CrawlRun,
    RedisSample,
    command_delta,
    redis_sample,
    run_crawl,
)
from _exchange_floor import ExchangeFloor, measure_exchange_floor  # noqa: E402
from _redis import CpuSample  # noqa: E402
from _report import emit, table, verdict  # noqa: E402
from _site import SiteProcess  # noqa: E402

from bloomcrawl.core import defaults, keys  # noqa: E402
from bloomcrawl.core.bloom import BloomFilter, partition_of  # noqa: E402
from bloomcrawl.core.connection import redis_from_url  # noqa: E402
from bloomcrawl.core.frontier import Frontier, Outgoing  # noqa: E402
from bloomcrawl.core.politeness import filter_fingerprint, host_partition  # noqa: E402
from bloomcrawl.core.scripts import Script, ScriptCall  # noqa: E402
from bloomcrawl.core.sizing import HASHING, FilterParams  # noqa: E402
from bloomcrawl.crawl.config import default_partitions  # noqa: E402
from bloomcrawl.crawl.scheduler import CLUSTER_STATS_INTERVAL  # noqa: E402

from kit.data import fingerprints  # noqa: E402
from kit.redis import RedisServer  # noqa: E402

ERROR_RATE = 0.001
BATCH = 1000
FILTER_KEY = "scale:bloomfilter"
#: the crawls' filter: small, so allocating its chunks is not what a page costs
CRAWL_CAPACITY = 1_000_000
WARM_UP = 200  # fingerprints each client adds before the timing (loads the script)
BARRIER_TIMEOUT_S = 300.0
IDLE_SETTLE_S = 1.0  # after a start, before the idle CPU is measured
#: realistic internet rates per worker (I/O bound) and what one worker does here
WORKER_RATES = (5, 20, 200)
FLEET = 1000
EXPORTER_SCRAPES = 10
GETKEYS = "command|getkeys"


@dataclass(frozen=True)
class Plan:
    masters: tuple[int, ...]  # cluster sizes; one plain Redis is always measured first
    clients: int  # decision client processes
    decisions: int  # per client and pass
    pages: int
    workers: tuple[int, ...]
    max_idle: int
    timeout: float  # per crawl
    idle_s: float  # idle CPU measured for this long per target
    exchanges: int  # synthetic pages, one exchange each
    stats_calls: int
    queued: int
    exporter_partitions: tuple[int, ...]
    #: crawl on every target, or only on one Redis and the largest cluster (a crawl
    #: costs ~12 s whatever its size: start-up, and closing at the engine's 5 s idle check)
    crawl_everywhere: bool = True


FULL = Plan(masters=(1, 2, 3), clients=4, decisions=100_000, pages=1500, workers=(1, 2, 3),
            max_idle=2, timeout=240.0, idle_s=3.0, exchanges=2000, stats_calls=5000,
            queued=50_000, exporter_partitions=(4, 32, 128))
QUICK = Plan(masters=(1, 2, 3), clients=2, decisions=5000, pages=120, workers=(1,),
             max_idle=1, timeout=90.0, idle_s=0.5, exchanges=100, stats_calls=300,
             queued=2000, exporter_partitions=(4, 16), crawl_everywhere=False)


# --- sampling the masters ---------------------------------------------------------


class MasterSampler:
    """INFO of every master, summed (a :class:`RedisSample`); each call is kept with its time."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.clients = [redis.Redis(host="127.0.0.1", port=p, socket_timeout=30) for p in ports]
        #: (time.monotonic(), process CPU s of each master)
        self.history: list[tuple[float, list[float]]] = []

    def __call__(self) -> RedisSample:
        samples = [redis_sample(c) for c in self.clients]
        self.history.append((time.monotonic(), [s.cpu.process_s for s in samples]))
        commands: dict[str, tuple[int, int]] = {}
        for s in samples:
            for name, (calls, usec) in s.commands.items():
                calls0, usec0 = commands.get(name, (0, 0))
                commands[name] = (calls0 + calls, usec0 + usec)
        cpu = CpuSample(sum(s.cpu.main_thread_s for s in samples),
                        sum(s.cpu.process_s for s in samples))
        return RedisSample(commands, cpu, sum(s.used_memory for s in samples))

    def since(self, index: int) -> tuple[float, list[float]]:
        """Seconds and per-master process CPU from sample ``index`` to the last one."""
        (t0, cpu0), (t1, cpu1) = self.history[index], self.history[-1]
        return t1 - t0, [b - a for a, b in zip(cpu0, cpu1, strict=True)]

    def close(self) -> None:
        for c in self.clients:
            c.close()


def hottest_share(per_master: Sequence[float]) -> float:
    """The busiest master's part of the CPU the masters used (1.0 with one master)."""
    total = sum(per_master)
    return max(per_master) / total if total > 0 else 1.0


# --- targets ----------------------------------------------------------------------


@dataclass
class Target:
    """One Redis or one cluster, running."""

    name: str
    masters: int
    url: str
    ports: list[int]
    partitions: int
    client: Any  # redis.Redis or RedisCluster, from bloomcrawl's redis_from_url
    sampler: MasterSampler
    idle_cpu_per_s: float = 0.0  # summed over the masters


def start_target(masters: int, workdir: Path) -> tuple[Target, Callable[[], None]]:
    """``masters`` = 0: one plain redis-server; else a cluster of that many masters."""
    if masters == 0:
        server = RedisServer()
        server.start()
        name, url, ports, stop = "redis", server.url, [server.port], server.close
    else:
        cluster = BenchCluster(workdir, masters=masters).start()
        name, url, ports, stop = "cluster", cluster.startup_url, cluster.master_ports, \
            cluster.stop
    try:
        client = redis_from_url(url, socket_timeout=120)
        client.flushall()
        partitions = default_partitions(client, FILTER_KEY)  # the product's rule
    except BaseException:
        stop()
        raise
    target = Target(name, max(1, masters), url, ports, partitions, client,
                    MasterSampler(ports))

    def stop_all() -> None:
        target.sampler.close()
        target.client.close()
        stop()

    return target, stop_all


def measure_idle(target: Target, seconds: float) -> None:
    """The masters' CPU per second with no client: the least of one-second windows.

    A new cluster's nodes still gossip for a moment after it reports ok, and
    anything else on the machine can delay a window; the quietest one counts.
    """
    time.sleep(IDLE_SETTLE_S)
    windows = max(1, round(seconds))
    rates = []
    for _ in range(windows):
        first = len(target.sampler.history)
        target.sampler()
        time.sleep(seconds / windows)
        target.sampler()
        span, per_master = target.sampler.since(first)
        rates.append(sum(per_master) / span if span > 0 else 0.0)
    target.idle_cpu_per_s = min(rates)


# --- decisions --------------------------------------------------------------------


def _decision_client(url: str, label: str, count: int, barrier: Any, results: Any) -> None:
    """One client process: two timed passes of add_many over its own fingerprints."""
    client = redis_from_url(url, socket_timeout=120)
    bloom = BloomFilter.open(client, FILTER_KEY)
    fps = fingerprints(count, label + ":")
    bloom.add_many(fingerprints(WARM_UP, label + ":warm:"))  # scripts loaded, connections made
    barrier.wait()
    for phase in ("new", "seen"):
        barrier.wait()  # go
        cpu = time.process_time()
        new = 0
        for start in range(0, count, BATCH):
            new += sum(bloom.add_many(fps[start:start + BATCH]))
        results.put((phase, label, count, new, time.process_time() - cpu))
        barrier.wait()  # done
    client.close()


@dataclass
class DecisionPass:
    phase: str  # "new": every fingerprint inserted; "seen": every one found
    decisions: int
    new: int
    seconds: float
    redis_cpu_s: float  # summed over masters, idle not subtracted
    idle_cpu_s: float  # what the idle masters would have used meanwhile
    client_cpu_s: float
    per_master_cpu_s: list[float]
    commands: dict[str, tuple[int, int]]  # (calls, usec) during the pass, summed over masters

    @property
    def rate(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else 0.0

    def calls_per(self, command: str, decisions: int = 1000) -> float:
        return self.commands.get(command, (0, 0))[0] / self.decisions * decisions

    @property
    def redis_us(self) -> float:
        return (self.redis_cpu_s - self.idle_cpu_s) / self.decisions * 1e6

    @property
    def client_us(self) -> float:
        return self.client_cpu_s / self.decisions * 1e6

    @property
    def hottest(self) -> float:
        return hottest_share(self.per_master_cpu_s)


@dataclass
class Decisions:
    clients: int
    passes: list[DecisionPass]
    filter_bits_per_item: float

    def get(self, phase: str) -> DecisionPass:
        return next(p for p in self.passes if p.phase == phase)


def measure_decisions(target: Target, plan: Plan) -> Decisions:
    target.client.flushall()
    BloomFilter(target.client, FILTER_KEY, capacity=plan.clients * (plan.decisions + WARM_UP),
                error_rate=ERROR_RATE, partitions=target.partitions, backend="bitmap")
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(plan.clients + 1, timeout=BARRIER_TIMEOUT_S)
    results = ctx.Queue()
    procs = [ctx.Process(target=_decision_client, name="decisions-%d" % i,
                         args=(target.url, "%s-%d-%d" % (target.name, target.masters, i),
                               plan.decisions, barrier, results))
             for i in range(plan.clients)]
    for p in procs:
        p.start()
    passes = []
    try:
        barrier.wait()  # every client ready
        for phase in ("new", "seen"):
            first = len(target.sampler.history)
            before = target.sampler()
            barrier.wait()
            started = time.perf_counter()
            barrier.wait()
            seconds = time.perf_counter() - started
            after = target.sampler()
            span, per_master = target.sampler.since(first)
            got = [results.get(timeout=BARRIER_TIMEOUT_S) for _ in procs]
            assert all(g[0] == phase for g in got), got
            passes.append(DecisionPass(
                phase=phase, decisions=sum(g[2] for g in got), new=sum(g[3] for g in got),
                seconds=seconds, redis_cpu_s=sum(per_master),
                idle_cpu_s=target.idle_cpu_per_s * span,
                client_cpu_s=sum(g[4] for g in got), per_master_cpu_s=per_master,
                commands=command_delta(before, after)))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():  # only the processes started above, by their pid
                p.kill()
                p.join(10)
    info = BloomFilter.open(target.client, FILTER_KEY).info()
    bits_per_item = info.bits / info.items if info.items else 0.0
    return Decisions(plan.clients, passes, bits_per_item)


# --- crawls -----------------------------------------------------------------------


@dataclass
class Crawl:
    run: CrawlRun
    stats_calls: int  # frontier_stats.lua calls counted (exchanges with stats)
    window_s: float  # Redis sampled over this long (worker start-up included)
    idle_cpu_s: float
    per_master_cpu_s: list[float]

    @property
    def pages(self) -> int:
        return self.run.distinct

    @property
    def net_cpu_s(self) -> float:
        return self.run.redis_process_cpu_s - self.idle_cpu_s

    @property
    def redis_us(self) -> float:
        return self.run.per_page(self.net_cpu_s) * 1e6

    @property
    def raw_us(self) -> float:
        return self.run.per_page(self.run.redis_process_cpu_s) * 1e6

    @property
    def exactly_once(self) -> bool:
        return self.run.missing == 0 and self.run.duplicates == 0


def measure_crawl(target: Target, plan: Plan, workers: int, site: SiteProcess,
                  workdir: Path) -> Crawl:
    first = len(target.sampler.history)
    # the demo site is one host: partitioned by host, it would all be one partition on
    # one master; spread by fingerprint (each partition then keeps the host's budget)
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": str(plan.max_idle), "ITEM_PIPELINES": "{}",
                "BLOOMFILTER_CAPACITY": str(CRAWL_CAPACITY),
                "BLOOMFILTER_PARTITION_BY": "fingerprint"}
    run = run_crawl(BLOOMCRAWL, workers=workers, site=site, client=target.client,
                    redis_url=target.url, workdir=workdir, timeout=plan.timeout,
                    settings=settings, sample=target.sampler)
    window, per_master = target.sampler.since(first)
    frontier_keys = keys.FrontierKeys("site")
    applied = target.client.hvals(frontier_keys.stats_applied)
    return Crawl(run, sum(int(v) for v in applied), window, target.idle_cpu_per_s * window,
                 per_master)


# --- synthetic pages: one exchange per page ----------------------------------------


EXCHANGE_LINKS = 20  # links a page sends to Redis; half of them seen before
REAP_CALLS = 1000  # partition calls of the reap measurement (whole reaps, at least 3)


@dataclass
class Exchanges:
    """Frontier.exchange as a worker sends it for one page at a time (an I/O-bound crawl)."""

    exchanges: int
    links: int
    seconds: float
    redis_cpu_s: float
    idle_cpu_s: float
    client_cpu_s: float
    per_master_cpu_s: list[float]
    commands: dict[str, tuple[int, int]]
    leased: int
    #: Frontier.reap() afterwards: partition calls made, Redis CPU, COMMAND GETKEYS calls
    reap_calls: int = 0
    reap_cpu_s: float = 0.0
    reap_getkeys: int = 0
    #: requests the exchanges queued (their new links, less the false positives)
    queued: int = 0
    #: slices a new link looked into, on average over the run (:func:`lookup_depth`)
    new_depth: float = 0.0
    #: slices a seen link is looked up in, at the end of the run (:func:`stored_depth`)
    seen_depth: float = 0.0

    @property
    def reap_us(self) -> float:
        """Redis CPU per partition a reap looks at (idle subtracted)."""
        return self.reap_cpu_s / self.reap_calls * 1e6 if self.reap_calls else 0.0

    def per_exchange(self, value: float) -> float:
        return value / self.exchanges

    @property
    def redis_us(self) -> float:
        return self.per_exchange(self.redis_cpu_s - self.idle_cpu_s) * 1e6

    @property
    def hottest(self) -> float:
        return hottest_share(self.per_master_cpu_s)

    def calls(self, command: str | None = None) -> float:
        if command is None:
            return self.per_exchange(sum(c for c, _ in self.commands.values()))
        return self.per_exchange(self.commands.get(command, (0, 0))[0])


#: a page of a filter partitioned by host: of the 10 links it sends new (and the 10 the
#: page before sent), this many are on its own site, the others each on another one;
#: a site's pages come SITE_PAGES in a row, as a worker's leases of one host do
OWN_HOST_LINKS = 8
SITE_PAGES = 4
SYNTHETIC_HOSTS = 500


def synthetic_host(page: int, link: int) -> str:
    """The host of link ``link`` (0-9) a synthetic page sends new."""
    own = page // SITE_PAGES % SYNTHETIC_HOSTS
    other = own if link < OWN_HOST_LINKS else (own * 7 + link * 13 + 1) % SYNTHETIC_HOSTS
    return "www.site-%d.example-synthetic.com" % other


def synthetic_pages(count: int, by_host: bool) -> list[list[Outgoing]]:
    """``count`` pages of 20 links: 10 the page before sent (seen), then 10 new.

    ``by_host``: the links go where a filter partitioned by host (the default) puts
    them, 16 of 20 on the page's own site (:func:`synthetic_host`); else one host's
    requests spread by fingerprint over every partition (the cost of the calls, not
    of the politeness).
    """
    half = EXCHANGE_LINKS // 2
    payloads = request_payloads(count * half + half, "-synthetic")
    fps = [hashlib.sha1(p.encode()).digest() for p in payloads]
    host = "www.example-news-site-synthetic.com"

    def link(page: int, n: int, j: int) -> Outgoing:
        if not by_host:
            return Outgoing(fps[j], False, 0.0, payloads[j], host)
        # a seen link is one the page before sent new: on the host it had then
        where = synthetic_host(page - 1, n) if n < half else synthetic_host(page, n - half)
        return Outgoing(filter_fingerprint(fps[j], where, "host"), False, 0.0, payloads[j],
                        where)

    return [[link(i, n, j)
             for n, j in enumerate((*range(i * half, (i + 1) * half),
                                    *range((i + 1) * half, (i + 2) * half)))]
            for i in range(count)]


#: new links of docs/scale.md's page: its crawl dedups 10^10 URLs and fetches 10^10
#: pages, so over the crawl a page's links hold one URL not seen before on average (the
#: synthetic pages above have 10, a frontier that grows by 9 requests a page)
PLAN_NEW_LINKS = 1


def plan_host(page: int, link: int) -> str:
    """The host of link ``link`` (0-19) of a page of :func:`plan_pages`: the hosts of
    :func:`synthetic_pages`' page by host, so that only which links are new differs."""
    half = EXCHANGE_LINKS // 2
    return synthetic_host(page - 1, link) if link < half else synthetic_host(page, link - half)


def plan_pages(count: int) -> tuple[list[list[Outgoing]], list[bytes]]:
    """``count`` pages of docs/scale.md's crawl, partitioned by host: of each page's 20
    links, PLAN_NEW_LINKS (on its own site) are new and the others in the filter before
    the first page (the second list: add them first), on :func:`plan_host`'s hosts."""
    payloads = request_payloads(count * EXCHANGE_LINKS, "-plan")
    half = EXCHANGE_LINKS // 2
    pages, seen = [], []
    for i in range(count):
        links = []
        for n in range(EXCHANGE_LINKS):
            payload = payloads[i * EXCHANGE_LINKS + n]
            where = plan_host(i, n)
            fp = filter_fingerprint(hashlib.sha1(payload.encode()).digest(), where, "host")
            links.append(Outgoing(fp, False, 0.0, payload, where))
            if not half <= n < half + PLAN_NEW_LINKS:  # new: the first on its own site
                seen.append(fp)
        pages.append(links)
    return pages, seen


#: on a cluster a worker sends its counts at most once a CLUSTER_STATS_INTERVAL
#: (one Redis: with every exchange); a worker of the slowest WORKER_RATES, one exchange
#: a page, then sends them with one exchange in this many
CLUSTER_STATS_EVERY = max(1, round(min(WORKER_RATES) * CLUSTER_STATS_INTERVAL))


def lease_partitions(count: int, partitions: int, by_host: bool) -> list[int]:
    """The partition synthetic exchange ``i`` leases from (and the next one acks).

    A worker asks first the partition its acks go to (``lease_order``), so by host a
    page's ack and its next lease ride in the call of its own site's partition: the
    lease is modelled as bringing the next page, of the site after every
    ``SITE_PAGES`` pages (from the partition of that site then), which makes one
    more call a page than a worker that keeps leasing where it acks. By
    fingerprint a page's partitions are random: round robin.
    """
    if not by_host:
        return [i % partitions for i in range(count)]
    return [host_partition(synthetic_host(i + 1, 0), partitions) for i in range(count)]


def partition_calls(pages: list[list[Outgoing]], partitions: int, by_host: bool,
                    stats_every: int) -> float:
    """Script calls per page as :func:`measure_exchanges` sends them with ``partitions``:
    one per partition its links, the previous lease's ack and its lease touch, and
    the stats call of one page in ``stats_every``."""
    leases = lease_partitions(len(pages), partitions, by_host)
    total = 0
    for i, links in enumerate(pages):
        touched = {partition_of(e.fingerprint, partitions) for e in links}
        touched |= {leases[i], leases[i - 1]} if i else {leases[i]}
        total += len(touched) + (i % stats_every == 0)
    return total / len(pages)


def lookup_depth(client: Any, name: str, partitions: int) -> float:
    """Slices a new item of filter ``name`` looked into, on average over its items so
    far: one written while slice j was the newest looked into j + 1 (a new item is
    looked up in every slice)."""
    items = depth = 0
    for p in range(partitions):
        state = client.hgetall(keys.state_key(name, p))
        for key, value in state.items():
            if key.startswith(b"items:"):
                n = int(value)
                items += n
                depth += n * (int(key[6:]) + 1)
    return depth / items if items else 0.0


def seen_lookups(items: Sequence[float], capacities: Sequence[float]) -> float:
    """Slices an item a partition holds is looked up in, on average over its items
    (slice 0 first in both lists): bloom_common.lua's lookup() looks in the newest slice
    first, or first in the one before it while the newest holds fewer items than that
    one's capacity, then in the older ones, newest first."""
    n, total = len(items), sum(items)
    if not total:
        return 0.0
    swap = n > 1 and items[-1] < capacities[-2]
    at = 0.0
    for i, count in enumerate(items, 1):
        at += count * ((1 if i == n - 1 else 2) if swap and i >= n - 1 else n + 1 - i)
    return at / total


def stored_depth(client: Any, name: str, partitions: int) -> float:
    """:func:`seen_lookups` of filter ``name`` as it is, over all its partitions."""
    at = total = 0.0
    for p in range(partitions):
        state = client.hgetall(keys.state_key(name, p))
        slices = int(state.get(b"slices", 0))
        items = [int(state.get(b"items:%d" % j, 0)) for j in range(slices)]
        caps = [int(state[b"plan:%d" % j].split()[0]) for j in range(slices)]
        at += seen_lookups(items, caps) * sum(items)
        total += sum(items)
    return at / total if total else 0.0


def _design_slices(partitions: int, first_slices: int | None) -> list[int]:
    """Capacities of the slices a partition of docs/scale.md's filter fills, in order:
    ESTIMATE_URLS over ``partitions``, the bench's error rate, BLOOMFILTER_CAPACITY set
    to ESTIMATE_URLS; BLOOMFILTER_INITIAL_CAPACITY ``first_slices`` (None: not set, the
    default first slice of each partition)."""
    first = (defaults.FILTER_INITIAL_CAPACITY if first_slices is None
             else -(-first_slices // partitions))
    params = FilterParams(capacity=ESTIMATE_URLS, error_rate=ERROR_RATE,
                          partitions=partitions, partition_by="host", hashing=HASHING,
                          initial_capacity=first)
    caps, left = [], ESTIMATE_URLS / partitions
    for plan in params.plan():
        caps.append(plan.capacity)
        left -= plan.capacity
        if left <= 0:
            break
    return caps


def design_depth(partitions: int, first_slices: int | None = None) -> float:
    """:func:`lookup_depth` of a filter made for docs/scale.md's crawl
    (:func:`_design_slices`), once it holds it."""
    left, items, depth = ESTIMATE_URLS / partitions, 0.0, 0.0
    for j, cap in enumerate(_design_slices(partitions, first_slices)):
        n = min(cap, left)
        items, depth, left = items + n, depth + n * (j + 1), left - n
    return depth / items


#: fill levels :func:`design_seen_depth` averages over
SEEN_STEPS = 400


def design_seen_depth(partitions: int, first_slices: int | None = None) -> float:
    """:func:`seen_lookups` of the same filter, on average over its fill (a page's seen
    links come at the same rate as it fills: evenly spread over the items it holds)."""
    caps = _design_slices(partitions, first_slices)
    share, total = ESTIMATE_URLS / partitions, 0.0
    for step in range(1, SEEN_STEPS + 1):
        left, items = share * step / SEEN_STEPS, []
        for cap in caps:
            items.append(min(cap, left))
            left -= items[-1]
            if left <= 0:
                break
        total += seen_lookups(items, caps[:len(items)])
    return total / SEEN_STEPS


#: the slices deep a filter is in the two runs of :func:`measure_slice_cost`
SLICE_DEPTHS = (6, 10)
SLICE_ITEMS = 5000  # new items each run decides (fewer than slice 5 holds)
SLICE_CALL = 10  # items a call, as a page's own site's call sends its new links


@dataclass
class SliceCost:
    """Redis CPU per new item (bloom_add.lua) with the filter SLICE_DEPTHS slices deep."""

    us: tuple[float, float]

    @property
    def per_slice_us(self) -> float:
        return (self.us[1] - self.us[0]) / (SLICE_DEPTHS[1] - SLICE_DEPTHS[0])


def measure_slice_cost(client: redis.Redis) -> SliceCost:
    """A new item is looked up in every slice: its cost per slice, from one partition
    filled to SLICE_DEPTHS[0] and to SLICE_DEPTHS[1] slices (the defaults' first slice
    and growth), then SLICE_ITEMS new items in calls of SLICE_CALL, 100 a pipeline."""
    script = Script.for_backend("bitmap", "bloom_add.lua")
    name = "scale-depth:bloomfilter"
    out = []
    for depth in SLICE_DEPTHS:
        client.flushall()
        bloom = BloomFilter(client, name, capacity=defaults.FILTER_CAPACITY, partitions=1,
                            error_rate=ERROR_RATE, backend="bitmap", partition_by="fingerprint",
                            initial_capacity=defaults.FILTER_INITIAL_CAPACITY)
        before = sum(plan.capacity for plan in bloom.params.plan()[:depth - 1])
        fill = fingerprints(before, "depth-%d:" % depth)
        for start in range(0, before, BATCH):
            bloom.add_many(fill[start:start + BATCH])
        new = fingerprints(SLICE_ITEMS, "depth-new-%d:" % depth)
        calls = [ScriptCall(script, [keys.state_key(name, 0)],
                            [b"".join(new[i:i + SLICE_CALL])])
                 for i in range(0, SLICE_ITEMS, SLICE_CALL)]
        cpu = _cpu(client)
        for start in range(0, len(calls), CALLS_PER_PIPELINE):
            bloom.run_scripts(calls[start:start + CALLS_PER_PIPELINE])
        out.append((_cpu(client) - cpu) / SLICE_ITEMS * 1e6)
        slices = int(client.hget(keys.state_key(name, 0), "slices") or 0)
        assert slices == depth, (depth, slices)  # the new items stayed in the newest slice
    client.flushall()
    return SliceCost((out[0], out[1]))


def measure_exchanges(target: Target, count: int, by_host: bool = False,
                      plan_mix: bool = False, sized: bool = False) -> Exchanges:
    """``count`` exchanges (:func:`synthetic_pages`; ``plan_mix``: :func:`plan_pages`, by
    host), one after another, each with the previous lease's ack, a lease
    (:func:`lease_partitions`) and the worker's stats (on a cluster with one exchange in
    CLUSTER_STATS_EVERY, as a worker sends them). ``sized``: the filter's first slices
    hold its whole capacity (BLOOMFILTER_INITIAL_CAPACITY), one slice a partition, as
    docs/scale.md recommends; else each partition grows from its first small slice."""
    target.client.flushall()
    by_host = by_host or plan_mix
    frontier_keys = keys.FrontierKeys("synthetic", partitions=target.partitions)
    capacity = count * EXCHANGE_LINKS
    bloom = BloomFilter(target.client, frontier_keys.filter, capacity=capacity,
                        partitions=target.partitions, error_rate=ERROR_RATE, backend="bitmap",
                        initial_capacity=capacity if sized else None)
    frontier = Frontier(target.client, bloom, frontier_keys, queue_type="priority",
                        lease_timeout=300, worker_id="synthetic", node="synthetic")
    frontier.record_layout()
    half = EXCHANGE_LINKS // 2
    if plan_mix:
        pages, seen = plan_pages(count)
        for start in range(0, len(seen), BATCH):
            bloom.add_many(seen[start:start + BATCH])
        # seen already, so nothing is queued: loads the scripts
        frontier.exchange(pages[0][:half], {})
    else:
        pages = synthetic_pages(count, by_host)
        frontier.exchange(pages[0][:half], {})  # the first page's "seen" links; scripts loaded
    leases = lease_partitions(count, frontier.partitions, by_host)
    stats_every = CLUSTER_STATS_EVERY if target.name == "cluster" else 1
    first = len(target.sampler.history)
    before = target.sampler()
    cpu, started = time.process_time(), time.perf_counter()
    acks: dict[int, list[str]] = {}
    leased = queued = 0
    for i, links in enumerate(pages):
        stats = [] if i % stats_every else [(i // stats_every + 1,
                                             {"pages": stats_every,
                                              "filtered": half * stats_every})]
        done = frontier.exchange(links, acks, stats, lease_from=leases[i])
        acks = {lease.partition: [lease.token] for lease in done.leases}
        leased += len(done.leases)
        queued += done.queued
    seconds, client_cpu = time.perf_counter() - started, time.process_time() - cpu
    after = target.sampler()
    span, per_master = target.sampler.since(first)
    done = Exchanges(count, EXCHANGE_LINKS, seconds, sum(per_master),
                     target.idle_cpu_per_s * span, client_cpu, per_master,
                     command_delta(before, after), leased, queued=queued,
                     new_depth=lookup_depth(target.client, frontier_keys.filter,
                                            frontier.partitions),
                     seen_depth=stored_depth(target.client, frontier_keys.filter,
                                             frontier.partitions))
    # what every worker does every SCHEDULER_REAP_INTERVAL: one script call per partition
    reaps = max(3, REAP_CALLS // frontier.partitions)
    first = len(target.sampler.history)
    before = target.sampler()
    for _ in range(reaps):
        frontier.reap()
    after = target.sampler()
    span, per_master = target.sampler.since(first)
    done.reap_calls = reaps * frontier.partitions
    done.reap_cpu_s = sum(per_master) - target.idle_cpu_per_s * span
    done.reap_getkeys = command_delta(before, after).get(GETKEYS, (0, 0))[0]
    target.client.flushall()
    return done


# --- on one Redis: the stats slot, the queue's memory, the exporter ---------------


@dataclass
class StatsCost:
    calls_alone: int
    us_alone: float  # Redis CPU per call, one call per round trip
    calls_pipelined: int
    us_pipelined: float  # Redis CPU per call, 100 calls per round trip


def _cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def measure_stats_calls(client: redis.Redis, calls: int) -> StatsCost:
    """The shared stats script, as a worker's exchange sends it (Frontier.exchange)."""
    client.flushall()
    frontier_keys = keys.FrontierKeys("scale", partitions=defaults.FILTER_PARTITIONS)
    bloom = BloomFilter(client, frontier_keys.filter, capacity=1000,
                        partitions=defaults.FILTER_PARTITIONS, backend="bitmap")
    frontier = Frontier(client, bloom, frontier_keys, queue_type="priority", lease_timeout=30,
                        worker_id="scale-bench", node="scale-bench")
    counts = {"pages": 1, "filtered": 19}
    number = 1
    frontier.exchange((), {}, [(number, counts)])  # loads the script
    before = _cpu(client)
    for _ in range(calls):
        number += 1
        frontier.exchange((), {}, [(number, counts)])
    alone = (_cpu(client) - before) / calls * 1e6
    before = _cpu(client)
    for _ in range(calls // 100):
        frontier.exchange((), {}, [(number + i + 1, counts) for i in range(100)])
        number += 100
    pipelined = (_cpu(client) - before) / (calls // 100 * 100) * 1e6
    client.flushall()
    return StatsCost(calls, alone, calls // 100 * 100, pipelined)


@dataclass
class CallCost:
    """Redis CPU of one partition script call (bloom_add.lua) as ``c0 + c1 x fingerprints``."""

    calls: int
    us_small: float  # per call of SMALL_CALL fingerprints
    us_large: float  # per call of LARGE_CALL fingerprints
    us_seen: float = 0.0  # per call of the same LARGE_CALL fingerprints again (all seen)

    @property
    def per_fingerprint_us(self) -> float:
        return (self.us_large - self.us_small) / (LARGE_CALL - SMALL_CALL)

    @property
    def fixed_us(self) -> float:
        return self.us_small - SMALL_CALL * self.per_fingerprint_us

    @property
    def per_seen_fingerprint_us(self) -> float:
        return max(0.0, self.us_seen - self.fixed_us) / LARGE_CALL


SMALL_CALL, LARGE_CALL = 1, 20
CALL_PARTITIONS = 64
CALLS_PER_PIPELINE = 100


def measure_call_cost(client: redis.Redis, calls: int) -> CallCost:
    """Pipelined script calls of 1 and of 20 new fingerprints, each on its own partition,
    then the calls of 20 again (every fingerprint seen)."""
    client.flushall()
    name = "scale-calls:bloomfilter"
    bloom = BloomFilter(client, name, capacity=calls * (SMALL_CALL + LARGE_CALL),
                        partitions=CALL_PARTITIONS, error_rate=ERROR_RATE, backend="bitmap")
    script = Script.for_backend("bitmap", "bloom_add.lua")
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(CALL_PARTITIONS)}
    for fp in fingerprints(calls * (SMALL_CALL + LARGE_CALL) * 2, "calls:"):
        by_partition[partition_of(fp, CALL_PARTITIONS)].append(fp)
    bloom.add_many(fingerprints(CALL_PARTITIONS * 4, "calls-warm:"))  # loaded, chunks allocated

    def timed(batch: list[ScriptCall]) -> float:
        before = _cpu(client)
        for start in range(0, calls, CALLS_PER_PIPELINE):
            bloom.run_scripts(batch[start:start + CALLS_PER_PIPELINE])
        return (_cpu(client) - before) / calls * 1e6

    def new_calls(per_call: int) -> list[ScriptCall]:
        batch = []
        for i in range(calls):
            p = i % CALL_PARTITIONS
            fps, by_partition[p] = by_partition[p][:per_call], by_partition[p][per_call:]
            batch.append(ScriptCall(script, [keys.state_key(name, p)], [b"".join(fps)]))
        return batch

    small = timed(new_calls(SMALL_CALL))
    large_calls = new_calls(LARGE_CALL)
    large = timed(large_calls)
    seen = timed(large_calls)
    client.flushall()
    return CallCost(calls, small, large, seen)


@dataclass
class QueueMemory:
    requests: int
    payload_bytes: float  # mean serialized request (JSON)
    zset_bytes: float  # MEMORY USAGE of the priority queue per request
    list_bytes: float  # MEMORY USAGE of a fifo/lifo queue per request
    item_id_bytes: float  # MEMORY USAGE of {<items>}:ids per item id ("<fingerprint>:0")


def request_payloads(n: int, label: str = "") -> list[str]:
    """Requests as the site spider queues them: a ~95-char URL, its Referer, depth, domains."""
    from scrapy import Request

    from bloomcrawl.crawl.serialization import request_to_json
    from bloomcrawl.crawl.spiders.site import SiteSpider

    spider = SiteSpider()
    host = "www.example-news-site%s.com" % label
    payloads = []
    for i in range(n):
        url = "https://%s/2024/05/17/an-article-title-with-several-words-%08d.html" % (host, i)
        referer = "https://%s/2024/05/16/another-article-title-words-%08d.html" % (host, i // 20)
        request = Request(url, meta={"site_domains": [host], "depth": 3},
                          headers={"Referer": referer})
        payloads.append(request_to_json(request, spider))
    return payloads


def measure_queue_memory(client: redis.Redis, n: int) -> QueueMemory:
    payloads = request_payloads(n)
    client.flushall()
    pipe = client.pipeline(transaction=False)
    for start in range(0, n, 1000):
        chunk = payloads[start:start + 1000]
        pipe.zadd("scale:queue:zset", {p: -0.0 for p in chunk})
        pipe.rpush("scale:queue:list", *chunk)
    pipe.execute()
    ids = ["%s:0" % hashlib.sha1(p.encode()).hexdigest() for p in payloads]
    for start in range(0, n, 1000):
        pipe.sadd("scale:items:ids", *ids[start:start + 1000])
    pipe.execute()
    zset = int(client.memory_usage("scale:queue:zset", samples=0) or 0)
    lst = int(client.memory_usage("scale:queue:list", samples=0) or 0)
    id_set = int(client.memory_usage("scale:items:ids", samples=0) or 0)
    client.flushall()
    return QueueMemory(n, statistics.fmean(len(p) for p in payloads), zset / n, lst / n,
                       id_set / n)


@dataclass
class ExporterCost:
    partitions: int
    commands: float  # Redis commands per snapshot
    redis_usec: float  # their time per snapshot (INFO commandstats)
    redis_cpu_us: float  # Redis process CPU per snapshot
    client_ms: float  # wall time of one snapshot in this process


def measure_exporter(client: redis.Redis, partitions: Sequence[int], scrapes: int
                     ) -> list[ExporterCost]:
    """What one exporter snapshot costs Redis for a spider of P partitions."""
    from bloomcrawl.ops.inspection import snapshot

    out = []
    for p in partitions:
        client.flushall()
        frontier_keys = keys.FrontierKeys("site", partitions=p)
        bloom = BloomFilter(client, frontier_keys.filter, capacity=1_000_000, partitions=p,
                            error_rate=ERROR_RATE, backend="bitmap")
        bloom.add_many(fingerprints(20 * p, "exporter:"))
        frontier = Frontier(client, bloom, frontier_keys, queue_type="priority",
                            lease_timeout=30, worker_id="scale-bench", node="scale-bench")
        frontier.record_layout()
        frontier.exchange((), {}, [(1, {"pages": 1})])
        snapshot(client)  # warm: the slice plan is computed once per process
        before = redis_sample(client)
        started = time.perf_counter()
        for _ in range(scrapes):
            snapshot(client)
        seconds = time.perf_counter() - started
        after = redis_sample(client)
        calls = usec = 0
        for name, (c, u) in after.commands.items():
            c0, u0 = before.commands.get(name, (0, 0))
            if name != "info":
                calls += c - c0
                usec += u - u0
        # the two samples' own INFO calls are left out by name; their CPU is not
        out.append(ExporterCost(p, calls / scrapes, usec / scrapes,
                                (after.cpu - before.cpu).process_s / scrapes * 1e6,
                                seconds / scrapes * 1e3))
    client.flushall()
    return out


@dataclass
class Extras:
    redis_version: str
    stats: StatsCost
    calls: CallCost
    queue: QueueMemory
    exporter: list[ExporterCost]
    #: the least Redis spends on a page's exchange (bench/_exchange_floor.py)
    floor: ExchangeFloor
    depth: SliceCost


def measure_extras(plan: Plan) -> Extras:
    with RedisServer() as server:
        client = server.client(socket_timeout=120)
        try:
            return Extras(str(client.info("server")["redis_version"]),
                          measure_stats_calls(client, plan.stats_calls),
                          measure_call_cost(client, plan.stats_calls),
                          measure_queue_memory(client, plan.queued),
                          measure_exporter(client, plan.exporter_partitions, EXPORTER_SCRAPES),
                          measure_exchange_floor(client, plan.stats_calls),
                          measure_slice_cost(client))
        finally:
            client.close()


# --- one target, all of it --------------------------------------------------------


@dataclass
class TargetResult:
    name: str
    masters: int
    partitions: int
    idle_cpu_per_s: float
    decisions: Decisions
    exchanges: Exchanges
    #: the same synthetic pages, their links where a filter partitioned by host puts them
    host_exchanges: Exchanges
    #: pages of docs/scale.md's crawl, by host (:func:`plan_pages`)
    plan_exchanges: Exchanges
    #: the same, the filter sized up front (BLOOMFILTER_INITIAL_CAPACITY: one slice): the
    #: median of SIZED_TURNS turns, whose Redis CPU a page is ``sized_turns_us`` (sorted)
    plan_sized_exchanges: Exchanges
    sized_turns_us: list[float] = field(default_factory=list)
    crawls: list[Crawl] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return "1 Redis" if self.name == "redis" else "cluster"

    def pooled_page_us(self) -> float | None:
        pages = sum(c.pages for c in self.crawls)
        return sum(c.net_cpu_s for c in self.crawls) / pages * 1e6 if pages else None

    def pooled_page_hottest(self) -> float:
        if not self.crawls:
            return 1.0
        per_master = [sum(c.per_master_cpu_s[i] for c in self.crawls)
                      for i in range(len(self.crawls[0].per_master_cpu_s))]
        return hottest_share(per_master)

    def per_page(self, value: Callable[[Crawl], float]) -> float | None:
        pages = sum(c.pages for c in self.crawls)
        return sum(value(c) for c in self.crawls) / pages if pages else None

    def best_rate(self) -> float | None:
        return max((c.run.pages_per_second for c in self.crawls), default=None)


def run_target(masters: int, plan: Plan, site: SiteProcess, workdir: Path,
               crawl: bool) -> TargetResult:
    what = "one Redis" if masters == 0 else "a cluster of %d master%s" % (
        masters, "" if masters == 1 else "s")
    say_progress("starting %s ..." % what)
    target, stop = start_target(masters, workdir / ("servers-%d" % masters))
    try:
        measure_idle(target, plan.idle_s)
        say_progress("  %s: %d x %d decisions, twice ..." % (what, plan.clients, plan.decisions))
        decisions = measure_decisions(target, plan)
        say_progress("  %s: %d synthetic pages, one exchange each ..." % (what, plan.exchanges))
        exchanges = measure_exchanges(target, plan.exchanges)
        say_progress("  %s: the same pages partitioned by host ..." % what)
        host_exchanges = measure_exchanges(target, plan.exchanges, by_host=True)
        say_progress("  %s: the plan's pages, %d new link of %d ..."
                     % (what, PLAN_NEW_LINKS, EXCHANGE_LINKS))
        plan_exchanges = measure_exchanges(target, plan.exchanges, plan_mix=True)
        say_progress("  %s: the plan's pages, the filter sized up front, %d turns ..."
                     % (what, SIZED_TURNS))
        turns = sorted((measure_exchanges(target, plan.exchanges, plan_mix=True, sized=True)
                        for _ in range(SIZED_TURNS)), key=lambda e: e.redis_us)
        result = TargetResult(target.name, target.masters, target.partitions,
                              target.idle_cpu_per_s, decisions, exchanges, host_exchanges,
                              plan_exchanges, turns[len(turns) // 2],
                              sized_turns_us=[e.redis_us for e in turns])
        for workers in plan.workers if crawl else ():
            say_progress("  %s: crawl by %d worker%s ..." % (what, workers,
                                                              "" if workers == 1 else "s"))
            try:
                result.crawls.append(measure_crawl(
                    target, plan, workers, site, workdir / ("crawl-%d-%d" % (masters, workers))))
            except CrawlFailed as exc:
                result.failures.append("%s, %d workers: %s" % (what, workers, exc))
                print(str(exc), file=sys.stderr, flush=True)
        return result
    finally:
        stop()


#: the plan's pages on a sized filter, the estimate's verdict, are measured this many
#: times on each target and the median turn kept: on a cluster of 3 masters sharing 2
#: cores with the client, one turn's Redis CPU a page moved between 281 and 440 us
SIZED_TURNS = 3


# --- output -----------------------------------------------------------------------


#: the plan of docs/scale.md: masters and partitions the per-page estimate is for, and
#: the URLs its filter holds (BLOOMFILTER_CAPACITY)
ESTIMATE_MASTERS, ESTIMATE_PARTITIONS = 64, 512
ESTIMATE_URLS = 10**10


def spread(bins: int, draws: float) -> float:
    """Distinct bins ``draws`` random draws hit, on average."""
    return bins * (1 - (1 - 1 / bins) ** draws)


#: docs/scale.md's target for the estimate (issue 20), us of Redis CPU a page
ESTIMATE_TARGET_US = 400


def estimate_lines(results: Sequence[TargetResult], extras: Extras | None,
                   plan: Plan) -> list[str]:
    """Redis CPU per synthetic page on ESTIMATE_MASTERS masters (docs/scale.md's estimate).

    From the largest cluster measured: its Redis CPU per page less the filter's
    work for the page's fingerprints (the partition-call slopes measured on one
    Redis, new and seen) is the calls' fixed cost, all in (scripts, their pipelines);
    times the calls a page makes with ESTIMATE_PARTITIONS partitions (counted on the
    synthetic pages themselves, as :func:`measure_exchanges` sends them on a cluster),
    plus the fingerprints' work again. The high end adds one round trip (a stats call
    alone less one pipelined) for each master a page reaches beyond those it reached
    in the measurement. The synthetic filter holds a few thousand items a partition,
    so a link is looked up in one or two slices; at the depth of docs/scale.md's
    filter (:func:`design_depth`, :func:`design_seen_depth`) each slice more costs what
    :func:`measure_slice_cost` measured. Three pages: by fingerprint and by host with
    10 new links of 20 (a frontier that grows), and by host with PLAN_NEW_LINKS (the
    plan's crawl, on average). Every estimate line ends with its verdict against
    ESTIMATE_TARGET_US and its own floor (:func:`estimate_verdict`); the TARGET line, the
    plan's page on a filter sized up front, is the headline the target is judged on.
    """
    clusters = [r for r in results if r.name == "cluster"]
    if not clusters or extras is None:
        return []
    biggest = max(clusters, key=lambda r: r.masters)
    rtt = extras.stats.us_alone - extras.stats.us_pipelined
    per_new, per_seen = extras.calls.per_fingerprint_us, extras.calls.per_seen_fingerprint_us
    half = EXCHANGE_LINKS // 2
    floor, slice_us = extras.floor, extras.depth.per_slice_us
    count = min(plan.exchanges, 2000)
    lines = [f"ESTIMATE for {ESTIMATE_MASTERS} masters and {ESTIMATE_PARTITIONS} partitions,"
             f" one exchange a page (arithmetic on the {biggest.label} of {biggest.masters}"
             f" above; a fingerprint {per_new:.2f} us new and {per_seen:.2f} us seen, a round"
             f" trip {rtt:.1f} us, a slice more {slice_us:.2f} us, measured on one Redis"
             f" below):"]
    sized_us, sized_floor_us = 0.0, 0
    for name, e, by_host, new, measured_sized in (
            ("by fingerprint, 10 new links", biggest.exchanges, False, half, None),
            ("by host, 10 new links", biggest.host_exchanges, True, half, None),
            (f"by host, the plan's page ({PLAN_NEW_LINKS} new link)", biggest.plan_exchanges,
             True, PLAN_NEW_LINKS, biggest.plan_sized_exchanges)):
        seen = EXCHANGE_LINKS - new
        scripts = e.calls("evalsha")
        fingerprints = new * per_new + seen * per_seen
        per_call = max(0.0, e.redis_us - fingerprints) / scripts
        pages = (plan_pages(count)[0] if new == PLAN_NEW_LINKS
                 else synthetic_pages(count, by_host))
        calls = partition_calls(pages, ESTIMATE_PARTITIONS, by_host, CLUSTER_STATS_EVERY)
        reached = spread(ESTIMATE_MASTERS, calls)
        extra = max(0.0, reached - spread(biggest.masters, scripts))
        high = calls * per_call + fingerprints + extra * rtt
        # slices more than the measured filter's a link is looked up in, new and seen
        deep_new = max(0.0, design_depth(ESTIMATE_PARTITIONS) - e.new_depth)
        deep_seen = max(0.0, design_seen_depth(ESTIMATE_PARTITIONS) - e.seen_depth)
        lookups = new * deep_new + seen * deep_seen
        stats = 1 / CLUSTER_STATS_EVERY  # stats calls a page
        least = (floor.page_us(calls - stats, new, seen) + stats * extras.stats.us_pipelined
                 + reached * rtt)
        # a slice more is one block read more: what a seen link's floor is
        deep_us, deep_floor = high + lookups * slice_us, least + lookups * floor.seen_us
        lines.append(f"  {name}: {calls:.1f} calls a page x {per_call:.1f} us + {new} new"
                     f" and {seen} seen fingerprints {fingerprints:.0f} us + {extra:.1f} more"
                     f" masters reached x {rtt:.1f} us = {high:,.0f} us a page"
                     f"{estimate_verdict(high, least)}")
        lines.append(f"    AT THE PLAN'S DEPTH (BLOOMFILTER_CAPACITY={ESTIMATE_URLS}, each"
                     f" partition growing to its share): a new link is looked up in"
                     f" {deep_new:.1f} slices more than here, a seen one in {deep_seen:.1f}"
                     f" more: + {lookups:.0f} lookups x {slice_us:.2f} us ="
                     f" {deep_us:,.0f} us a page{estimate_verdict(deep_us, deep_floor)}")
        if measured_sized is None:
            # arithmetic only: the measured filter's own depth stays in (an upper bound)
            sized = (new * max(0.0, design_depth(ESTIMATE_PARTITIONS, ESTIMATE_URLS)
                               - e.new_depth)
                     + seen * max(0.0, design_seen_depth(ESTIMATE_PARTITIONS, ESTIMATE_URLS)
                                  - e.seen_depth))
            sized_us = high + sized * slice_us
            lines.append(f"    with BLOOMFILTER_INITIAL_CAPACITY={ESTIMATE_URLS} too (one"
                         f" slice a partition for its share): + {sized:.0f} lookups ="
                         f" {sized_us:,.0f} us a page (the measured filter's depth kept)"
                         f"{estimate_verdict(sized_us, least + sized * floor.seen_us)}")
        else:
            # measured: the same pages on a filter of one slice a partition, as the plan's
            # (no lookup more than those measured)
            sized = 0.0
            s_scripts = measured_sized.calls("evalsha")
            s_call = max(0.0, measured_sized.redis_us - fingerprints) / s_scripts
            s_extra = max(0.0, reached - spread(biggest.masters, s_scripts))
            sized_us = calls * s_call + fingerprints + s_extra * rtt
            lines.append(f"    with BLOOMFILTER_INITIAL_CAPACITY={ESTIMATE_URLS} too, measured"
                         f" on a filter sized up front (the median of {SIZED_TURNS} turns;"
                         f" a new link looked up in"
                         f" {measured_sized.new_depth:.1f} slices, a seen one in"
                         f" {measured_sized.seen_depth:.1f}, as in the plan's filter):"
                         f" {calls:.1f} calls x {s_call:.1f} us + {fingerprints:.0f} +"
                         f" {s_extra:.1f} x {rtt:.1f} us = {sized_us:,.0f} us a page"
                         f"{estimate_verdict(sized_us, least + sized * floor.seen_us)}")
        lines.append(f"    FLOOR, the same page's commands with no Lua work"
                     f" (bench/_exchange_floor.py): {calls - stats:.1f} partition calls"
                     f" x {floor.call_us:.1f} us + {new} new links x {floor.new_us:.1f}"
                     f" + {seen} seen x {floor.seen_us:.1f} + a lease"
                     f" and an ack {floor.lease_ack_us:.1f} + {stats:.2f} stats call"
                     f" x {extras.stats.us_pipelined:.1f} + a round trip to each of the"
                     f" {reached:.1f} masters reached x {rtt:.1f} = {least:,.0f} us a page;"
                     f" at the plan's depth + {lookups:.0f} block reads x {floor.seen_us:.1f}"
                     f" = {least + lookups * floor.seen_us:,.0f} us. The estimate is"
                     f" {high / least:.1f}x the floor")
        # rounded as printed: the verdict is the one the printed figure gives
        sized_floor_us = round(least + sized * floor.seen_us)
    lines.append(f"  TARGET: at most {ESTIMATE_TARGET_US} us a page, the plan's page with"
                 f" BLOOMFILTER_INITIAL_CAPACITY (docs/scale.md's recommendation):"
                 f" {sized_us:,.0f} us, {verdict(round(sized_us) <= ESTIMATE_TARGET_US)}; its floor"
                 f" on this machine {sized_floor_us:,.0f} us: the target is"
                 f" {'reachable' if sized_floor_us <= ESTIMATE_TARGET_US else 'NOT reachable'}"
                 f" here")
    lines.append("  the headline is that line: the plan's page is the crawl docs/scale.md plans"
                 f" for (10^10 URLs, {PLAN_NEW_LINKS} new link of {EXCHANGE_LINKS} a page), and"
                 " docs/scale.md recommends sizing its filter up front"
                 " (BLOOMFILTER_INITIAL_CAPACITY); the other verdicts are the same estimate for"
                 " other pages, or the filter left to grow")
    return lines


def estimate_verdict(us: float, floor_us: float) -> str:
    """`` -> PASS|MISS (400 us), floor F us: reachable|NOT reachable``, rounded as printed."""
    shown, least = round(us), round(floor_us)
    return (f" -> {verdict(shown <= ESTIMATE_TARGET_US)} against {ESTIMATE_TARGET_US} us,"
            f" floor {least:,} us:"
            f" {'reachable' if least <= ESTIMATE_TARGET_US else 'NOT reachable'}")


_STARTED = time.monotonic()


def say_progress(line: str) -> None:
    print("[%5.1f s] %s" % (time.monotonic() - _STARTED, line), file=sys.stderr, flush=True)


def fmt_int(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def fmt_us(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.1f}" if abs(x) < 100 else f"{x:,.0f}"


def fmt_rtt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def projected_decisions(r: TargetResult) -> float:
    """Decisions/s on one dedicated core per master, the busiest master being the limit."""
    new = r.decisions.get("new")
    return 1e6 / new.redis_us / new.hottest


def projected_pages(r: TargetResult) -> float | None:
    us = r.pooled_page_us()
    return None if not us else 1e6 / us / r.pooled_page_hottest()


def report(plan: Plan, args: argparse.Namespace, results: list[TargetResult],
           extras: Extras | None, seconds: float, env: dict[str, Any]) -> None:
    quick = " --quick" if args.quick else ""
    emit(f"bloomcrawl scale benchmark (bench/scale.py{quick}): one Redis beside Redis Cluster"
        f" of {', '.join(map(str, plan.masters))} master(s), no replicas")
    emit(f"redis-server {env['redis']}, Python {env['python']}, redis-py {env['redis_py']};"
        f" {env['cpus']} CPUs shared by the clients, the workers, the demo site and every"
        f" redis-server; load average {env['load_start']} at start, {env['load_end']} at end;"
        f" {seconds:.0f} s")
    emit(f"decisions: {plan.clients} client processes x {plan.decisions:,} fingerprints,"
        f" add_many in batches of {BATCH:,}, error rate {ERROR_RATE:g}, bitmap backend;"
        f" crawls: {plan.pages:,}-page demo site (20 links a page), BLOOMFILTER_CAPACITY"
        f" {CRAWL_CAPACITY:,}, items dropped")
    emit()
    single = next((r for r in results if r.name == "redis"), None)
    single_rate = single.decisions.get("new").rate if single else None
    single_pages = single.best_rate() if single else None
    workers = "/".join("%dw" % w for w in plan.workers)
    header = ["target", "masters", "partitions", "decisions/s", "x 1 Redis", "Redis us/dec",
              f"pages/s {workers}", "x 1 Redis", "Redis us/page", "RTT/page",
              "proj. decisions/s *", "proj. pages/s *"]
    rows = []
    for r in results:
        new = r.decisions.get("new")
        by_workers = {c.run.workers: c for c in r.crawls}
        if r.crawls or r.failures:
            pages = "/".join(fmt_int(by_workers[w].run.pages_per_second) if w in by_workers
                             else "FAIL" for w in plan.workers)
        else:
            pages = "not run"
        best = r.best_rate()
        rows.append([
            r.label, str(r.masters) if r.name == "cluster" else "-", str(r.partitions),
            fmt_int(new.rate), fmt_ratio(new.rate / single_rate if single_rate else None),
            fmt_us(new.redis_us), pages,
            fmt_ratio(best / single_pages if best and single_pages else None),
            fmt_us(r.pooled_page_us()),
            fmt_rtt(r.per_page(lambda c: c.run.round_trips)),
            fmt_int(projected_decisions(r)), fmt_int(projected_pages(r)),
        ])
    for line in table(header, rows):
        emit(line)
    emit("MEASURED here (2 shared cores): decisions/s, pages/s, the x 1 Redis ratios, Redis"
        " us/dec and us/page, RTT/page.")
    if not plan.crawl_everywhere:
        emit("pages/s not run: --quick crawls on one Redis and the largest cluster only.")
    emit("* PROJECTED, not measured: one dedicated Redis core per master = 1e6 / (Redis us"
        " per decision or page), divided by the busiest master's measured share of the CPU"
        " (1 with one master; 1/N if N masters shared evenly).")
    emit("decisions/s: fingerprints never seen before (every decision inserts); Redis us:"
        " used_cpu_sys + used_cpu_user of every master, summed, minus their idle CPU over"
        " the same time; per page: over the whole crawl, all worker counts pooled;"
        " RTT/page: packets the workers sent (a pipeline reaching k masters counts k).")

    emit()
    emit("Decisions in detail (Redis us and client us per decision; hottest: the busiest"
        " master's share of the masters' CPU)")
    header = ["target", "masters", "new/s", "Redis us", "client us", "hottest", "seen/s",
              "Redis us", "client us", "scripts/1k", "GETKEYS/1k", "filter bits/item",
              "idle ms/s"]
    rows = []
    for r in results:
        new, seen = r.decisions.get("new"), r.decisions.get("seen")
        rows.append([r.label, str(r.masters), fmt_int(new.rate), fmt_us(new.redis_us),
                     fmt_us(new.client_us), "%.2f" % new.hottest, fmt_int(seen.rate),
                     fmt_us(seen.redis_us), fmt_us(seen.client_us),
                     "%.1f" % new.calls_per("evalsha"), "%.1f" % new.calls_per(GETKEYS),
                     "%.1f" % r.decisions.filter_bits_per_item,
                     "%.2f" % (r.idle_cpu_per_s * 1e3)])
    for line in table(header, rows):
        emit(line)
    emit("seen: the same fingerprints again (every decision finds its item, nothing is"
        " written); scripts/1k, GETKEYS/1k: EVALSHA and COMMAND GETKEYS calls per 1,000"
        " decisions (new pass); idle ms/s: CPU the idle masters used per second, summed (subtracted"
        " above).")

    emit()
    emit(f"Synthetic pages: one Frontier.exchange per page, one after another from one process"
        f" ({plan.exchanges:,} pages; each: {EXCHANGE_LINKS} links with their ~450-byte"
        f" requests, {EXCHANGE_LINKS // 2} new and {EXCHANGE_LINKS // 2} seen, the previous"
        f" lease's ack, a lease, and the stats: with every page on one Redis, with one in"
        f" {CLUSTER_STATS_EVERY} on a cluster, a {min(WORKER_RATES)} pages/s worker's"
        f" once a {CLUSTER_STATS_INTERVAL:g} s), as an I/O-bound worker sends them")
    header = ["target", "masters", "ms/page", "client us", "Redis us/page", "cmds/page",
              "scripts/page", "GETKEYS/page", "hottest", "leased", "reap us/partition",
              "GETKEYS/partition"]
    rows = []
    for r in results:
        e = r.exchanges
        rows.append([r.label, str(r.masters), "%.2f" % (e.per_exchange(e.seconds) * 1e3),
                     fmt_us(e.per_exchange(e.client_cpu_s) * 1e6), fmt_us(e.redis_us),
                     "%.1f" % e.calls(), "%.1f" % e.calls("evalsha"),
                     "%.1f" % e.calls(GETKEYS), "%.2f" % e.hottest,
                     "%d/%d" % (e.leased, e.exchanges), fmt_us(e.reap_us),
                     "%.1f" % (e.reap_getkeys / e.reap_calls if e.reap_calls else 0.0)])
    for line in table(header, rows):
        emit(line)
    emit("ms/page: this process's wall time per exchange (round trips included); client us:"
        " its CPU; Redis us/page: every master's CPU, summed, minus idle. reap us/partition:"
        " Frontier.reap() (what each worker runs every SCHEDULER_REAP_INTERVAL, one script"
        " call per partition, nothing expired), Redis CPU per partition.")
    emit()
    emit(f"The same pages partitioned by host (the default for new filters): of each page's"
        f" {EXCHANGE_LINKS} links, {2 * OWN_HOST_LINKS} on its own site ({SITE_PAGES} pages"
        f" of a site in a row), the others each on another of {SYNTHETIC_HOSTS} sites; a"
        f" page's ack and next lease go to its site's partition, as a worker leases first"
        f" where its acks go, but the lease before a site's first page from that site's")
    header = ["target", "masters", "new links", "ms/page", "client us", "Redis us/page",
              "cmds/page", "scripts/page", "us/script", "hottest", "leased", "queued/page"]
    rows = []
    for r in results:
        for new, e in ((str(EXCHANGE_LINKS // 2), r.host_exchanges),
                       (str(PLAN_NEW_LINKS), r.plan_exchanges),
                       (f"{PLAN_NEW_LINKS}, sized", r.plan_sized_exchanges)):
            rows.append([r.label, str(r.masters), new,
                         "%.2f" % (e.per_exchange(e.seconds) * 1e3),
                         fmt_us(e.per_exchange(e.client_cpu_s) * 1e6), fmt_us(e.redis_us),
                         "%.1f" % e.calls(), "%.1f" % e.calls("evalsha"),
                         fmt_us(e.redis_us / e.calls("evalsha")), "%.2f" % e.hottest,
                         "%d/%d" % (e.leased, e.exchanges), "%.2f" % e.per_exchange(e.queued)])
    for line in table(header, rows):
        emit(line)
    emit(f"new links {PLAN_NEW_LINKS}: docs/scale.md's page. Its crawl dedups 10^10 URLs and"
         f" fetches 10^10 pages, so a page's links hold one new URL on average; the other"
         f" {EXCHANGE_LINKS - PLAN_NEW_LINKS}, on the same hosts as above, are in the filter"
         f" before the first page; sized: the same pages on a filter whose first slice a"
         f" partition holds its whole share (BLOOMFILTER_INITIAL_CAPACITY, as docs/scale.md"
         f" recommends), so a link is looked up in one slice. queued/page: requests the"
         f" exchanges queued (their new links less the filter's false positives).")
    emit(f"sized: the median of {SIZED_TURNS} turns; Redis us/page of each turn: "
         + "; ".join(f"{r.label} of {r.masters} " + ", ".join(fmt_us(us) for us in
                                                              r.sized_turns_us)
                     for r in results if r.sized_turns_us))
    for line in estimate_lines(results, extras, plan):
        emit(line)

    emit()
    emit("Crawls in detail")
    header = ["target", "masters", "workers", "pages", "span s", "pages/s", "Redis us/page",
              "raw", "steady", "cmds/page", "scripts/page", "GETKEYS/page", "RTT/page",
              "stats calls/page", "hottest", "once"]
    rows = []
    for r in results:
        for c in r.crawls:
            run = c.run
            steady = run.steady_redis_cpu_per_page_s
            rows.append([
                r.label, str(r.masters), str(run.workers), str(run.distinct),
                "%.1f" % run.span_s, fmt_int(run.pages_per_second), fmt_us(c.redis_us),
                fmt_us(c.raw_us), fmt_us(None if steady is None else steady * 1e6),
                "%.1f" % run.per_page(run.command_count),
                "%.2f" % run.per_page(run.commands.get("evalsha", (0, 0))[0]),
                "%.2f" % run.per_page(run.commands.get(GETKEYS, (0, 0))[0]),
                "%.2f" % run.per_page(run.round_trips),
                "%.2f" % run.per_page(c.stats_calls), "%.2f" % hottest_share(c.per_master_cpu_s),
                "yes" if c.exactly_once else "NO (%d missing, %d twice)" % (
                    run.missing, run.duplicates)])
        for failure in r.failures:
            rows.append([r.label, str(r.masters), "FAILED", *[""] * 12,
                         failure.splitlines()[0][:60]])
    for line in table(header, rows):
        emit(line)
    emit("Redis us/page: process CPU over the crawl (worker start-up included) minus the idle"
        " CPU; raw: without that subtraction; steady: main thread from a tenth of the pages"
        " on, idle included (bench/crawl.py's column).")
    emit("scripts/page: EVALSHA calls; GETKEYS/page: COMMAND GETKEYS calls redis-py's"
        " cluster pipeline makes to find a queued EVALSHA's slot (each a round trip of its"
        " own to one node; counted in cmds/page and RTT/page).")
    emit("stats calls/page: frontier_stats.lua calls (exchanges carrying counts, from"
        " {site:stats}:applied) per page; each goes to the one stats slot.")

    if extras is not None:
        st, q = extras.stats, extras.queue
        emit()
        emit("On one Redis (measured):")
        emit(f"  stats slot: one frontier_stats.lua call costs Redis {st.us_alone:.1f} us alone"
            f" (one round trip each, {st.calls_alone:,} calls) and {st.us_pipelined:.1f} us"
            f" pipelined 100 a round trip: one core serves {1e6 / st.us_alone:,.0f} to"
            f" {1e6 / st.us_pipelined:,.0f} calls/s")
        cc = extras.calls
        emit(f"  partition script call (bloom_add.lua, {CALLS_PER_PIPELINE} calls a pipeline,"
            f" {cc.calls:,} calls of {SMALL_CALL} and of {LARGE_CALL} new fingerprints):"
            f" {cc.us_small:.1f} and {cc.us_large:.1f} us, i.e. {cc.fixed_us:.1f} us a call"
            f" + {cc.per_fingerprint_us:.2f} us a fingerprint; the calls of {LARGE_CALL}"
            f" again (all seen) {cc.us_seen:.1f} us, {cc.per_seen_fingerprint_us:.2f} us a"
            f" seen fingerprint")
        fl = extras.floor
        emit(f"  exchange floor (bench/_exchange_floor.py: only the commands a partition call"
            f" needs, no Lua work): {fl.call_us:.1f} us a call + {fl.new_us:.2f} a new link"
            f" (its block read and written, its payload queued) + {fl.seen_us:.2f} a seen"
            f" link; a lease and an ack {fl.lease_ack_us:.1f}")
        dc = extras.depth
        emit(f"  a new item's decision with the filter {SLICE_DEPTHS[0]} and {SLICE_DEPTHS[1]}"
            f" slices deep (bloom_add.lua, {SLICE_CALL} items a call, 100 calls a pipeline,"
            f" {SLICE_ITEMS:,} items each): {dc.us[0]:.1f} and {dc.us[1]:.1f} us, i.e."
            f" {dc.per_slice_us:.2f} us a slice it is looked up in")
        emit(f"  queue memory: {q.requests:,} serialized requests of {q.payload_bytes:.0f} bytes"
            f" (JSON, ~95-char URL and Referer): {q.zset_bytes:.0f} bytes each in a priority"
            f" queue (zset), {q.list_bytes:.0f} in a fifo/lifo queue (list), MEMORY USAGE;"
            f" an item id in {{<items>}}:ids: {q.item_id_bytes:.0f} bytes")
        header = ["partitions", "commands/scrape", "Redis usec/scrape", "Redis CPU us/scrape",
                  "snapshot ms"]
        rows = [[str(e.partitions), "%.0f" % e.commands, "%.0f" % e.redis_usec,
                 "%.0f" % e.redis_cpu_us, "%.1f" % e.client_ms] for e in extras.exporter]
        for line in table(header, rows, left=0):
            emit("  " + line)
        if len(extras.exporter) > 1:
            a, b = extras.exporter[0], extras.exporter[-1]
            dp = b.partitions - a.partitions
            emit(f"  exporter snapshot (bloomcrawl.ops.inspection.snapshot, one spider):"
                f" per partition {(b.commands - a.commands) / dp:.1f} commands,"
                f" {(b.redis_usec - a.redis_usec) / dp:.1f} us of command time,"
                f" {(b.redis_cpu_us - a.redis_cpu_us) / dp:.1f} us of Redis CPU"
                f" (slope from {a.partitions} to {b.partitions} partitions)")

    emit()
    emit("PROJECTED (arithmetic on the measured figures above, not measured):")
    for r in results:
        new = r.decisions.get("new")
        per_core = 1e6 / new.redis_us
        emit(f"  {r.label}{'' if r.name == 'redis' else ' of %d' % r.masters}: {per_core:,.0f}"
            f" decisions/s per Redis core (1e6 / {new.redis_us:.2f} us); {r.masters} dedicated"
            f" core(s): {per_core * r.masters:,.0f} if even, {projected_decisions(r):,.0f} with"
            f" the measured busiest share {new.hottest:.2f}")
    biggest = max(results, key=lambda r: (r.name == "cluster", r.masters))
    e = biggest.exchanges
    slow = ", ".join(f"{rate} pages/s each: {FLEET * rate:,} x {e.redis_us:.0f} us ="
                     f" {FLEET * rate * e.redis_us / 1e6:,.1f} cores"
                     for rate in WORKER_RATES[:2])
    emit(f"  Redis cores for {FLEET:,} I/O-bound workers, one exchange a page"
        f" ({biggest.label} of {biggest.masters}, synthetic pages): {slow}")
    largest = max((r for r in results if r.crawls), key=lambda r: r.masters, default=None)
    if largest is not None:
        us = largest.pooled_page_us() or 0.0
        rate = WORKER_RATES[-1]
        emit(f"  Redis cores for {FLEET:,} workers at {rate} pages/s each, batched as in the"
            f" crawls above ({largest.label} of {largest.masters}, {us:.0f} us/page):"
            f" {FLEET * rate:,} x {us:.0f} us = {FLEET * rate * us / 1e6:,.1f} cores")
        if extras is not None:
            calls = largest.per_page(lambda c: c.stats_calls) or 0.0
            for rate in WORKER_RATES:
                if largest.masters:
                    # on a cluster a worker sends its counts at most once a second
                    load = FLEET * min(rate, 1.0 / CLUSTER_STATS_INTERVAL)
                    bound = "at most one call a second per worker"
                else:
                    load = FLEET * rate  # at most one stats call per page
                    bound = "at most one call a page"
                emit(f"  stats slot, {FLEET:,} workers x {rate} pages/s, {bound}"
                    f" (measured here: {calls:.2f} a page): {load:,.0f} calls/s ="
                    f" {load * extras.stats.us_alone / 1e6:.2f} core if each comes alone,"
                    f" {load * extras.stats.us_pipelined / 1e6:.2f} if pipelined")


def plan_pages_json(e: Exchanges) -> dict[str, Any]:
    """The plan's pages (:func:`plan_pages`) in the JSON output, grown or sized."""
    return {"redis_us_per_exchange": e.redis_us, "scripts_per_exchange": e.calls("evalsha"),
            "queued": e.queued, "exchanges": e.exchanges, "new_links": PLAN_NEW_LINKS,
            "new_depth": e.new_depth, "seen_depth": e.seen_depth}


def as_json(plan: Plan, results: list[TargetResult], extras: Extras | None,
            env: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"plan": asdict(plan), "environment": env, "targets": []}
    for r in results:
        out["targets"].append({
            "target": r.name,
            "masters": r.masters,
            "partitions": r.partitions,
            "idle_cpu_per_s": r.idle_cpu_per_s,
            "failures": r.failures,
            "decisions": [{**asdict(p), "decisions_per_second": p.rate,
                           "redis_us_per_decision": p.redis_us,
                           "client_us_per_decision": p.client_us, "hottest_share": p.hottest}
                          for p in r.decisions.passes],
            "filter_bits_per_item": r.decisions.filter_bits_per_item,
            "exchanges": {**{k: v for k, v in asdict(r.exchanges).items() if k != "commands"},
                          "reap_us_per_partition": r.exchanges.reap_us,
                          "redis_us_per_exchange": r.exchanges.redis_us,
                          "commands_per_exchange": r.exchanges.calls(),
                          "scripts_per_exchange": r.exchanges.calls("evalsha"),
                          "getkeys_per_exchange": r.exchanges.calls(GETKEYS),
                          "ms_per_exchange": r.exchanges.per_exchange(r.exchanges.seconds) * 1e3,
                          "hottest_share": r.exchanges.hottest},
            "host_exchanges": {"redis_us_per_exchange": r.host_exchanges.redis_us,
                               "scripts_per_exchange": r.host_exchanges.calls("evalsha"),
                               "queued": r.host_exchanges.queued,
                               "exchanges": r.host_exchanges.exchanges},
            "plan_exchanges": plan_pages_json(r.plan_exchanges),
            "plan_sized_exchanges": {**plan_pages_json(r.plan_sized_exchanges),
                                     "turns_redis_us": r.sized_turns_us},
            "projected_decisions_per_second": projected_decisions(r),
            "projected_pages_per_second": projected_pages(r),
            "crawls": [{
                "workers": c.run.workers,
                "pages": c.pages,
                "span_s": c.run.span_s,
                "pages_per_second": c.run.pages_per_second,
                "redis_us_per_page": c.redis_us,
                "raw_redis_us_per_page": c.raw_us,
                "steady_main_thread_us_per_page": None
                if c.run.steady_redis_cpu_per_page_s is None
                else c.run.steady_redis_cpu_per_page_s * 1e6,
                "commands_per_page": c.run.per_page(c.run.command_count),
                "round_trips_per_page": c.run.per_page(c.run.round_trips),
                "stats_calls_per_page": c.run.per_page(c.stats_calls),
                "hottest_share": hottest_share(c.per_master_cpu_s),
                "missing": c.run.missing,
                "duplicates": c.run.duplicates,
                "commands": {k: {"calls": v[0], "usec": v[1]}
                             for k, v in c.run.commands.items()},
            } for c in r.crawls],
        })
    if extras is not None:
        out["stats_slot"] = asdict(extras.stats)
        out["script_call"] = {**asdict(extras.calls), "fixed_us": extras.calls.fixed_us,
                              "per_fingerprint_us": extras.calls.per_fingerprint_us,
                              "per_seen_fingerprint_us": extras.calls.per_seen_fingerprint_us}
        out["queue_memory"] = asdict(extras.queue)
        out["exporter"] = [asdict(e) for e in extras.exporter]
        out["exchange_floor"] = asdict(extras.floor)
        out["slice_cost"] = {**asdict(extras.depth), "per_slice_us": extras.depth.per_slice_us,
                             "plan_depth": design_depth(ESTIMATE_PARTITIONS),
                             "plan_depth_sized": design_depth(ESTIMATE_PARTITIONS,
                                                              ESTIMATE_URLS),
                             "plan_seen_depth": design_seen_depth(ESTIMATE_PARTITIONS)}
        out["estimate"] = estimate_lines(results, extras, plan)
    return out


# --- main -------------------------------------------------------------------------


def parse_counts(parser: argparse.ArgumentParser, name: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        parser.error("%s: comma-separated numbers, got %r" % (name, text))
    if not values or min(values) < 1:
        parser.error("%s: numbers >= 1, got %r" % (name, text))
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, one worker, crawls on one Redis and the largest"
                        " cluster only: checks that the benchmark works, not a measurement")
    parser.add_argument("--masters", help="cluster sizes (default %s)"
                        % ",".join(map(str, FULL.masters)))
    parser.add_argument("--workers", help="crawl worker counts (default %s; --quick %s)"
                        % (",".join(map(str, FULL.workers)), ",".join(map(str, QUICK.workers))))
    parser.add_argument("--pages", type=int, help="demo site pages (default %d)" % FULL.pages)
    parser.add_argument("--clients", type=int, help="decision client processes (default %d)"
                        % FULL.clients)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)

    plan = QUICK if args.quick else FULL
    changes: dict[str, Any] = {}
    if args.masters:
        changes["masters"] = parse_counts(parser, "--masters", args.masters)
    if args.workers:
        changes["workers"] = parse_counts(parser, "--workers", args.workers)
    if args.pages:
        changes["pages"] = args.pages
    if args.clients:
        changes["clients"] = args.clients
    if changes:
        plan = Plan(**{**asdict(plan), **changes})

    started = time.monotonic()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "cpus": os.cpu_count() or 0,
        "load_start": " ".join("%.2f" % x for x in os.getloadavg()),
    }
    results: list[TargetResult] = []
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-bench-scale-") as tmp, \
            SiteProcess(plan.pages) as site:
        workdir = Path(tmp)
        targets = (0, *plan.masters)
        for masters in targets:
            crawl = plan.crawl_everywhere or masters in (targets[0], targets[-1])
            results.append(run_target(masters, plan, site, workdir, crawl))
        say_progress("stats slot, queue memory, exporter ...")
        extras = measure_extras(plan)
        env["redis"] = extras.redis_version
    env["load_end"] = " ".join("%.2f" % x for x in os.getloadavg())
    report(plan, args, results, extras, time.monotonic() - started, env)
    if args.json:
        args.json.write_text(json.dumps(as_json(plan, results, extras, env), indent=2) + "\n")
    failures = [f for r in results for f in r.failures]
    if failures:
        emit()
        emit("FAILED runs: %d (details on stderr)" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
