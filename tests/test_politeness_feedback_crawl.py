"""What workers learn of a host holds every worker back, measured at the website.

Three real ``scrapy crawl site`` workers share one redis-server and crawl the
hosts site (:mod:`bloomcrawl.ops.hosts_site`), which records when each
request arrived. Each test tries to break one promise of the shared
per-host budget (:mod:`bloomcrawl.core.politeness`):

* a 429 with ``Retry-After`` (seconds, or an HTTP date) holds its host for
  that long for every worker, while the request is retried; other hosts go
  on, and every page is fetched once;
* robots.txt's ``Crawl-delay`` (ROBOTSTXT_OBEY) raises the host's delay for
  every worker above DOWNLOAD_DELAY, and its ``Disallow`` still holds;
* ``bloomcrawl throttle HOST --delay S`` (the real command, run in-process
  beside the workers) slows a running crawl of the host for every worker,
  ``--clear`` speeds it up again, and the command refuses a spider with no
  crawl;
* a host held back by a 429 stays held when an operator changes its budget;
* AutoThrottle adapts the host's delay in Redis to the latency every worker
  sees, and the site sees one polite crawler, not three; a new host starts
  from AUTOTHROTTLE_START_DELAY, as in Scrapy.

The workers start as in ``tests/test_politeness_crawl.py``: each with its
own User-Agent (which tells the site who fetched what), all up before the
seeds are pushed, RANDOMIZE_DOWNLOAD_DELAY off.
"""

from __future__ import annotations

import email.utils
import itertools
import math
import statistics
import time
from collections.abc import Awaitable, Callable

import pytest
import redis
from aiohttp import web

from bloomcrawl.core.politeness import DomainState, host_states, recorded_politeness
from bloomcrawl.ops.cli.throttle import spider_frontier
from bloomcrawl.ops.hosts_site import (
    THROTTLED,
    Arrival,
    HostSpec,
    HostsServer,
    RunningHostsSite,
    by_host,
    crawl_settings,
    max_outstanding,
    pages_only,
    peak_rates,
    per_agent,
)

from kit.cli import run_cli
from kit.politeness import (
    POLITE_CRAWL_TIMEOUT_S,
    assert_pages_once,
    closest,
    start_polite_workers,
)
from kit.redis import ClosingRedis, RedisServer
from kit.wait import wait_until
from kit.workers import WorkerPool, check_exits, run_workers

HOST = "h0.localhost"
OTHER = "h1.localhost"
#: DOWNLOAD_DELAY of every test: the budget the feedback must override
BASE_DELAY = 0.1
#: Retry-After of the throttling host, seconds
RETRY_AFTER = 2
CRAWL_DELAY = 0.6
THROTTLE_DELAY = 0.8
LATENCY = 0.3
#: a request leased just before a change may still go out up to this long after it
#: (the command returned; the worker's reactor is shared by 3 processes on 2 cores)
LEASED_BEFORE_S = 0.25
FANOUT = 10
GAP_FACTOR = 0.9
#: the median gap at the base delay is under this: half the throttled gap, with room
#: for each page's turn-around on a loaded machine
FAST_GAP_S = THROTTLE_DELAY / 2
#: the closest two requests of one delay may come at the site, one slow to get there
SENT_LATE_FACTOR = 0.6


def crawl(pool: WorkerPool, redis_url: str, site: RunningHostsSite, settings: dict[str, str],
          seeds: list[str], done: Callable[[], bool],
          during: Callable[[], None] | None = None) -> list[Arrival]:
    """Three workers crawl ``seeds`` until ``done()`` and exit; ``during`` runs meanwhile.

    Returns every arrival at the site; the workers' exits are checked.
    """
    client = ClosingRedis.from_url(redis_url)
    try:
        workers = start_polite_workers(pool, redis_url, settings)
        client.rpush("site:start_urls", *seeds)
        if during is not None:
            during()
        wait_until(done, POLITE_CRAWL_TIMEOUT_S,
                   what=lambda: (site.stats(), per_agent(site.arrivals())))
        run_workers(workers, POLITE_CRAWL_TIMEOUT_S)
    finally:
        client.close()
    check_exits(workers)
    return site.arrivals()


def all_fetched(site: RunningHostsSite, skip: frozenset[tuple[str, str]] = frozenset()
                ) -> Callable[[], bool]:
    """Every page of every host (but ``skip``) was served."""
    want = sum(spec.pages for spec in site.specs.values()) - len(skip)
    return lambda: site.stats()["distinct"] == want


