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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from redis.exceptions import ClusterError, RedisClusterException

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.bloom import BloomFilter, BloomInfo
from bloomcrawl.core.connection import REDIS_ERRORS, describe_redis, is_cluster, redis_errors
from bloomcrawl.core.errors import BloomFilterError, RedisUnavailableError
from bloomcrawl.core.politeness import PolitenessSummary, politeness_summary
from bloomcrawl.core.sizing import FilterParams

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
#: what means Redis itself is gone (the whole snapshot fails), not one spider's keys:
#: on a cluster also CLUSTERDOWN/MASTERDOWN replies and a slot no master serves
_UNREACHABLE = (RedisUnavailableError, redis.ConnectionError, redis.TimeoutError, ClusterError,
                RedisClusterException)
@dataclass(frozen=True)
class Problem:
    """Something wrong with one spider's keys; ``kind`` is short and fixed (log once per kind).

    ``read_error``: a key or value could not be read (counted in the exporter's
    ``bloomcrawl_spider_read_errors``); otherwise it is a note, such as a
    filter still being created.
    """

    kind: str
    message: str
    read_error: bool = True


@dataclass(frozen=True)
class PartitionFill:
    """One filter partition's exact counters (bitmap backend), and the master holding it.

    ``node`` is the ``host:port`` of the master owning the partition's slot (the
    one server without a cluster).
    """

    partition: int
    node: str
    items: int
    bits: int
    bits_set: int

    @property
    def fill_ratio(self) -> float:
        return self.bits_set / self.bits if self.bits else 0.0


@dataclass
class NodeFill:
    """The partitions of one filter that one master holds, summed."""

    node: str
    partitions: int = 0
    items: int = 0
    bits: int = 0
    bits_set: int = 0

    @property
    def fill_ratio(self) -> float:
        return self.bits_set / self.bits if self.bits else 0.0


@dataclass
class SpiderState:
    """One spider's frontier: its Bloom filter, queue, leases and shared stats.

    Fields that need the scheduler's entries in the meta hash (``queue`` and
    friends) are ``None`` for a filter used by the dupefilter alone.
    ``pages_by_node`` maps a worker's host name (``socket.gethostname()``, which
    is also scrapyd's default ``node_name``) to the pages it crawled.
    """

    spider: str
    filter_name: str
    meta_key: str
    queue_key: str | None = None
    queue_type: str | None = None
    stats_key: str | None = None
    #: ``bitmap`` or ``redisbloom``, from the stored parameters
    backend: str | None = None
    pages_by_node_key: str | None = None
    filter: BloomInfo | None = None
    #: requests queued: in the hosts' queues, and in the partitions' queues of before
    #: per-host queues that no worker has moved yet
    queue_length: int | None = None
    leased: int | None = None
    leases_expired: int | None = None
    start_urls: int | None = None
    #: start URLs a worker took and has not queued yet (``{<start_urls>}:deadlines``)
    start_urls_leased: int | None = None
    items_stored: int | None = None
    #: ids of the items stored once each (``{<items>}:ids``); never trimmed
    item_ids: int | None = None
    #: leases ever handed out: the sum of the partitions' lease counters
    leases_total: int | None = None
    #: worker runs whose stats exchanges are recorded (``<stats>:applied``)
    stats_workers: int | None = None
    #: the shared stats that could be read (all of them, 0 when never counted)
    stats: dict[str, int] = field(default_factory=dict)
    pages_by_node: dict[str, int] = field(default_factory=dict)
    #: each partition's counters and master (bitmap backend; empty for RedisBloom)
    partition_fill: list[PartitionFill] = field(default_factory=list)
    #: hosts queued, held back and in flight, and the busiest hosts' state
    #: (``None``: no queue recorded, or unreadable)
    politeness: PolitenessSummary | None = None
    issues: list[Problem] = field(default_factory=list)

    @property
    def fill_by_node(self) -> dict[str, NodeFill]:
        """The filter's partitions summed per master, by ``host:port``."""
        out: dict[str, NodeFill] = {}
        for part in self.partition_fill:
            node = out.setdefault(part.node, NodeFill(part.node))
            node.partitions += 1
            node.items += part.items
            node.bits += part.bits
            node.bits_set += part.bits_set
        return dict(sorted(out.items()))

    @property
    def max_partition_fill_ratio(self) -> float | None:
        """Fill of the fullest partition (a hot partition shows here); ``None``: unknown."""
        return max((p.fill_ratio for p in self.partition_fill), default=None)

    @property
    def requeued(self) -> int:
        """Expired leases put back into the queue, from the shared stats."""
        return self.stats.get("requeued", 0)

    @property
    def problems(self) -> list[str]:
        """What is wrong with this spider's keys, as sentences."""
        return [issue.message for issue in self.issues]

    @property
    def read_errors(self) -> int:
        """Keys or values of this spider that could not be read."""
        return sum(1 for issue in self.issues if issue.read_error)

    def unreadable(self, kind: str, message: str) -> None:
        self.issues.append(Problem(kind, message))

    def note(self, kind: str, message: str) -> None:
        self.issues.append(Problem(kind, message, read_error=False))


