"""The faults of issue 9, each a :class:`Scenario` that runs one crawl and injects it.

Shared by the tests (``tests/faults/test_*.py``, bloomcrawl only) and by
``bench/faults.py`` (bloomcrawl and plain scrapy-redis, same site, same
fault). A scenario says how to set up Redis and the workers, when and how
to inject its fault, and records what it saw (``Outcome.facts``); the
checks live in the tests.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from faults.harness import BLOOMCRAWL, Contender, FaultRun, Outcome, Site, ThreadSite

from kit.checks import stop_lease_holder
from kit.redis import RedisServer
from kit.wait import WaitTimeout, wait_until
from kit.workers import Worker

SPIDER = "site"
#: seconds Redis (or a worker) stays stopped, the OOM lasts, the replica switch waits
PAUSE_S = 5.0
STALL_S = 10.0
#: the socket timeout the workers get where a scenario must outlast it
SHORT_SOCKET_TIMEOUT_S = 2
#: replies dropped after Redis applied the command
DROPS = 2
#: the items list's length polled (every 50 ms) this many times unchanged: none come
ITEMS_QUIET_POLLS = 10


def lease_packet_marker() -> bytes:
    """Bytes found only in a worker's packets that take requests from the queue.

    The SHA of bloomcrawl's lease script as the installed package computes it
    (its EVALSHA carries it), or any EVALSHA when that script is gone.
    """
    try:
        from bloomcrawl.core.scripts import Script

        return Script("polite_common.lua", "frontier_lease.lua").sha.encode()
    except (ImportError, OSError, AttributeError):
        return b"EVALSHA"


@dataclass(frozen=True)
class Scenario:
    """One fault; :meth:`run` is one crawl under it."""

    key: str
    title: str
    inject: Callable[[FaultRun, dict[str, Any]], None]
    pages: int = 200
    workers: int = 2
    settings: dict[str, str] = field(default_factory=dict)
    #: Redis as this fault needs it (None: a plain one, no persistence)
    redis: Callable[[Path], RedisServer] | None = None
    #: start entries instead of the site's home page (bloomcrawl's start_urls)
    seeds: Callable[[Site], list[str]] | None = None
    #: before the workers start (Redis and the proxy are up)
    prepare: Callable[[FaultRun, dict[str, Any]], None] | None = None
    #: bench/faults.py runs it for scrapy-redis too (the fault means the same there)
    bench: bool = True
    #: each page of the harness's own site answers this late (ms)
    site_delay_ms: float = 0.0

    def run(self, workdir: Path, contender: Contender = BLOOMCRAWL, *,
            site: Site | None = None, extra_settings: dict[str, str] | None = None,
            **finish: float) -> Outcome:
        facts: dict[str, Any] = {}
        redis_server = self.redis(workdir / "redis") if self.redis else None
        run = FaultRun(workdir, self.key, contender=contender, pages=self.pages,
                       workers=self.workers, settings={**self.settings, **(extra_settings or {})},
                       redis_server=redis_server, site=site,
                       site_delay_ms=self.site_delay_ms)
        try:
            if self.seeds is not None:
                run.seeds = self.seeds(run.site)
            run.start(workers=False)
            if self.prepare is not None:
                self.prepare(run, facts)
            run.start_workers()
            self.inject(run, facts)
            outcome = run.finish(**finish)
            outcome.facts.update(facts)
            return outcome
        finally:
            run.close()


# -- injections ----------------------------------------------------------------------


def inject_rollback(run: FaultRun, facts: dict[str, Any]) -> None:
    """BGSAVE at 1/4 of the pages; at 1/2, SIGKILL Redis and start it from that RDB at once."""
    run.wait_pages(0.25)
    run.moment("BGSAVE")
    run.redis.bgsave()
    run.moment("its end")
    facts["snapshot_at"] = run.distinct()
    run.wait_pages(0.5)
    run.redis.kill()
    run.moment("kill")
    facts["killed_at"] = run.distinct()
    run.redis.start()
    run.fault_over()


def inject_recent_rollback(run: FaultRun, facts: dict[str, Any]) -> None:
    """BGSAVE at 1/2 of the pages; 5 % of the pages after it, SIGKILL Redis and start it from
    that RDB: the leases of the pages in hand are in the snapshot, the links they
    dropped as already sent may not be (a replica a moment behind, AOF everysec)."""
    run.wait_pages(0.5)
    run.moment("BGSAVE")
    run.redis.bgsave()
    run.moment("its end")
    facts["snapshot_at"] = run.distinct()
    run.wait_pages(facts["snapshot_at"] / run.pages + 0.05)
    run.redis.kill()
    run.moment("kill")
    facts["killed_at"] = run.distinct()
    run.redis.start()
    run.moment("restart")
    run.fault_over()


def inject_items_after_snapshot(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/2 the site holds its answers until a worker waits for one; then every
    connection that sends a frontier call is held at the proxy, and BGSAVE; then the
    site answers, and the items of the pages in hand are still stored (the pipeline's
    own connection goes on) until none came for a while; then SIGKILL Redis and start it
    from that RDB. The server holds every exchange a worker had confirmed and lost
    the items stored after it (AOF everysec, a replica a moment behind)."""
    run.wait_pages(0.5)
    assert run.proxy is not None
    site = run.site
    if not isinstance(site, ThreadSite):
        raise TypeError("items-after-snapshot holds the answers of the run's own site")
    site.hold()
    try:
        wait_until(lambda: site.held >= 1, 30, interval=0.01, what="a page asked for")
        run.proxy.hold_connections(b"{%s:bloomfilter:" % SPIDER.encode())
        run.moment("hold")
        run.redis.bgsave()
        facts["snapshot_at"] = run.distinct()
    finally:
        site.answer()  # the held pages' items are stored after the snapshot
    key = "%s:items" % SPIDER
    client = run.client()
    try:
        stored = [client.llen(key)]

        def quiet() -> bool:
            stored.append(client.llen(key))
            return len(stored) > ITEMS_QUIET_POLLS and len(set(stored[-ITEMS_QUIET_POLLS:])) == 1

        wait_until(quiet, 10, interval=0.05, what="the items of the pages in hand")
    finally:
        client.close()
    facts["frontier_calls_held"] = run.proxy.held_connections
    run.redis.kill()
    run.moment("kill")
    run.redis.start()
    client = run.client()
    try:
        facts["items_after_snapshot"] = stored[-1] - client.llen(key)
    finally:
        client.close()
    run.proxy.resume()
    run.fault_over()