def gaps_between(records: list[Arrival], start: float, end: float = math.inf) -> list[float]:
    """Gaps between consecutive ``records`` (by arrival) whose first came at or after
    ``start`` and whose second came before ``end``."""
    ordered = sorted(records, key=lambda a: a.start)
    return [b.start - a.start for a, b in itertools.pairwise(ordered)
            if a.start >= start and b.start < end]


def host_state(client: redis.Redis, host: str = HOST) -> DomainState:
    """The host's budget as the frontier keeps it now (what ``bloomcrawl throttle`` reads)."""
    frontier, _ = spider_frontier(client, "site")
    [state] = host_states(client, frontier, recorded_politeness(client, frontier), [host])
    return state


class DatedRetryAfter(HostsServer):
    """The hosts site, with each 429's ``Retry-After: N`` sent as an HTTP date instead.

    The date is a whole second (HTTP dates have no fraction), ``N`` to ``N + 1``
    seconds after the answer.
    """

    def make_app(self) -> web.Application:
        @web.middleware
        async def as_date(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                          ) -> web.StreamResponse:
            response = await handler(request)
            seconds = response.headers.get("Retry-After")
            if seconds is not None:
                when = math.floor(time.time()) + int(seconds) + 1
                response.headers["Retry-After"] = email.utils.formatdate(when, usegmt=True)
            return response

        app = super().make_app()
        app.middlewares.append(as_date)
        return app


# --- 429 with Retry-After ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_429_holds_its_host_for_retry_after_for_every_worker(
        redis_server: RedisServer, redis_client: redis.Redis, worker_pool: WorkerPool,
        form: str) -> None:
    """The host's first two requests get 429 Retry-After: 2 (``form``: as seconds, or
    as an HTTP date 2 to 3 s ahead); each is retried.

    Several of the host's pages are queued from the start and three workers
    wait for them: after each 429, none may go to the host for 2 s. The other
    host is crawled meanwhile.
    """
    throttled_first, seeded = 2, 5
    specs = [HostSpec(HOST, pages=12, fanout=FANOUT, throttle_first=throttled_first,
                      retry_after=RETRY_AFTER),
             HostSpec(OTHER, pages=40, fanout=FANOUT)]
    site = RunningHostsSite(specs)
    if form == "http-date":
        site.server = DatedRetryAfter(specs)
    settings = {**crawl_settings(BASE_DELAY), "RETRY_ENABLED": "True",
                "RETRY_TIMES": str(throttled_first + 1)}
    with site.start():
        seeds = [site.url(HOST, path) for path in specs[0].page_paths()[:seeded]]
        arrivals = crawl(worker_pool, redis_server.url, site, settings,
                         [*seeds, site.url(OTHER)], all_fetched(site))
    assert_pages_once(site, arrivals, also=("robots", THROTTLED))
    records = by_host(arrivals)[HOST]
    throttled = [a for a in records if a.kind == THROTTLED]
    assert len(throttled) == throttled_first, records
    held = []
    for answer in throttled:
        assert answer.end is not None
        after = [a for a in records if a.start > answer.start]
        assert after, records
        held.append(round(after[0].start - answer.end, 3))
    # after each 429's answer, the host's next request came Retry-After later (or more)
    assert min(held) >= GAP_FACTOR * RETRY_AFTER, (
        held, [(round(a.start - records[0].start, 3), a.agent[-2:], a.path, a.status)
               for a in records[:8]])
    # the hold is the host's alone: the other host was crawled during it
    first = throttled[0]
    assert first.end is not None
    during = [a for a in by_host(arrivals)[OTHER] if first.end < a.start < first.end + held[0]]
    assert len(during) >= 3, (len(during), held)


# --- robots.txt Crawl-delay -------------------------------------------------------------


