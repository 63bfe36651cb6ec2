"""What a crawl left behind, and the one exactly-once check over it.

:func:`assert_each_once` compares what a site counted with what it should
have counted (every page exactly once, nothing else); the sites count
differently (the demo site per page number, the hosts site per host and
path, the shop per method and path), so each test turns its site's counts
into such a mapping. :func:`assert_crawled_once` is the whole check of a
crawl of the demo site: every page once, every page counted and stored
once, the frontier empty, the workers gone cleanly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from bloomcrawl.core import keys

from kit.workers import Worker, check_exits

if TYPE_CHECKING:
    from bloomcrawl.ops.demo_site import RunningSite

K = TypeVar("K")
#: how many keys of each kind a failure message lists
SHOWN = 20


def shared_stats(client: Any, spider: str = "site") -> dict[str, int]:
    """The spider's shared crawl stats (``<spider>:stats``)."""
    return {k.decode(): int(v) for k, v in client.hgetall("%s:stats" % spider).items()}


def pages_crawled(site: RunningSite) -> int:
    """Pages of the demo site fetched at least once so far."""
    return sum(1 for h in site.hits() if h)


def stored_items(client: Any, spider: str = "site") -> list[dict[str, Any]]:
    """The items in ``<spider>:items``, decoded."""
    return [json.loads(raw) for raw in client.lrange("%s:items" % spider, 0, -1)]


def frontier_keys(client: Any, spider: str = "site") -> keys.FrontierKeys:
    """A spider's frontier keys, with the partitions its stored filter has."""
    params = client.hget(keys.FrontierKeys(spider).meta, "params")
    return keys.FrontierKeys(spider, partitions=json.loads(params)["partitions"])


def leases_held(client: Any, spider: str = "site") -> int:
    """Leases held in a spider's frontier, every partition's."""
    f = frontier_keys(client, spider)
    return sum(client.hlen(f.leases(p)) for p in range(f.partitions))


def leases_of(client: Any, pids: Iterable[int], spider: str = "site") -> dict[int, int]:
    """Leases each worker process holds (a lease token begins ``<node>-<pid>-``)."""
    f = frontier_keys(client, spider)
    tokens = [t.split(b":", 1)[0] for p in range(f.partitions) for t in client.hkeys(f.leases(p))]
    return {pid: sum(1 for t in tokens if b"-%d-" % pid in t) for pid in pids}


def stop_lease_holder(workers: Sequence[Worker], client: Any,
                      spider: str = "site") -> Worker | None:
    """SIGSTOP the worker holding the most leases, if one holds any (None: all go on).

    Every worker is stopped while Redis is asked, so that none acks its last lease
    between the look and the stop; the others go on at once.
    """
    holder = None
    for worker in workers:
        worker.pause()
    try:
        time.sleep(0.05)  # what they wrote before the stop reaches Redis
        held = leases_of(client, [w.pid for w in workers], spider)
        busiest = max(workers, key=lambda w: held[w.pid])
        holder = busiest if held[busiest.pid] else None
    finally:
        for worker in workers:
            if worker is not holder:
                worker.resume()
    return holder


def leased_entries(client: Any, spider: str = "site") -> list[bytes]:
    """What each lease held in a spider's frontier holds (its queue entry among it)."""
    f = frontier_keys(client, spider)
    return [v for p in range(f.partitions) for v in client.hvals(f.leases(p))]


def frontier_left(client: Any, spider: str = "site") -> int:
    """Requests queued or leased anywhere in a spider's frontier (the filter's partitions).

    Counts the hosts' queues (each partition's counter), the leases, and any
    queue of before per-host queues, so a request in none of them is lost.
    Hosts with queued requests or leases left behind count too: their
    bookkeeping must end empty along with the queues.
    """
    f = frontier_keys(client, spider)
    pipe = client.pipeline(transaction=False)
    for p in range(f.partitions):
        pipe.get(f.polite(p, "queued"))
        pipe.zcard(f.queue_part(p))
        pipe.zcard(f.deadlines(p))
        pipe.hlen(f.leases(p))
        pipe.zcard(f.polite(p, "depth"))
        pipe.hlen(f.polite(p, "busy"))
    return sum(int(n or 0) for n in pipe.execute())


def assert_each_once(counts: Mapping[K, int], expected: Iterable[K] | Mapping[K, int]) -> None:
    """Every expected key counted exactly as often as expected (once, for an iterable), and
    nothing else counted."""
    want: Mapping[K, int] = (expected if isinstance(expected, Mapping)
                             else dict.fromkeys(expected, 1))
    missing = sorted((k for k in want if not counts.get(k)), key=repr)
    wrong = {k: (counts[k], n) for k, n in want.items() if counts.get(k) and counts[k] != n}
    unexpected = {k: n for k, n in counts.items() if n and k not in want}
    assert not missing and not wrong and not unexpected, {
        "missing": missing[:SHOWN],
        "(got, expected)": dict(sorted(wrong.items(), key=repr)[:SHOWN]),
        "unexpected": dict(sorted(unexpected.items(), key=repr)[:SHOWN])}


def assert_crawled_once(site: RunningSite, client: Any, workers: Sequence[Worker] = (),
                        spider: str = "site") -> None:
    """A crawl of the demo site by ``workers`` ended, and did everything once.

    Every page fetched exactly once (none missing, none twice, as the site
    counts them and page by page); the shared stats count each page once and
    each page's item is stored once; nothing is left in the frontier; every
    worker exited 0 with no traceback.
    """
    stats = site.stats()
    assert (stats["missing"], stats["duplicates"]) == (0, 0), stats  # as the site counts
    hits = site.hits()
    assert_each_once(dict(enumerate(hits)), range(len(hits)))
    shared = shared_stats(client, spider)
    assert shared.get("pages") == len(hits), shared
    assert shared.get("items") == len(hits), shared
    urls = [item["url"] for item in stored_items(client, spider)]
    assert len(urls) == len(set(urls)) == len(hits), (len(urls), len(set(urls)), len(hits))
    assert frontier_left(client, spider) == 0
    check_exits(workers)
