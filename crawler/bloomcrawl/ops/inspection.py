"""A read-only snapshot of the cluster's Redis: every spider's filter, queue and stats.

The exporter and the ``bloomcrawl status`` command both read Redis through
this module (and the scrapyd nodes through :mod:`bloomcrawl.ops.scrapyd`).
Everything here only reads: spiders are found by ``SCAN MATCH *:meta`` (never
``KEYS``), each filter's fill comes from its exact counters (never
``BITCOUNT``), and every Redis command issued is O(1), O(partitions x slices)
or O(worker hosts); the politeness summary is one read-only script per
partition, bounded by the hosts in flight, the ``top_domains`` busiest and at
most 10,000 hosts ready (:func:`bloomcrawl.core.politeness.politeness_summary`).
So a snapshot never blocks Redis, however large the filter or the queue. Key
names come from :mod:`bloomcrawl.core.keys`.

On Redis Cluster (a ``RedisCluster`` client) the same holds per master:
``SCAN`` runs on every master with a cursor of its own, ``INFO`` and
``DBSIZE`` go to each master (:func:`redis_nodes`), and pipelines are never
transactions, so they may span slots. A single Redis is reported as a
cluster of one master, named ``host:port`` as well.

One spider's malformed keys (a meta hash whose parameters are not JSON, a
key of the wrong type, a counter that is not a number) never hide the
others: what cannot be read is left out of that spider's state and recorded
as a :class:`Problem`; only Redis being unreachable fails a whole snapshot
(:class:`~bloomcrawl.core.errors.RedisUnavailableError`).

The servers themselves (names, memory, which failures mean Redis is out of
reach) are :mod:`bloomcrawl.ops.redis_masters`; the records a snapshot fills
in are :mod:`bloomcrawl.ops.spider_state`. This module reads the spiders.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.bloom_info import partition_filters
from bloomcrawl.core.errors import BloomFilterError
from bloomcrawl.core.politeness import politeness_summary
from bloomcrawl.core.sizing import FilterParams
from bloomcrawl.ops.redis_masters import (
    UNREACHABLE,
    RedisMemory,
    RedisNode,
    key_owner,
    masters,
    node_name,
    reachable,
    redis_nodes,
    redis_time_ms,
    total_memory,
    unless_unreachable,
)
from bloomcrawl.ops.spider_state import NodeFill, PartitionFill, Problem, SpiderState

__all__ = [
    "MAX_NODES_PER_SPIDER",
    "MAX_SCAN_CALLS",
    "META_PATTERN",
    "QUEUE_TYPES",
    "SCAN_COUNT",
    "TOP_DOMAINS",
    "NodeFill",
    "PartitionFill",
    "Problem",
    "RedisMemory",
    "RedisNode",
    "RedisSnapshot",
    "SpiderState",
    "find_meta_keys",
    "find_spiders",
    "frontier_keys",
    "key_owner",
    "node_name",
    "partition_fill",
    "reachable",
    "redis_nodes",
    "redis_time_ms",
    "snapshot",
    "spider_from_filter_name",
    "spider_state",
    "spider_states",
    "total_memory",
]

logger = logging.getLogger(__name__)

META_PATTERN = "*" + keys.META_SUFFIX
SCAN_COUNT = 1000
#: Upper bound on SCAN calls in one snapshot (about ten million keys).
MAX_SCAN_CALLS = 10_000
QUEUE_TYPES = ("priority", "fifo", "lifo")
#: Worker hosts reported per spider at most (those with the most pages): a label bound.
MAX_NODES_PER_SPIDER = 256
#: Hosts whose politeness state is reported per spider (the busiest: most requests
#: queued and in flight): a label bound, the exporter's ``--top-domains``.
TOP_DOMAINS = 10

_FILTER_PREFIX, _FILTER_SUFFIX = defaults.FILTER_KEY.split("%(spider)s")


@dataclass
class RedisSnapshot:
    """What one pass over Redis found.

    ``memory`` sums the masters that answered (``max_bytes`` is 0 when any of
    them has no maxmemory); ``nodes`` has each master's own figures.
    """

    spiders: list[SpiderState]
    memory: RedisMemory
    redis_time_ms: int
    nodes: list[RedisNode] = field(default_factory=list)



# --- Redis ---------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def spider_from_filter_name(name: str) -> str:
    """The spider a filter belongs to when its meta hash does not say.

    ``site:bloomfilter`` (the default key pattern) gives ``site``; any other
    name is returned unchanged.
    """
    if _FILTER_PREFIX and not name.startswith(_FILTER_PREFIX):
        return name
    if _FILTER_SUFFIX and not name.endswith(_FILTER_SUFFIX):
        return name
    core = name[len(_FILTER_PREFIX) : len(name) - len(_FILTER_SUFFIX)]
    return core or name


def find_meta_keys(client: redis.Redis) -> list[str]:
    """Names of every filter meta hash, by ``SCAN`` on every master (sorted, no duplicates)."""
    found: set[str] = set()
    with reachable(client):
        for name, target in masters(client):
            cursor: Any = 0
            for _ in range(MAX_SCAN_CALLS):
                cursor, batch = client.scan(cursor, match=META_PATTERN, count=SCAN_COUNT,
                                            **target)
                if isinstance(cursor, dict):  # RedisCluster: {node name: cursor}
                    cursor = next(iter(cursor.values()), 0)
                for raw in batch:
                    key = _text(raw)
                    # partition keys carry hash tags; a filter name never does
                    if "{" not in key and "}" not in key:
                        found.add(key)
                if int(cursor) == 0:
                    break
            else:
                logger.warning(
                    "SCAN for %r on %s stopped after %d calls; some spiders may be missing",
                    META_PATTERN, name, MAX_SCAN_CALLS,
                )
    return sorted(found)


def _read_meta(client: redis.Redis, meta_keys: Sequence[str]) -> list[dict[str, str] | None]:
    """Each meta hash as text, ``None`` where it is gone or is not a hash."""
    if not meta_keys:
        return []
    with reachable(client):
        # never a transaction: on a cluster the meta hashes lie in many slots
        pipe = client.pipeline(transaction=False)
        for key in meta_keys:
            pipe.hgetall(key)
        replies = unless_unreachable(pipe.execute(raise_on_error=False))
    out: list[dict[str, str] | None] = []
    for reply in replies:
        if isinstance(reply, dict) and reply:
            out.append({_text(k): _text(v) for k, v in reply.items()})
        else:
            out.append(None)
    return out


def frontier_keys(filter_name: str, meta: dict[str, str], spider: str,
                  partitions: int = 1) -> keys.FrontierKeys:
    """Every key of a spider's frontier, as its filter's meta hash records them.

    Raises :class:`ValueError` when a recorded name would break hash-tag routing.
    """
    queue = meta.get("queue") or keys.spider_key(defaults.QUEUE_KEY, spider)
    frontier = keys.FrontierKeys(
        spider,
        filter_pattern=filter_name.replace("%", "%%"),
        queue_pattern=queue.replace("%", "%%"),
        partitions=partitions,
    )
    frontier.stats = meta.get("stats") or frontier.stats
    frontier.use_start_urls(meta.get("start_urls") or frontier.start_urls)
    frontier.items = meta.get("items") or frontier.items
    frontier.pages_by_node = meta.get("pages_by_node") or frontier.pages_by_node
    for name in (frontier.stats, frontier.start_urls, frontier.items):
        keys.check_key(name)
    # these carry the stats hash's name as their hash tag (one slot for them all)
    frontier.stats_applied = "{%s}:applied" % frontier.stats
    frontier.workers = "{%s}:workers" % frontier.stats
    frontier.requeued_added = "{%s}:requeued" % frontier.stats
    if frontier.pages_by_node != "{%s}:pages_by_node" % frontier.stats:
        keys.check_key(frontier.pages_by_node)  # recorded before the tag
    return frontier


def _read_filter(client: redis.Redis, state: SpiderState, meta: dict[str, str]
                 ) -> FilterParams | None:
    """The filter's parameters (``None``: unreadable) and, once it is ready, its figures."""
    try:
        params = FilterParams.from_json(meta["params"])
    except (KeyError, ValueError, TypeError) as exc:
        state.unreadable("filter parameters", f"unreadable filter parameters: {exc}")
        return None
    state.backend = params.backend
    if meta.get("ready") != "1":
        state.note("filter being created", "filter is being created")
        return params
    try:
        state.filter = BloomFilter.open(client, state.filter_name).info()
        if params.backend == "bitmap":
            state.partition_fill = partition_fill(client, state.filter_name, params)
    except UNREACHABLE:
        raise
    except (BloomFilterError, redis.RedisError, ArithmeticError, LookupError, ValueError,
            TypeError) as exc:  # WRONGTYPE, or counters that are not numbers
        state.unreadable("filter counters", f"filter counters unreadable: {exc}")
    return params