@pytest.mark.slow
def test_robots_crawl_delay_raises_the_delay_of_every_worker(
        redis_server: RedisServer, redis_client: redis.Redis, worker_pool: WorkerPool) -> None:
    pages, disallowed = 14, "/p/7"
    specs = [HostSpec(HOST, pages=pages, fanout=FANOUT, robots=True, crawl_delay=CRAWL_DELAY,
                      disallow=(disallowed,))]
    settings = {**crawl_settings(BASE_DELAY), "ROBOTSTXT_OBEY": "True"}
    skip = frozenset({(HOST, disallowed)})
    with RunningHostsSite(specs).start() as site:
        arrivals = crawl(worker_pool, redis_server.url, site, settings, [site.url(HOST)],
                         all_fetched(site, skip))
        state = host_state(redis_client)
    assert_pages_once(site, arrivals, skip, also=("robots", THROTTLED))
    assert disallowed not in {a.path for a in arrivals}
    robots = [a for a in arrivals if a.kind == "robots"]
    # one robots.txt per worker at most (each worker's RobotsTxtMiddleware asks once)
    assert 1 <= len(robots) <= 3, robots
    learned = min(a.end for a in robots if a.end is not None)
    served = pages_only(arrivals)
    gaps = gaps_between(served, learned)
    assert len(gaps) == len(served) - 1  # every page came after a robots.txt was read
    # whoever fetched them: a worker that leased the host is told when it is ready next
    # and may hold a one-host crawl while the others wait (as under AutoThrottle above)
    assert min(gaps) >= GAP_FACTOR * CRAWL_DELAY, (
        round(min(gaps), 4), closest(served, HOST), per_agent(served))
    # the Crawl-delay is the host's, in Redis, which every worker leases by
    assert state.delay == pytest.approx(CRAWL_DELAY)


# --- bloomcrawl throttle, live ----------------------------------------------------------


@pytest.mark.slow
def test_throttle_command_changes_a_running_crawl_for_every_worker(
        redis_server: RedisServer, redis_client: redis.Redis, worker_pool: WorkerPool,
        cli_env: dict[str, str]) -> None:
    pages = 60
    url = redis_server.url
    # no crawl of the spider yet: a clear refusal, and nothing written
    refused = run_cli("throttle", HOST, "--delay", str(THROTTLE_DELAY), "--redis-url", url,
                      env=cli_env)
    assert refused.code == 1, (refused.stdout, refused.stderr)
    assert refused.stderr.startswith("bloomcrawl throttle: no crawl of site in this Redis yet"), \
        refused.stderr
    assert refused.stdout == "" and redis_client.dbsize() == 0
    marks: dict[str, float] = {}
    outputs: dict[str, str] = {}

    def change_it_live() -> None:
        wait_until(lambda: len(pages_only(site.arrivals())) >= 8, POLITE_CRAWL_TIMEOUT_S,
                   what=site.stats)
        marks["slowing"] = time.monotonic()
        slowed = run_cli("throttle", HOST, "--delay", str(THROTTLE_DELAY), "--redis-url", url,
                         env=cli_env)
        marks["slowed"] = time.monotonic()
        assert slowed.code == 0, (slowed.stdout, slowed.stderr)
        outputs["slowed"] = slowed.stdout
        # five of the slow gaps, fetched by more than one worker (whichever acked last
        # often asks first), while the crawl has plenty left
        def slow_enough() -> bool:
            slow = [a for a in site.arrivals() if a.start >= marks["slowed"] + LEASED_BEFORE_S]
            return len(slow) >= 6 and len({a.agent for a in slow}) >= 2

        wait_until(slow_enough, POLITE_CRAWL_TIMEOUT_S,
                   what=lambda: (site.stats(), per_agent(site.arrivals())))
        marks["clearing"] = time.monotonic()
        cleared = run_cli("throttle", HOST, "--clear", "--redis-url", url, env=cli_env)
        marks["cleared"] = time.monotonic()
        assert cleared.code == 0, (cleared.stdout, cleared.stderr)
        outputs["cleared"] = cleared.stdout

    with RunningHostsSite([HostSpec(HOST, pages=pages, fanout=FANOUT)]).start() as site:
        arrivals = crawl(worker_pool, url, site, crawl_settings(BASE_DELAY), [site.url(HOST)],
                         all_fetched(site), during=change_it_live)
    assert_pages_once(site, arrivals, also=("robots", THROTTLED))
    assert outputs["slowed"].splitlines()[0] == (
        "set %s for site (every worker, from its next lease)" % HOST)
    assert outputs["slowed"].splitlines()[1].startswith(
        "%s: delay %g s, concurrency 1;" % (HOST, THROTTLE_DELAY)), outputs["slowed"]
    assert outputs["cleared"].splitlines()[0] == (
        "cleared the override of %s for site (every worker, from its next lease)" % HOST)
    assert outputs["cleared"].splitlines()[1].startswith(
        "%s: delay %g s, concurrency 1;" % (HOST, BASE_DELAY)), outputs["cleared"]
    before = gaps_between(arrivals, 0.0, marks["slowing"])
    slow = gaps_between(arrivals, marks["slowed"] + LEASED_BEFORE_S, marks["clearing"])
    fast = gaps_between(arrivals, marks["cleared"] + LEASED_BEFORE_S)
    assert len(before) >= 3 and len(slow) >= 4 and len(fast) >= 5, (before, slow, fast)
    assert statistics.median(before) < FAST_GAP_S, before
    assert min(slow) >= GAP_FACTOR * THROTTLE_DELAY, (
        [round(g, 3) for g in slow], per_agent(arrivals))
    # cleared: the defaults again (never below DOWNLOAD_DELAY)
    assert statistics.median(fast) < FAST_GAP_S, [round(g, 3) for g in fast]
    assert min(fast) >= GAP_FACTOR * BASE_DELAY, [round(g, 3) for g in fast]
    slow_agents = {a.agent for a in arrivals
                   if marks["slowed"] + LEASED_BEFORE_S <= a.start < marks["clearing"]}
    assert len(slow_agents) >= 2, slow_agents  # the slow budget held across workers