@dataclass
class RedisMemory:
    """``INFO memory`` figures, in bytes; ``max_bytes`` is 0 when no maxmemory is set."""

    used_bytes: int
    max_bytes: int
    peak_bytes: int


@dataclass
class RedisNode:
    """One server holding data: a master of a cluster, or the one Redis.

    ``name`` is ``host:port`` (a Unix socket's path). A server that did not
    answer this pass has ``up`` False, ``error`` saying why, and no figures.
    """

    name: str
    up: bool
    memory: RedisMemory | None = None
    #: keys it holds (``DBSIZE``)
    keys: int | None = None
    error: str | None = None
    #: what it raised, for :func:`snapshot` to raise again
    exception: BaseException | None = field(default=None, repr=False, compare=False)


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


@contextmanager
def reachable(client: redis.Redis) -> Iterator[None]:
    """:func:`~bloomcrawl.core.connection.redis_errors`, and a cluster client's own
    failures (no master serves a slot, no node answers: not RedisErrors) alike."""
    try:
        with redis_errors(client):
            yield
    except RedisClusterException as exc:
        raise RedisUnavailableError(
            "cannot reach Redis Cluster at %s: %s" % (describe_redis(client), exc)) from exc


def node_name(client: redis.Redis) -> str:
    """``host:port`` of a single Redis (a Unix socket's path): the ``node`` label."""
    kwargs = getattr(client, "connection_pool", None)
    kwargs = getattr(kwargs, "connection_kwargs", {})
    if "path" in kwargs:
        return str(kwargs["path"])
    return "%s:%s" % (kwargs.get("host", "localhost"), kwargs.get("port", 6379))


def _masters(client: redis.Redis) -> list[tuple[str, dict[str, Any]]]:
    """``(host:port, call options)`` of each server holding data: every master of a
    cluster (as the client's slot map has them now), or the one Redis."""
    if not is_cluster(client):
        return [(node_name(client), {})]
    masters = sorted(client.get_primaries(), key=lambda node: node.name)  # type: ignore[attr-defined]
    return [(node.name, {"target_nodes": node}) for node in masters]


def key_owner(client: redis.Redis) -> Callable[[str], str]:
    """A function naming the master (``host:port``) that holds a key."""
    if not is_cluster(client):
        name = node_name(client)
        return lambda key: name
    nodes = client.nodes_manager  # type: ignore[attr-defined]
    return lambda key: str(nodes.get_node_from_slot(client.keyslot(key)).name)  # type: ignore[attr-defined]