def partition_fill(client: redis.Redis, filter_name: str, params: FilterParams
                   ) -> list[PartitionFill]:
    """Each partition's items, bits and bits set (bitmap backend), and its master.

    One ``HGETALL`` of each partition's state hash, as
    :meth:`~bloomcrawl.core.bloom.BloomFilter.info` reads them (which sums
    them); the bits of a slice come from the plan stored with the partition.
    """
    computed = params.plan()
    owner = key_owner(client)
    with reachable(client):
        pipe = client.pipeline(transaction=False)
        for p in range(params.partitions):
            pipe.hgetall(keys.state_key(filter_name, p))
        # a revisit window's partition: its generations in the window, summed
        filters, _ = partition_filters(client, filter_name, params, pipe.execute())
    out = []
    for p, part in enumerate(filters):
        items = bits = bits_set = 0
        for raw_state, _ in part:
            state = {_text(k): _text(v) for k, v in raw_state.items()}
            for s in range(int(state.get("slices", 1))):
                plan = computed[s]
                stored = state.get(f"plan:{s}")
                if stored is not None:  # "capacity hashes blocks"
                    plan = replace(plan, blocks=int(stored.split()[2]))
                bits += plan.bits
                items += int(state.get(f"items:{s}", 0))
                bits_set += int(state.get(f"bits_set:{s}", 0))
        out.append(PartitionFill(p, owner(keys.state_key(filter_name, p)), items, bits,
                                 bits_set))
    return out