def inject_state_key_deleted(run: FaultRun, facts: dict[str, Any]) -> None:
    """DEL partition 0's filter state at 1/2 (an eviction, a DEL, a lost shard)."""
    from bloomcrawl.core import keys

    run.wait_pages(0.5)
    client = run.client()
    try:
        key = keys.FrontierKeys(SPIDER).state(0)
        facts["deleted"] = client.delete(key)
        facts["key"] = key
    finally:
        client.close()
    run.fault_over()


def inject_oom(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/3: maxmemory below what Redis uses, noeviction (every write: OOM); after 5 s, none."""
    run.wait_pages(1 / 3)
    client = run.client()
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        facts["oom_at"] = run.distinct()
        time.sleep(PAUSE_S)
        client.config_set("maxmemory", 0)
    finally:
        client.close()
    run.fault_over()


def inject_eviction(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/4: allkeys-lru with maxmemory below what Redis uses, for 5 s: keys are evicted."""
    run.wait_pages(0.25)
    client = run.client()
    try:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.config_set("maxmemory", max(1, used * 3 // 4))
        time.sleep(PAUSE_S)
        facts["evicted_keys"] = int(client.info("stats")["evicted_keys"])
        client.config_set("maxmemory", 0)
        client.config_set("maxmemory-policy", "noeviction")
    finally:
        client.close()
    run.fault_over()


def inject_dropped_replies(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/4, the replies to the next 2 packets that take requests from the queue are lost.

    Redis applied each of those commands; the worker's client sees its
    connection close and sends the command again.
    """
    assert run.proxy is not None
    run.wait_pages(0.25)
    proxy = run.proxy
    proxy.drop_replies(run.contender.pop_marker or lease_packet_marker(), count=DROPS)
    try:
        wait_until(lambda: not proxy.drops_pending
                   and proxy.replies_dropped >= proxy.packets_matched, 10)
    except WaitTimeout:
        pass  # facts say how many were dropped; the test checks them
    facts["replies_dropped"] = run.proxy.replies_dropped
    run.fault_over()


def inject_redis_sigstop(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/3, SIGSTOP Redis for 5 s (the workers' socket timeout is 2 s), then SIGCONT."""
    run.wait_pages(1 / 3)
    run.redis.send_signal(signal.SIGSTOP)
    facts["stopped_at"] = run.distinct()
    try:
        time.sleep(PAUSE_S)
    finally:
        run.redis.send_signal(signal.SIGCONT)
    run.fault_over()


def inject_restart(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/2, SIGKILL Redis and start it again (same port, same data directory)."""
    run.wait_pages(0.5)
    run.redis.kill()
    facts["killed_at"] = run.distinct()
    run.redis.start()
    facts["keys_after_restart"] = _dbsize(run)
    if facts.get("reseed"):
        run.seed([run.site.url])
    run.fault_over()


def inject_restart_empty(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/2, SIGKILL a Redis without persistence, start it empty, seed the home page again."""
    facts["reseed"] = run.contender.start == "redis"
    inject_restart(run, facts)


def _dbsize(run: FaultRun) -> int:
    """The keys of the restarted server, once it has loaded its data (a big AOF takes a
    moment, during which it answers LOADING)."""
    client = run.client()
    sizes: list[int] = []

    def loaded() -> bool:
        try:
            sizes.append(int(client.dbsize()))
        except redis.exceptions.BusyLoadingError:
            return False
        return True

    try:
        wait_until(loaded, 30, interval=0.05, what="the restarted Redis to load its data")
        return sizes[-1]
    finally:
        client.close()


def prepare_replica(run: FaultRun, facts: dict[str, Any]) -> None:
    """A second redis-server replicating the first, in sync before the crawl starts."""
    replica = RedisServer(run.workdir / "replica",
                           extra_args=["--replicaof", "127.0.0.1", str(run.redis.port)])
    run.other_servers.append(replica)
    replica.start()
    client = replica.client()
    try:
        wait_until(lambda: client.info("replication").get("master_link_status") == "up", 15,
                   what="the replica in sync with its master")
    finally:
        client.close()


def inject_failover(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/3 the replica is promoted and the old master made its replica (READONLY).

    As a careful failover does it: the old master's writes are paused until
    the replica has every one of them, so no acknowledged write is lost. For
    2 s the workers still reach the old master and get READONLY; then the
    proxy sends them to the new one.
    """
    assert run.proxy is not None
    [replica] = run.other_servers
    run.wait_pages(1 / 3)
    old, new = run.client(), replica.client()
    try:
        old.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        offset = int(old.info("replication")["master_repl_offset"])
        wait_until(lambda: int(new.info("replication").get("slave_repl_offset", -1)) >= offset,
                   5, interval=0.01, what="the replica caught up with the paused master")
        new.execute_command("REPLICAOF", "NO", "ONE")
        old.execute_command("REPLICAOF", "127.0.0.1", str(replica.port))
        old.execute_command("CLIENT", "UNPAUSE")
        facts["promoted_at"] = run.distinct()
        time.sleep(2.0)  # the old master answers writes with READONLY meanwhile
        run.proxy.set_upstream(replica.port)
    finally:
        old.close()
        new.close()
    # from now on "Redis" is the promoted replica (the harness reads the results there)
    run.other_servers[0], run.redis = run.redis, replica
    run.fault_over()


def stop_a_lease_holder(run: FaultRun) -> Worker | None:
    """:func:`kit.checks.stop_lease_holder` among the run's workers."""
    client = run.client()
    try:
        return stop_lease_holder(run.workers, client, SPIDER)
    finally:
        client.close()


def inject_worker_sigstop(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/3, SIGSTOP a worker holding leases for 8 s (leases last 3 s), then SIGCONT.

    bloomcrawl: the worker holding the most leases (waiting up to 5 s for
    one to hold any); other contenders: the first worker.
    """
    run.wait_pages(1 / 3)
    worker = None
    if run.contender.start == "redis":
        try:
            worker = wait_until(lambda: stop_a_lease_holder(run), 5, interval=0.01)
        except WaitTimeout:
            pass  # none held a lease: the first worker, as for other contenders
    worker = worker or run.workers[0]
    worker.pause()  # stopped already when it holds leases
    facts["stopped"] = worker.name
    facts["stopped_at"] = run.distinct()
    time.sleep(8.0)
    worker.resume()
    run.fault_over()


def inject_stall(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/3, the proxy forwards nothing for 10 s, then delivers what it held."""
    assert run.proxy is not None
    run.wait_pages(1 / 3)
    facts["stall_from"] = time.monotonic()
    run.proxy.stall(STALL_S)
    time.sleep(STALL_S)
    facts["stall_to"] = time.monotonic()
    run.fault_over()


def heartbeat_lags(outcome: Outcome, *, after: float = 1.0) -> dict[str, float | None]:
    """Each worker's worst reactor lag (s) from the stall's start to ``after`` s past its end.

    None for a worker whose :mod:`faults.heartbeat` file is missing (the
    extension never ran).
    """
    start, end = outcome.facts["stall_from"], outcome.facts["stall_to"] + after
    worst: dict[str, float | None] = {}
    for name, log in outcome.log_files.items():
        path = log.with_name(name + ".heartbeat.json")
        if not path.exists():
            worst[name] = None
            continue
        lags = json.loads(path.read_text())["lags"]
        # a tick that ended at ``at``, ``lag`` seconds late, covers (at - lag, at)
        worst[name] = max([lag for at, lag in lags if at >= start and at - lag <= end],
                          default=0.0)
    return worst


def inject_nothing(run: FaultRun, facts: dict[str, Any]) -> None:
    """The fault is in the data given at the start; the crawl just runs."""
    run.fault_over()


MALFORMED_PARAMS = {"broken-null": "null", "broken-list": "[1, 2]", "broken-text": "{not json"}


def inject_malformed_meta(run: FaultRun, facts: dict[str, Any]) -> None:
    """At 1/4, three other spiders' filter meta hashes appear, malformed.

    Their ``params`` are JSON null, a JSON list and no JSON at all; the rest
    of each hash is what a scheduler records.
    """
    run.wait_pages(0.25)
    client = run.client()
    try:
        for spider, params in MALFORMED_PARAMS.items():
            client.hset("%s:bloomfilter:meta" % spider, mapping={
                "params": params, "ready": "1", "spider": spider,
                "queue": "%s:requests" % spider, "queue_type": "priority",
                "stats": "%s:stats" % spider, "start_urls": "%s:start_urls" % spider,
                "items": "%s:items" % spider, "pages_by_node": "{%s:stats}:pages_by_node" % spider})
    finally:
        client.close()
    facts["malformed_from"] = since = time.monotonic()
    run.fault_over()
    # the crawl may end within a scrape or two of the fault: the exporter is judged on
    # at least three (it is scraped until the run is measured)
    exporter = run.exporter
    if exporter is not None:
        wait_until(lambda: sum(1 for s in exporter.scrapes if s.at >= since + 0.1) >= 3,
                   10, what="three scrapes after the malformed meta")


# -- start data ------------------------------------------------------------------------


BAD_SEEDS = (
    json.dumps({"url": "PLACEHOLDER", "priority": int("9" * 400)}),
    json.dumps({"url": "PLACEHOLDER", "meta": {"_bloomcrawl_lease": [0, "forged-token"]}}),
)


def seeds_with_bad_entries(site: Site) -> list[str]:
    """Two bad entries first, then 50 good seeds (the home page and pages 1-49)."""
    bad = [entry.replace("PLACEHOLDER", site.page_url(60 + i)) for i, entry in
           enumerate(BAD_SEEDS)]
    return bad + [site.url] + [site.page_url(page) for page in range(1, 50)]


def prepare_init_callback(run: FaultRun, facts: dict[str, Any]) -> None:
    """Put one request whose callback is ``"__init__"`` into the queue (robots.txt: a 200)."""
    from scrapy import Request, Spider

    from bloomcrawl.core import keys
    from bloomcrawl.crawl.serialization import request_to_json

    url = run.site.url + "robots.txt"
    entry = json.loads(request_to_json(Request(url), Spider(name=SPIDER)))
    entry["callback"] = "__init__"
    client = run.client()
    try:
        client.zadd(keys.FrontierKeys(SPIDER).queue_part(0), {json.dumps(entry): -100})
    finally:
        client.close()
    facts["entry_url"] = url


def redis_aof(workdir: Path) -> RedisServer:
    return RedisServer(workdir, appendonly=True, appendfsync="always")


def redis_allkeys_lru(workdir: Path) -> RedisServer:
    return RedisServer(workdir, extra_args=["--maxmemory", "64mb",
                                             "--maxmemory-policy", "allkeys-lru"])


SOCKET_TIMEOUT = json.dumps({"socket_timeout": SHORT_SOCKET_TIMEOUT_S})
RETRYING_CLIENT = json.dumps({"retry_on_timeout": True})

SCENARIOS: dict[str, Scenario] = {s.key: s for s in (
    Scenario("rollback", "Redis rolled back to an older snapshot", inject_rollback),
    Scenario("recent-rollback", "Redis rolled back to a snapshot 5 % of the pages old",
             inject_recent_rollback, bench=False),
    # pages answer in 0.3 s: the pages in hand when the frontier calls are held store
    # their items after the snapshot, however soon after the hold BGSAVE forks
    Scenario("items-after-snapshot", "Redis kept every exchange, lost the items stored after",
             inject_items_after_snapshot, bench=False, site_delay_ms=300),
    Scenario("state-key-deleted", "one partition's filter state deleted",
             inject_state_key_deleted, bench=False),
    Scenario("oom", "OOM under maxmemory noeviction for 5 s", inject_oom),
    Scenario("eviction", "allkeys-lru evicting for 5 s", inject_eviction),
    Scenario("dropped-reply", "2 replies lost after Redis applied the pop",
             inject_dropped_replies, settings={"REDIS_PARAMS": RETRYING_CLIENT}),
    Scenario("redis-sigstop", "Redis SIGSTOPped 5 s (socket timeout 2 s)",
             inject_redis_sigstop, settings={"REDIS_PARAMS": SOCKET_TIMEOUT}),
    Scenario("restart-aof", "Redis SIGKILLed and restarted, AOF always", inject_restart,
             redis=redis_aof),
    Scenario("restart-empty", "Redis SIGKILLed and restarted empty, reseeded",
             inject_restart_empty, bench=False),
    Scenario("failover", "replica promoted, old master READONLY for 2 s", inject_failover,
             prepare=prepare_replica),
    Scenario("worker-sigstop", "a worker SIGSTOPped 8 s (lease 3 s)", inject_worker_sigstop),
    Scenario("stall", "Redis unreachable (proxy stalled) 10 s", inject_stall,
             settings={"EXTENSIONS": json.dumps({"faults.heartbeat.Heartbeat": 0}),
                       "FAULTS_HEARTBEAT_FILE": "{workdir}/{worker}.heartbeat.json"}),
    Scenario("bad-seeds", "a 400-digit priority and an internal meta key among 50 seeds",
             inject_nothing, pages=100, seeds=seeds_with_bad_entries, bench=False),
    Scenario("init-callback", 'a queue entry with callback "__init__"', inject_nothing,
             pages=100, prepare=prepare_init_callback,
             settings={"SPIDER_MODULES": "faults.spiders"}, bench=False),
    Scenario("malformed-meta", "another spider's meta hash malformed", inject_malformed_meta,
             pages=150, bench=False),
    Scenario("growth-limit", "a filter at its slice limit (BLOOMFILTER_GROWTH=1.01)",
             inject_nothing, pages=1600,
             settings={"BLOOMFILTER_GROWTH": "1.01", "BLOOMFILTER_CAPACITY": "1",
                       "BLOOMFILTER_PARTITIONS": "1"}, bench=False),
)}