@pytest.mark.slow
def test_a_throttle_during_a_429_hold_keeps_the_hold(
        redis_server: RedisServer, redis_client: redis.Redis, worker_pool: WorkerPool,
        cli_env: dict[str, str]) -> None:
    """The host is held 5 s after a 429 (no retry: the page is given up); an operator
    sets a shorter delay meanwhile. The back-off ends when Retry-After says, not earlier.
    """
    hold, pages = 5, 8
    spec = HostSpec(HOST, pages=pages, throttle_first=1, retry_after=hold)
    settings = {**crawl_settings(BASE_DELAY), "RETRY_ENABLED": "False"}
    marks: dict[str, float] = {}

    def throttle_during_the_hold() -> None:
        wait_until(lambda: any(a.kind == THROTTLED and a.end is not None
                               for a in site.arrivals()), POLITE_CRAWL_TIMEOUT_S,
                   interval=0.02, what=site.stats)
        # well inside the hold, once the worker has reported the 429 and finished its lease
        [answer] = [a for a in site.arrivals() if a.kind == THROTTLED]
        assert answer.end is not None
        time.sleep(max(0.0, answer.end + 1.0 - time.monotonic()))
        done = run_cli("throttle", HOST, "--delay", "0.5", "--redis-url", redis_server.url,
                       env=cli_env)
        marks["throttled"] = time.monotonic()
        assert done.code == 0, (done.stdout, done.stderr)

    with RunningHostsSite([spec]).start() as site:
        seeds = [site.url(HOST, path) for path in spec.page_paths()]
        # the 429'd page is not retried: every other page once
        arrivals = crawl(worker_pool, redis_server.url, site, settings, seeds,
                         lambda: site.stats()["distinct"] == pages - 1,
                         during=throttle_during_the_hold)
    [answer] = [a for a in arrivals if a.kind == THROTTLED]
    assert answer.end is not None
    assert_pages_once(site, arrivals, frozenset({(HOST, answer.path)}), also=("robots", THROTTLED))
    after = [a for a in arrivals if a.start > answer.start]
    assert marks["throttled"] < answer.end + hold - 1.0  # the command ran during the hold
    waited = after[0].start - answer.end
    assert waited >= GAP_FACTOR * hold, (
        round(waited, 3), round(marks["throttled"] - answer.end, 3),
        [(round(a.start - answer.end, 3), a.agent[-2:], a.path) for a in after[:4]])
    # and after it, the operator's delay
    assert min(gaps_between(after, after[0].start)) >= GAP_FACTOR * 0.5, closest(after, HOST)


# --- AutoThrottle ------------------------------------------------------------------------