def _count(state: SpiderState, what: str, key: str, reply: Any) -> int | None:
    """A count Redis replied (``GET`` of a counter included); else a problem, ``None``."""
    if reply is None:
        return 0  # a counter never incremented
    try:
        return int(reply)
    except (TypeError, ValueError):
        state.unreadable(what, f"{what} {key} unreadable: {_text(reply)[:200]}")
        return None


def _read_stats(state: SpiderState, key: str, reply: Any) -> None:
    if not isinstance(reply, dict):
        state.unreadable("stats", f"stats {key} unreadable: {reply}")
        return
    raw = {_text(k): v for k, v in reply.items()}
    bad = []
    for name in keys.STATS_FIELDS:
        try:
            state.stats[name] = int(raw.get(name, 0))
        except (TypeError, ValueError):
            bad.append(name)
    if bad:
        state.unreadable("stats", "stats %s: %s not integers" % (key, ", ".join(bad)))


def _state_from_meta(
    client: redis.Redis, meta_key: str, meta: dict[str, str], now_ms: int,
    top_domains: int = TOP_DOMAINS,
) -> SpiderState:
    filter_name = keys.filter_name_from_meta(meta_key)
    spider = meta.get("spider") or spider_from_filter_name(filter_name)
    state = SpiderState(spider=spider, filter_name=filter_name, meta_key=meta_key)
    params = _read_filter(client, state, meta)
    partitions = params.partitions if params is not None else 1
    try:
        frontier = frontier_keys(filter_name, meta, spider, partitions)
    except (ValueError, KeyError, TypeError) as exc:
        state.unreadable("key names", f"bad key names in {meta_key}: {exc}")
        return state
    state.stats_key = frontier.stats
    state.pages_by_node_key = frontier.pages_by_node
    state.queue_type = meta.get("queue_type")
    has_queue = "queue" in meta and params is not None
    if has_queue:
        state.queue_key = frontier.queue
        if state.queue_type not in QUEUE_TYPES:
            state.unreadable("queue type", f"unknown queue_type {state.queue_type!r}")
    item_ids = keys.item_ids_key(frontier.items)
    recent_ids = keys.recent_item_ids_key(frontier.items)

    with reachable(client):
        # never a transaction: on a cluster these keys lie in many slots
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(frontier.stats)
        pipe.hgetall(frontier.pages_by_node)
        pipe.llen(frontier.start_urls)
        pipe.zcard(frontier.start_deadlines)
        pipe.llen(frontier.items)
        pipe.scard(item_ids)
        pipe.hlen(frontier.stats_applied)
        pipe.zcard(recent_ids)
        counted = has_queue and state.queue_type in QUEUE_TYPES
        if counted:
            for p in range(partitions):
                if state.queue_type == "priority":
                    pipe.zcard(frontier.queue_part(p))
                else:
                    pipe.llen(frontier.queue_part(p))
                pipe.hlen(frontier.leases(p))
                pipe.zcount(frontier.deadlines(p), "-inf", now_ms)
                pipe.get(frontier.lease_counter(p))
        replies = unless_unreachable(pipe.execute(raise_on_error=False))

    (stats_reply, node_pages, start_urls, start_leased, items, ids, workers,
     recent) = replies[:8]
    _read_stats(state, frontier.stats, stats_reply)
    if isinstance(node_pages, dict):
        state.pages_by_node = _pages_by_node(node_pages, frontier.pages_by_node, state)
    else:
        state.unreadable("pages by node",
                         f"pages by node {frontier.pages_by_node} unreadable: {node_pages}")
    state.start_urls = _count(state, "start URLs", frontier.start_urls, start_urls)
    state.start_urls_leased = _count(state, "start URL leases", frontier.start_deadlines,
                                     start_leased)
    state.items_stored = _count(state, "items", frontier.items, items)
    state.item_ids = _count(state, "item ids", item_ids, ids)
    recent_count = _count(state, "recent item ids", recent_ids, recent)
    if state.item_ids is not None and recent_count is not None:
        state.item_ids += recent_count
    state.stats_workers = _count(state, "stats workers", frontier.stats_applied, workers)
    if counted:
        _read_partitions(state, frontier, replies[8:])
    if has_queue:
        _read_politeness(client, state, frontier, top_domains)
        if state.queue_length is not None:
            state.queue_length = (state.queue_length + state.politeness.queued
                                  if state.politeness is not None else None)
    return state


