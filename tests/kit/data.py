"""What the tests write into Redis and compare with: fingerprints, filters, frontiers.

:func:`populate_frontier` writes a spider's frontier the way the scheduler lays
it out (keys from :mod:`bloomcrawl.core.keys`), with a real Bloom filter, so
the exporter, status and monitoring tests do not depend on the scheduler.
:func:`fill`, :func:`measure_false_positives` and :func:`race` load a filter,
measure it, and race four processes on it.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import multiprocessing.synchronize
import random
from dataclasses import dataclass

import redis

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.connection import redis_from_url
from bloomcrawl.core.frontier import Outgoing
from bloomcrawl.core.politeness import host_of


def fingerprints(n: int, salt: str = "") -> list[bytes]:
    """``n`` SHA-1 digests (the length of Scrapy's fingerprints), reproducible from ``salt``."""
    return [hashlib.sha1(("%s%d" % (salt, i)).encode()).digest() for i in range(n)]


def outgoing(*urls: str) -> list[Outgoing]:
    """New requests for :meth:`bloomcrawl.core.frontier.Frontier.exchange`: the URL's SHA-1
    as fingerprint, priority 0, the request as ``{"url": ...}``."""
    return [Outgoing(hashlib.sha1(u.encode()).digest(), False, 0.0, json.dumps({"url": u}),
                     host_of(u))
            for u in urls]


# --- a filter: loaded, measured, raced --------------------------------------------------


def fill(bf: BloomFilter, n: int, salt: str = "item-") -> int:
    """Add ``n`` new fingerprints in batches of 2,000; how many the filter took as new."""
    new = 0
    for i in range(0, n, 2000):
        new += sum(bf.add_many(fingerprints(min(2000, n - i), salt="%s%d-" % (salt, i))))
    return new


def measure_false_positives(bf: BloomFilter, n: int = 100_000) -> float:
    """The share of ``n`` fingerprints never added that the filter says it holds."""
    unseen = fingerprints(n, salt="unseen-")
    hits = 0
    for i in range(0, n, 2000):
        hits += sum(bf.contains_many(unseen[i : i + 2000]))
    return hits / n


def _racer(url: str, partitions: int, barrier: multiprocessing.synchronize.Barrier, seed: int,
           queue: multiprocessing.Queue[int]) -> None:
    # an error rate that no false positive reaches in 20,000 items: every "seen" is a race
    bf = BloomFilter(redis_from_url(url), "race:bloomfilter", capacity=50_000,
                     error_rate=1e-9, partitions=partitions)
    fps = fingerprints(20_000, salt="race")
    random.Random(seed).shuffle(fps)
    barrier.wait()
    new = 0
    if seed == 0:
        new += sum(bf.add(fp) for fp in fps[:2000])  # one racer mixes single adds
        fps = fps[2000:]
    for i in range(0, len(fps), 250):
        new += sum(bf.add_many(fps[i : i + 250]))
    queue.put(new)


def race(url: str, partitions: int = 4) -> list[int]:
    """Four processes add the same 20,000 fingerprints at once; how many each saw new."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    queue: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(url, partitions, barrier, seed, queue))
             for seed in range(4)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=120) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.exitcode is None:  # stuck: stopped by its pid, not left behind
                p.kill()
                p.join(5)
    assert [p.exitcode for p in procs] == [0] * 4
    return results


# --- a frontier, as the scheduler writes it ---------------------------------------------


STATS = {
    "pages": 42,
    "items": 40,
    "filtered": 97,
    "requeued": 3,
    "errors": 2,
    "bad_start_urls": 1,
    "unserializable": 4,
    "local": 5,
}
#: ``<spider>:pages_by_node``: worker host name -> pages (they add up to STATS["pages"])
NODE_PAGES = {"worker-a": 30, "worker-b": 12}


@dataclass
class Frontier:
    """What :func:`populate_frontier` wrote, for the tests to compare with."""

    spider: str
    bloom: BloomFilter
    frontier: keys.FrontierKeys
    queue_length: int
    leased: int
    leases_expired: int
    start_urls: int
    items_stored: int
    stats: dict[str, int]
    pages_by_node: dict[str, int]


def populate_frontier(
    client: redis.Redis,
    spider: str = "site",
    *,
    queue_type: str = "priority",
    partitions: int = 4,
    capacity: int = 10_000,
    urls: int = 300,
    duplicates: int = 100,
    backend: str = "bitmap",
) -> Frontier:
    """A filter holding ``urls`` fingerprints (``duplicates`` of them added twice),
    a queue of 7 requests over the partitions, 3 leases (1 expired), stats, pages
    per worker host, start URLs and items, laid out as the scheduler records them
    in the meta hash.
    """
    frontier = keys.FrontierKeys(spider, partitions=partitions)
    bloom = BloomFilter(client, frontier.filter, capacity=capacity, error_rate=0.01,
                        partitions=partitions, backend=backend)
    fps = fingerprints(urls, salt=spider)
    bloom.add_many(fps + fps[:duplicates])
    client.hset(frontier.meta, mapping={
        "spider": spider, "queue": frontier.queue, "queue_type": queue_type,
        "stats": frontier.stats, "start_urls": frontier.start_urls, "items": frontier.items,
        "pages_by_node": frontier.pages_by_node,
    })
    queue_length = 0
    for i in range(7):
        payload = json.dumps({"url": f"http://127.0.0.1/{spider}/{i}", "priority": i % 3})
        key = frontier.queue_part(i % partitions)
        if queue_type == "priority":
            client.zadd(key, {payload: -(i % 3)})
        else:
            client.rpush(key, payload)
        queue_length += 1
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    deadlines = {"w1:1:a": now_ms + 600_000, "w1:1:b": now_ms + 600_000, "w2:7:a": now_ms - 5}
    for n, (token, deadline) in enumerate(deadlines.items()):
        p = n % partitions
        client.hset(frontier.leases(p), token, json.dumps({"url": f"http://127.0.0.1/l/{n}"}))
        client.zadd(frontier.deadlines(p), {token: deadline})
    client.hset(frontier.stats, mapping=STATS)
    client.hset(frontier.pages_by_node, mapping=NODE_PAGES)
    client.rpush(frontier.start_urls, "http://127.0.0.1/a", '{"url": "http://127.0.0.1/b"}')
    client.rpush(frontier.items, *[json.dumps({"n": n}) for n in range(5)])
    return Frontier(spider=spider, bloom=bloom, frontier=frontier, queue_length=queue_length,
                    leased=3, leases_expired=1, start_urls=2, items_stored=5, stats=dict(STATS),
                    pages_by_node=dict(NODE_PAGES))
