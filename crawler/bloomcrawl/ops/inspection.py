"""A read-only snapshot of the cluster's Redis: every spider's filter, queue and stats.

The exporter and the ``bloomcrawl status`` command both read Redis through
this module (and the scrapyd nodes through :mod:`bloomcrawl.ops.scrapyd`).
Everything here only reads: spiders are found by ``SCAN MATCH *:meta`` (never
``KEYS``), each filter's fill comes from its exact counters (never
``BITCOUNT``), and every Redis command issued is O(1), O(partitions x slices)
or O(worker hosts), so a snapshot never blocks Redis, however large the
filter. Key names come from :mod:`bloomcrawl.core.keys`.

One spider's malformed keys (a meta hash whose parameters are not JSON, a
key of the wrong type, a counter that is not a number) never hide the
others: what cannot be read is left out of that spider's state and recorded
as a :class:`Problem`; only Redis being unreachable fails a whole snapshot
(:class:`~bloomcrawl.core.errors.RedisUnavailableError`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.bloom import BloomFilter, BloomInfo
from bloomcrawl.core.connection import redis_errors
from bloomcrawl.core.errors import BloomFilterError, RedisUnavailableError
from bloomcrawl.core.sizing import FilterParams

logger = logging.getLogger(__name__)

META_PATTERN = "*" + keys.META_SUFFIX
SCAN_COUNT = 1000
#: Upper bound on SCAN calls in one snapshot (about ten million keys).
MAX_SCAN_CALLS = 10_000
QUEUE_TYPES = ("priority", "fifo", "lifo")
#: Worker hosts reported per spider at most (those with the most pages): a label bound.
MAX_NODES_PER_SPIDER = 256

_FILTER_PREFIX, _FILTER_SUFFIX = defaults.FILTER_KEY.split("%(spider)s")
#: what means Redis itself is gone (the whole snapshot fails), not one spider's keys
_UNREACHABLE = (RedisUnavailableError, redis.ConnectionError, redis.TimeoutError)


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
    issues: list[Problem] = field(default_factory=list)

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
class RedisSnapshot:
    """What one pass over Redis found."""

    spiders: list[SpiderState]
    memory: RedisMemory
    redis_time_ms: int


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
    """Names of every filter meta hash, by ``SCAN`` (sorted, duplicates removed)."""
    found: set[str] = set()
    cursor = 0
    with redis_errors(client):
        for _ in range(MAX_SCAN_CALLS):
            cursor, batch = client.scan(cursor, match=META_PATTERN, count=SCAN_COUNT)
            for raw in batch:
                name = _text(raw)
                # partition keys carry hash tags; a filter name never does
                if "{" not in name and "}" not in name:
                    found.add(name)
            if int(cursor) == 0:
                break
        else:
            logger.warning(
                "SCAN for %r stopped after %d calls; some spiders may be missing",
                META_PATTERN, MAX_SCAN_CALLS,
            )
    return sorted(found)


def redis_time_ms(client: redis.Redis) -> int:
    """Redis's clock in milliseconds (lease deadlines use it)."""
    with redis_errors(client):
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def redis_memory(client: redis.Redis) -> RedisMemory:
    """``used_memory``, ``maxmemory`` and ``used_memory_peak`` from ``INFO memory``."""
    with redis_errors(client):
        info = client.info("memory")
    return RedisMemory(
        used_bytes=_int(info.get("used_memory")),
        max_bytes=_int(info.get("maxmemory")),
        peak_bytes=_int(info.get("used_memory_peak")),
    )


def _read_meta(client: redis.Redis, meta_keys: Sequence[str]) -> list[dict[str, str] | None]:
    """Each meta hash as text, ``None`` where it is gone or is not a hash."""
    if not meta_keys:
        return []
    with redis_errors(client):
        pipe = client.pipeline(transaction=False)
        for key in meta_keys:
            pipe.hgetall(key)
        replies = pipe.execute(raise_on_error=False)
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
    except _UNREACHABLE:
        raise
    except (BloomFilterError, redis.RedisError, ArithmeticError, LookupError, ValueError,
            TypeError) as exc:  # WRONGTYPE, or counters that are not numbers
        state.unreadable("filter counters", f"filter counters unreadable: {exc}")
    return params


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
    client: redis.Redis, meta_key: str, meta: dict[str, str], now_ms: int
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

    with redis_errors(client):
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
        replies = pipe.execute(raise_on_error=False)

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
    return state


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


def spider_states(client: redis.Redis, meta_keys: Iterable[str]) -> list[SpiderState]:
    """The state of each filter named by its meta key; vanished ones are left out.

    Whatever one filter's keys hold, its state is returned with what could be
    read; only an unreachable Redis raises.
    """
    names = list(meta_keys)
    metas = _read_meta(client, names)
    now_ms = redis_time_ms(client) if names else 0
    out = []
    for meta_key, meta in zip(names, metas, strict=True):
        if meta is None or "params" not in meta:
            continue  # deleted meanwhile, or some other application's key
        try:
            out.append(_state_from_meta(client, meta_key, meta, now_ms))
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


def find_spiders(client: redis.Redis) -> list[SpiderState]:
    """Every spider with a Bloom filter in this Redis, sorted by filter name.

    Raises :class:`bloomcrawl.core.errors.RedisUnavailableError` when Redis cannot
    be reached.
    """
    return spider_states(client, find_meta_keys(client))


def snapshot(client: redis.Redis) -> RedisSnapshot:
    """Memory, clock and every spider's state, in one pass."""
    memory = redis_memory(client)
    spiders = find_spiders(client)
    return RedisSnapshot(spiders=spiders, memory=memory, redis_time_ms=redis_time_ms(client))