def _read_politeness(client: redis.Redis, state: SpiderState, frontier: keys.FrontierKeys,
                     top_domains: int) -> None:
    """The spider's politeness summary, its ``top_domains`` busiest hosts included."""
    try:
        state.politeness = politeness_summary(client, frontier, top_k=top_domains)
    except UNREACHABLE:
        raise
    except (redis.RedisError, ArithmeticError, LookupError, ValueError,
            TypeError) as exc:  # WRONGTYPE, or a count or delay that is not a number
        state.unreadable("politeness", f"politeness state unreadable: {exc}")


def _read_partitions(state: SpiderState, frontier: keys.FrontierKeys, replies: list[Any]
                     ) -> None:
    """Queue, leases, expired leases and lease counter of each partition, summed."""
    partitions = len(replies) // 4
    sums = [0, 0, 0]
    broken = []
    for p in range(partitions):
        for j in range(3):
            reply = replies[4 * p + j]
            if isinstance(reply, int):
                sums[j] += reply
            else:
                broken.append(str(reply))
    if broken:
        state.unreadable("queue keys", "queue keys of %s unreadable (%d of %d): %s" % (
            frontier.queue, len(broken), 3 * partitions, broken[0]))
    else:
        state.queue_length, state.leased, state.leases_expired = sums
    leases = [_count(state, "lease counter", frontier.lease_counter(p), replies[4 * p + 3])
              for p in range(partitions)]
    if all(n is not None for n in leases):
        state.leases_total = sum(n for n in leases if n is not None)


