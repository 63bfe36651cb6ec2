"""Cluster-wide per-domain politeness (issue 11), measured at the website, with real workers.

Three ``scrapy crawl site`` processes share one real redis-server and crawl
the hosts site (:mod:`bloomcrawl.ops.hosts_site`: many hosts on one
127.0.0.1 port, ``h<i>.localhost`` reached through
:class:`bloomcrawl.crawl.resolver.LocalhostResolver`), which records every
request's arrival. DOWNLOAD_DELAY, CONCURRENT_REQUESTS_PER_DOMAIN and
RANDOMIZE_DOWNLOAD_DELAY are Scrapy's own settings; the frontier applies
them to the whole cluster, so what the site sees from three workers must be
what one polite crawler would send:

* one domain: never two requests closer than GAP_FACTOR x the delay, their
  median gap at most PACE_FACTOR x the delay, every page once;
* 50 domains: no domain over its budget, and the cluster's throughput at
  least THROUGHPUT_FACTOR x the sum of the domains' budgets (each domain's
  ideal time being its pages x its delay);
* a worker SIGKILLed while it holds a domain's only slot: another worker
  fetches from the domain again within SCHEDULER_LEASE_TIMEOUT plus a
  margin, and the crawl completes.

The workers are up (``Spider opened`` in each log) before the seeds are
pushed, so all three compete from the first request on. Each worker sends
its own User-Agent, which tells the site who fetched what.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import pytest
import redis

from bloomcrawl.ops.cluster.processes import free_port, spawn
from bloomcrawl.ops.hosts_site import (
    Arrival,
    HostSpec,
    HostsSiteClient,
    RunningHostsSite,
    crawl_settings,
    fetch_counts,
    host_names,
    max_outstanding,
    min_gaps,
    pages_only,
    peak_rates,
    per_agent,
    rates,
    span,
    summarize,
)

from kit import CRAWLER
from kit.politeness import (
    POLITE_CRAWL_TIMEOUT_S,
    POLITE_WORKERS,
    ClockCheck,
    assert_pages_once,
    closest,
    polite_agent,
    start_polite_workers,
)
from kit.redis import RedisServer
from kit.wait import wait_until
from kit.web import fetch
from kit.workers import WorkerPool, check_exits, run_workers

#: each page links to this many new ones: every worker could have work of the domain at once
FANOUT = 10
GAP_FACTOR = 0.9
#: Scrapy's own slot delay (not the cluster's): the closest two of its requests may
#: come at the site, one of them slow to get there
SENT_LATE_FACTOR = 0.5
#: bounds on the crawl's pace that catch a budget applied twice (2x the median gap) or
#: hosts holding each other back (one host at a time: 0.02 of the throughput), with
#: room for a loaded machine (four test processes beside the three workers on two
#: CPUs): how close to ideal the pace is is bench/politeness.py's to measure
PACE_FACTOR = 1.6
THROUGHPUT_FACTOR = 0.25








def seed(client: redis.Redis, site: RunningHostsSite, hosts: list[str]) -> None:
    client.rpush("site:start_urls", *[site.url(host) for host in hosts])


# --- the measuring equipment -----------------------------------------------------------


def arrival(host: str, start: float, end: float | None, path: str = "/", who: str = "w0",
            kind: str = "page") -> Arrival:
    return Arrival(host, path, start, end, 200 if end is not None else 0, who, kind)


def test_measures_of_arrivals() -> None:
    records = [
        arrival("a", 10.0, 10.1, "/"), arrival("a", 10.2, 10.5, "/p/1", "w1"),
        arrival("a", 10.5, 10.6, "/p/2"),  # starts as /p/1's answer is ready: no overlap
        arrival("a", 10.55, None, "/p/2", "w1"),  # still outstanding
        arrival("b", 11.0, 11.1), arrival("c", 9.0, 9.5, "/robots.txt", kind="robots"),
    ]
    assert min_gaps(records) == pytest.approx({"a": 0.05})
    assert max_outstanding(records) == {"a": 2, "b": 1, "c": 1}
    assert rates(records) == pytest.approx({"a": 3 / 0.55})
    # the two shortest consecutive gaps of "a": 10.5 -> 10.55 after 10.2 -> 10.5
    assert peak_rates(records, 2) == pytest.approx({"a": 2 / 0.35})
    assert peak_rates(records, 10) == pytest.approx({"a": 3 / 0.55})  # fewer: the mean rate
    paced = [arrival("d", 5 + 0.25 * i, 5 + 0.25 * i) for i in range(40)]
    assert peak_rates(paced, 10) == pytest.approx({"d": 4.0})  # 1 / 0.25
    assert span(records) == pytest.approx(2.0)
    assert fetch_counts(pages_only(records))[("a", "/p/2")] == 2
    assert per_agent(records) == {"w0": 4, "w1": 2}
    summary = summarize(records)["a"]
    assert (summary.requests, summary.max_outstanding) == (4, 2)
    assert summary.span == pytest.approx(0.55)
    assert summary.min_gap == pytest.approx(0.05)
    assert summarize(records)["b"].rate is None


def fetch_host(site: RunningHostsSite, host: str, path: str,
               who: str = "probe") -> tuple[int, str, dict[str, str]]:
    """GET ``path`` of ``host`` on the hosts site, as the user agent ``who``."""
    status, body, headers = fetch("http://127.0.0.1:%d%s" % (site.port, path),
                                  host="%s:%d" % (host, site.port), headers={"User-Agent": who})
    return status, body.decode(), headers


def test_hosts_site_serves_each_host_its_pages_and_behaviour() -> None:
    specs = [HostSpec("h0.localhost", pages=7, fanout=3, robots=True, crawl_delay=1.5,
                      disallow=("/p/6",)),
             HostSpec("h1.localhost", pages=2, throttle_first=2, retry_after=4),
             HostSpec("slow.localhost", pages=1, latency=0.3)]
    with RunningHostsSite(specs).start() as site:
        status, body, _ = fetch_host(site, "H0.localhost", "/", "w0")
        assert status == 200 and "<title>h0.localhost page 0</title>" in body
        assert re.findall(r'href="([^"]+)"', body) == ["/p/1", "/p/2", "/p/3"]
        links = re.findall(r'href="([^"]+)"', fetch_host(site, "h0.localhost", "/p/1", "w1")[1])
        assert links == ["/p/4", "/p/5", "/p/6", "/", "/"]  # children, parent (/), home
        assert fetch_host(site, "h0.localhost", "/robots.txt")[1] == (
            "User-agent: *\nDisallow: /p/6\nCrawl-delay: 1.5\n")
        assert fetch_host(site, "h0.localhost", "/p/7")[0] == 404
        assert fetch_host(site, "h1.localhost", "/robots.txt")[0] == 404
        first = fetch_host(site, "h1.localhost", "/")
        second = fetch_host(site, "h1.localhost", "/p/1")
        assert (first[0], first[2]["Retry-After"], second[0]) == (429, "4", 429)
        assert fetch_host(site, "h1.localhost", "/")[0] == 200
        started = time.monotonic()
        assert fetch_host(site, "slow.localhost", "/")[0] == 200
        assert time.monotonic() - started >= 0.3
        assert fetch_host(site, "elsewhere.localhost", "/")[0] == 404
        client = HostsSiteClient(site.port)
        assert client.arrivals() == site.arrivals()  # the control endpoints are not recorded
        records = site.arrivals()
        assert [(a.host, a.path, a.status, a.kind) for a in records] == [
            ("h0.localhost", "/", 200, "page"), ("h0.localhost", "/p/1", 200, "page"),
            ("h0.localhost", "/robots.txt", 200, "robots"),
            ("h0.localhost", "/p/7", 404, "not_found"),
            ("h1.localhost", "/robots.txt", 404, "robots"),
            ("h1.localhost", "/", 429, "throttled"), ("h1.localhost", "/p/1", 429, "throttled"),
            ("h1.localhost", "/", 200, "page"), ("slow.localhost", "/", 200, "page")]
        assert [a.agent for a in records[:2]] == ["w0", "w1"]
        slow = records[-1]
        assert slow.end is not None and slow.end - slow.start >= 0.3
        assert client.arrivals(since=8) == [slow]
        stats = client.stats()
        assert stats["hosts"]["h0.localhost"] | {"distinct": 2, "missing": 5, "robots": 1,
                                                  "not_found": 1} == stats["hosts"]["h0.localhost"]
        assert stats["hosts"]["h1.localhost"]["throttled"] == 2
        assert stats["unknown_hosts"] == 1
        client.reset()
        assert site.arrivals() == [] and site.stats()["requests"] == 0


def test_hosts_site_command(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "bloomcrawl.ops.hosts_site", "--port", str(port), "--hosts",
           "3", "--pages", "4", "--crawl-delay", "2", "--spec",
           '{"h2.localhost": {"latency": 0.1, "pages": 9}}']
    log = tmp_path / "site.log"
    process = spawn("hosts site", cmd, log=log, env={**os.environ, "PYTHONPATH": str(CRAWLER)})
    try:
        client = HostsSiteClient(port)
        process.wait_ready(client.stats, 20)
        hosts = client.stats()["hosts"]
        assert {name: h["pages"] for name, h in hosts.items()} == {
            "h0.localhost": 4, "h1.localhost": 4, "h2.localhost": 9}
    finally:
        process.stop(timeout=10)
    assert process.popen.returncode == 0, log.read_text()


# --- real crawls ------------------------------------------------------------------------


@pytest.mark.slow
def test_one_domain_three_workers_keep_the_delay(redis_server: RedisServer,
                                                  redis_client: redis.Redis,
                                                  worker_pool: WorkerPool) -> None:
    delay, pages = 0.2, 40
    with RunningHostsSite([HostSpec("h0.localhost", pages=pages, fanout=FANOUT)]).start() as site:
        workers = start_polite_workers(worker_pool, redis_server.url, crawl_settings(delay))
        seed(redis_client, site, site.hosts)
        wait_until(lambda: site.stats()["distinct"] == pages, POLITE_CRAWL_TIMEOUT_S,
                   what=site.stats)
        run_workers(workers, POLITE_CRAWL_TIMEOUT_S)
        arrivals = site.arrivals()
    assert_pages_once(site, arrivals)
    gap = min_gaps(arrivals)["h0.localhost"]
    assert gap >= GAP_FACTOR * delay, (gap, closest(arrivals, "h0.localhost"),
                                       per_agent(arrivals))
    assert max_outstanding(arrivals)["h0.localhost"] == 1
    served = sorted(a.start for a in pages_only(arrivals))
    pace = statistics.median(b - a for a, b in itertools.pairwise(served))
    assert pace <= delay * PACE_FACTOR, (pace, span(arrivals), per_agent(arrivals))
    check_exits(workers)


@pytest.mark.slow
def test_a_named_download_slot_keeps_its_delay(redis_server: RedisServer,
                                               redis_client: redis.Redis,
                                               worker_pool: WorkerPool) -> None:
    """Requests of three hosts in one download slot the spider names, whose
    DOWNLOAD_SLOTS entry has a delay (the hosts have none): one worker sends them
    that delay apart, as one Scrapy process does. The cluster's budgets are per
    host; the worker used to clear the slot's delay as it does a host's, and the
    site got them all at once."""
    delay, pages = 0.3, 6
    specs = [HostSpec(name, pages=pages, fanout=FANOUT) for name in host_names(3)]
    with RunningHostsSite(specs).start() as site:
        settings = {**crawl_settings(0.0), "SPIDER_MODULES": "testspiders",
                    "TEST_DOWNLOAD_SLOT": "shop-api",
                    "DOWNLOAD_SLOTS": json.dumps({"shop-api": {"delay": delay}})}
        worker = worker_pool.start("w0", redis_server.url, settings, spider="slotted")
        redis_client.rpush("slotted:start_urls", *[site.url(host) for host in site.hosts])
        run_workers([worker], POLITE_CRAWL_TIMEOUT_S)
        arrivals = site.arrivals()
    assert_pages_once(site, arrivals)
    starts = sorted(a.start for a in pages_only(arrivals))
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Scrapy spaces the slot's requests as they leave the worker, so one request slow
    # to reach the site (a new connection, a busy machine) shortens the next gap: the
    # median holds the delay, the closest gap only rules out "all at once" (near 0)
    assert statistics.median(gaps) >= GAP_FACTOR * delay, (gaps, per_agent(arrivals))
    assert min(gaps) >= SENT_LATE_FACTOR * delay, (gaps, per_agent(arrivals))
    assert "download slot 'shop-api'" in worker.text()
    check_exits([worker])


@pytest.mark.slow
def test_fifty_domains_each_within_budget_at_full_throughput(redis_server: RedisServer,
                                                              redis_client: redis.Redis,
                                                              worker_pool: WorkerPool) -> None:
    delay, domains, pages = 0.5, 50, 10
    specs = [HostSpec(name, pages=pages, fanout=FANOUT) for name in host_names(domains)]
    with RunningHostsSite(specs).start() as site:
        workers = start_polite_workers(worker_pool, redis_server.url, crawl_settings(delay))
        clock = ClockCheck(redis_client)
        seed(redis_client, site, site.hosts)
        wait_until(lambda: site.stats()["distinct"] == domains * pages, POLITE_CRAWL_TIMEOUT_S,
                   what=site.stats)
        run_workers(workers, POLITE_CRAWL_TIMEOUT_S)
        arrivals = site.arrivals()
    assert_pages_once(site, arrivals)
    # each domain alone needs pages x delay; all of them in parallel, the same
    ideal_throughput = domains * pages / (pages * delay)
    throughput = len(arrivals) / span(arrivals)
    gaps = min_gaps(arrivals)
    over = {host: round(gap, 4) for host, gap in gaps.items() if gap < GAP_FACTOR * delay}
    assert over == {}, (over, "Redis clock drift %.4f s" % clock.drift(),
                        {host: closest(arrivals, host, 2) for host in sorted(over)},
                        "throughput / ideal %.2f" % (throughput / ideal_throughput))
    assert throughput >= THROUGHPUT_FACTOR * ideal_throughput, (
        throughput, ideal_throughput, span(arrivals), per_agent(arrivals))
    check_exits(workers)


@pytest.mark.slow
def test_killed_slot_holder_frees_the_domain_within_the_lease_timeout(
        redis_server: RedisServer, redis_client: redis.Redis, worker_pool: WorkerPool) -> None:
    delay, pages, latency = 0.2, 8, 1.0
    lease_timeout, reap_interval = 3.0, 1.0
    # after the lease expires: the next reaping, a worker's poll (backing off to 1 s) and a delay
    # and room for a reactor lagging on a loaded machine (0.6 s was seen)
    margin = reap_interval + 1.0 + delay + 2.0
    settings = {**crawl_settings(delay), "SCHEDULER_LEASE_TIMEOUT": str(lease_timeout),
                "SCHEDULER_REAP_INTERVAL": str(reap_interval)}
    host = "h0.localhost"
    with RunningHostsSite([HostSpec(host, pages=pages, latency=latency)]).start() as site:
        workers = start_polite_workers(worker_pool, redis_server.url, settings)
        seed(redis_client, site, [host])

        def mid_request() -> Arrival | None:
            """A request in its first half, after two pages were answered."""
            records = site.arrivals()
            if sum(1 for a in records if a.end is not None) < 2:
                return None
            now = time.monotonic()
            return next((a for a in records
                         if a.end is None and now - a.start < latency / 2), None)

        held = wait_until(mid_request, POLITE_CRAWL_TIMEOUT_S, interval=0.02,
                          what=site.arrivals)
        victim = workers[[polite_agent(i) for i in range(POLITE_WORKERS)].index(held.agent)]
        signalled = time.monotonic()  # kill() sends SIGKILL first, then waits for the reap
        victim.kill()
        killed_at = time.monotonic()
        assert signalled < held.start + latency  # the kill landed mid-request
        survivors = [w for w in workers if w is not victim]
        run_workers(survivors, POLITE_CRAWL_TIMEOUT_S)
        arrivals = site.arrivals()
    served = pages_only(arrivals)
    counts = fetch_counts(served)
    assert {path for _, path in counts} == set(site.specs[host].page_paths())  # completed
    # what the victim held when it died was fetched again; nothing else twice
    victim_outstanding = {a.path for a in arrivals
                          if a.agent == held.agent and a.start <= killed_at
                          and (a.end is None or a.end > killed_at)}
    assert held.path in victim_outstanding
    twice = {path for (_, path), n in counts.items() if n > 1}
    assert twice <= victim_outstanding, (twice, victim_outstanding)
    after = [a for a in arrivals if a.start > killed_at]
    assert after, arrivals
    assert all(a.agent != held.agent for a in after)
    waited = after[0].start - killed_at
    assert waited <= lease_timeout + margin, (waited, lease_timeout, margin)
    check_exits(survivors)