@pytest.mark.slow
def test_autothrottle_adapts_the_shared_delay_to_the_latency(
        redis_server: RedisServer, redis_client: redis.Redis, worker_pool: WorkerPool) -> None:
    """A host answering in 0.3 s, CONCURRENT_REQUESTS_PER_DOMAIN 8, DOWNLOAD_DELAY 0:
    AutoThrottle (target concurrency 1) must bring the host's delay to about its
    latency, for the three workers together."""
    pages = 30
    settings = {**crawl_settings(0.0, per_domain=8), "AUTOTHROTTLE_ENABLED": "True",
                "AUTOTHROTTLE_START_DELAY": "0.05", "AUTOTHROTTLE_MAX_DELAY": "5",
                "AUTOTHROTTLE_TARGET_CONCURRENCY": "1"}
    delays: list[float] = []

    def sample_delays() -> None:
        def sampled() -> bool:
            if pages_only(site.arrivals()):
                delays.append(host_state(redis_client).delay)
            return bool(site.stats()["distinct"] >= pages - 3)

        wait_until(sampled, POLITE_CRAWL_TIMEOUT_S, interval=0.25, what=site.stats)

    with RunningHostsSite([HostSpec(HOST, pages=pages, fanout=FANOUT,
                                    latency=LATENCY)]).start() as site:
        arrivals = crawl(worker_pool, redis_server.url, site, settings, [site.url(HOST)],
                         all_fetched(site), during=sample_delays)
        final = host_state(redis_client).delay
    assert_pages_once(site, arrivals, also=("robots", THROTTLED))
    latencies = [a.end - a.start for a in arrivals if a.end is not None]
    # once the first answer came back, the delay is about the latency (Scrapy's algorithm
    # aims at latency / target concurrency)
    settled = delays[4:]
    assert len(settled) >= 5, delays
    # a worker measures a latency on its reactor, so a busy machine makes one sample
    # late, and Scrapy's algorithm (as the frontier's) jumps to a higher aim at once:
    # the median holds the delay to the latency, every sample only to a few of it
    assert 0.5 * LATENCY <= statistics.median(settled) <= 2 * LATENCY, (
        delays, final, statistics.median(latencies))
    assert all(0.5 * LATENCY <= d <= 4 * LATENCY for d in [*settled, final]), (
        delays, final, statistics.median(latencies))
    served = sorted(pages_only(arrivals), key=lambda a: a.start)
    gaps = gaps_between(served, served[0].start)
    # one polite crawler at that delay, not three: the delay is never below a latency
    # (the site answers in LATENCY at the least), so neither is a gap but by the
    # jitter of a request's way to the site (three workers each at the delay would
    # make gaps of a third of it), nor is the pace ever three workers'
    assert min(gaps) >= SENT_LATE_FACTOR * LATENCY, (
        round(min(gaps), 4), closest(served, HOST), delays)
    assert peak_rates(served, 5)[HOST] <= 1 / (GAP_FACTOR * LATENCY), (
        peak_rates(served, 5), closest(served, HOST))
    # one at a time but when an answer is late (the site runs in the test's process)
    assert max_outstanding(served)[HOST] <= 3
    # and not slower than it needs: about one request per delay. Which workers fetch
    # is not this test's business: the worker that leased a host is told when it is
    # ready next and asks then, so one worker may hold a one-host crawl while the
    # others wait; the delay each one leases by is the one in Redis, sampled above
    assert statistics.median(gaps) <= 1.5 * max(settled), (
        statistics.median(gaps), settled, per_agent(served))


@pytest.mark.slow
def test_autothrottle_starts_every_worker_from_the_start_delay(
        redis_server: RedisServer, redis_client: redis.Redis, worker_pool: WorkerPool) -> None:
    """AUTOTHROTTLE_START_DELAY is the host's delay until a latency was seen (Scrapy's
    "initial download delay"): six pages of a new host queued at once, DOWNLOAD_DELAY 0
    and CONCURRENT_REQUESTS_PER_DOMAIN 8 must not go out together.

    Scrapy's algorithm, after the first answer (0.3 s), sets the delay to
    max(latency, (start + latency) / 2) = 0.65 s: no second request comes sooner.
    """
    start, seeded = 1.0, 6
    settings = {**crawl_settings(0.0, per_domain=8), "AUTOTHROTTLE_ENABLED": "True",
                "AUTOTHROTTLE_START_DELAY": str(start), "AUTOTHROTTLE_MAX_DELAY": "5",
                "AUTOTHROTTLE_TARGET_CONCURRENCY": "1"}
    spec = HostSpec(HOST, pages=seeded, fanout=FANOUT, latency=LATENCY)
    with RunningHostsSite([spec]).start() as site:
        seeds = [site.url(HOST, path) for path in spec.page_paths()]
        arrivals = crawl(worker_pool, redis_server.url, site, settings, seeds, all_fetched(site))
    assert_pages_once(site, arrivals, also=("robots", THROTTLED))
    served = sorted(pages_only(arrivals), key=lambda a: a.start)
    first_gap = served[1].start - served[0].start
    soonest = max(LATENCY, (start + LATENCY) / 2)
    assert first_gap >= GAP_FACTOR * soonest, (
        round(first_gap, 3), max_outstanding(served),
        [(round(a.start - served[0].start, 3), a.agent[-2:], a.path) for a in served])