def _pages_by_node(reply: dict[Any, Any], key: str, state: SpiderState) -> dict[str, int]:
    """Host name -> pages; past :data:`MAX_NODES_PER_SPIDER` hosts, those with the most."""
    pages = {_text(host): _int(value) for host, value in reply.items()}
    if len(pages) > MAX_NODES_PER_SPIDER:
        state.note("worker hosts", f"{key} names {len(pages)} worker hosts; reporting the"
                   f" {MAX_NODES_PER_SPIDER} with the most pages")
        top = sorted(pages.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_NODES_PER_SPIDER]
        pages = dict(top)
    return dict(sorted(pages.items()))


def spider_states(client: redis.Redis, meta_keys: Iterable[str], *,
                  top_domains: int = TOP_DOMAINS) -> list[SpiderState]:
    """The state of each filter named by its meta key; vanished ones are left out.

    Whatever one filter's keys hold, its state is returned with what could be
    read; only an unreachable Redis raises. ``top_domains``: how many of each
    spider's busiest hosts its politeness summary details.
    """
    names = list(meta_keys)
    metas = _read_meta(client, names)
    now_ms = redis_time_ms(client) if names else 0
    out = []
    for meta_key, meta in zip(names, metas, strict=True):
        if meta is None or "params" not in meta:
            continue  # deleted meanwhile, or some other application's key
        try:
            with reachable(client):
                out.append(_state_from_meta(client, meta_key, meta, now_ms, top_domains))
        except UNREACHABLE:
            raise
        except Exception as exc:  # whatever a malformed spider does, the others are reported
            filter_name = keys.filter_name_from_meta(meta_key)
            state = SpiderState(spider=meta.get("spider") or spider_from_filter_name(filter_name),
                                filter_name=filter_name, meta_key=meta_key)
            state.unreadable("spider", f"unreadable ({type(exc).__name__}: {exc})")
            logger.debug("reading %s failed", meta_key, exc_info=True)
            out.append(state)
    return out


def spider_state(client: redis.Redis, meta_key: str) -> SpiderState | None:
    """One spider's state from its filter's meta key; ``None`` when there is no such filter."""
    found = spider_states(client, [meta_key])
    return found[0] if found else None


def find_spiders(client: redis.Redis, *, top_domains: int = TOP_DOMAINS) -> list[SpiderState]:
    """Every spider with a Bloom filter in this Redis, sorted by filter name.

    Raises :class:`bloomcrawl.core.errors.RedisUnavailableError` when Redis cannot
    be reached.
    """
    return spider_states(client, find_meta_keys(client), top_domains=top_domains)


def snapshot(client: redis.Redis, nodes: list[RedisNode] | None = None, *,
             top_domains: int = TOP_DOMAINS) -> RedisSnapshot:
    """Each master's memory and keys, the clock and every spider's state, in one pass.

    ``nodes``: the masters' figures when the caller already read them
    (:func:`redis_nodes`). Raises what a master that did not answer raised
    (:class:`~bloomcrawl.core.errors.RedisUnavailableError` when it is out of
    reach): the spiders' keys lie on every master.
    """
    if nodes is None:
        nodes = redis_nodes(client)
    for node in nodes:
        if node.exception is not None:
            raise node.exception
    with reachable(client):
        spiders = find_spiders(client, top_domains=top_domains)
        now_ms = redis_time_ms(client)
    return RedisSnapshot(spiders=spiders, memory=total_memory(nodes), redis_time_ms=now_ms,
                         nodes=nodes)