def find_meta_keys(client: redis.Redis) -> list[str]:
    """Names of every filter meta hash, by ``SCAN`` on every master (sorted, no duplicates)."""
    found: set[str] = set()
    with reachable(client):
        for name, target in _masters(client):
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


def redis_time_ms(client: redis.Redis) -> int:
    """Redis's clock in milliseconds (lease deadlines use it; on a cluster, one master's)."""
    with reachable(client):
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def redis_nodes(client: redis.Redis) -> list[RedisNode]:
    """``INFO memory`` and ``DBSIZE`` of each master (of the one Redis), by name.

    A master that fails is returned with ``up`` False; this never raises for one
    server's failure, so the others are still reported.
    """
    out = []
    for name, target in _masters(client):
        try:
            with reachable(client):
                info = client.info("memory", **target)
                count = client.dbsize(**target)
        except REDIS_ERRORS as exc:
            out.append(RedisNode(name, up=False, error=str(exc) or type(exc).__name__,
                                 exception=exc))
            continue
        out.append(RedisNode(name, up=True, keys=_int(count), memory=RedisMemory(
            used_bytes=_int(info.get("used_memory")),
            max_bytes=_int(info.get("maxmemory")),
            peak_bytes=_int(info.get("used_memory_peak")),
        )))
    return out


def total_memory(nodes: Sequence[RedisNode]) -> RedisMemory:
    """The memory of the masters that answered, summed; ``max_bytes`` 0 if any is unlimited."""
    up = [node.memory for node in nodes if node.memory is not None]
    limits = [memory.max_bytes for memory in up]
    return RedisMemory(
        used_bytes=sum(memory.used_bytes for memory in up),
        max_bytes=0 if not limits or 0 in limits else sum(limits),
        peak_bytes=sum(memory.peak_bytes for memory in up),
    )


def _read_meta(client: redis.Redis, meta_keys: Sequence[str]) -> list[dict[str, str] | None]:
    """Each meta hash as text, ``None`` where it is gone or is not a hash."""
    if not meta_keys:
        return []
    with reachable(client):
        # never a transaction: on a cluster the meta hashes lie in many slots
        pipe = client.pipeline(transaction=False)
        for key in meta_keys:
            pipe.hgetall(key)
        replies = _unless_unreachable(pipe.execute(raise_on_error=False))
    out: list[dict[str, str] | None] = []
    for reply in replies:
        if isinstance(reply, dict) and reply:
            out.append({_text(k): _text(v) for k, v in reply.items()})
        else:
            out.append(None)
    return out


def _unless_unreachable(replies: list[Any]) -> list[Any]:
    """The replies of a pipeline run with ``raise_on_error=False``, unless one says that
    Redis (a master, the cluster) is out of reach: then that error is raised."""
    for reply in replies:
        if isinstance(reply, _UNREACHABLE):
            raise reply
    return replies


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
    frontier.start_urls = meta.get("start_urls") or frontier.start_urls
    frontier.items = meta.get("items") or frontier.items
    frontier.pages_by_node = meta.get("pages_by_node") or frontier.pages_by_node
    for name in (frontier.stats, frontier.start_urls, frontier.items):
        keys.check_key(name)
    # these two carry the stats hash's name as their hash tag (one slot for the three)
    frontier.stats_applied = "{%s}:applied" % frontier.stats
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
    except _UNREACHABLE:
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
        states = pipe.execute()
    out = []
    for p, raw_state in enumerate(states):
        state = {_text(k): _text(v) for k, v in raw_state.items()}
        items = bits = bits_set = 0
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
        replies = _unless_unreachable(pipe.execute(raise_on_error=False))

    stats_reply, node_pages, start_urls, start_leased, items, ids, workers = replies[:7]
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
    state.stats_workers = _count(state, "stats workers", frontier.stats_applied, workers)
    if counted:
        _read_partitions(state, frontier, replies[7:])
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
    except _UNREACHABLE:
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
        except _UNREACHABLE:
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
