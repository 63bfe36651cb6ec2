"""Redis key names and metadata format, in one place.

The scheduler, the dupefilter, the exporter and the CLI all build key names
here. A filter named ``NAME`` (by default ``<spider>:bloomfilter``) is:

``NAME:meta``
    a string holding the filter's parameters as JSON (:data:`FORMAT_VERSION`).
``{NAME:P}:state``
    hash of partition ``P``: slice plan, counters (items, bits_set, checked,
    filtered, per-slice items and bits set).
``{NAME:P}:s<S>:c<C>``
    bit chunk ``C`` of slice ``S`` of partition ``P`` (bitmap backend).
``{NAME:P}:rb``
    the partition's RedisBloom filter (redisbloom backend).
``{NAME:P}:call:<caller>``
    one dupefilter's last add call in the partition, its token and answer, for 10
    minutes: the call sent again after its reply was lost answers the same.

Everything of one partition, the scheduler's queue and leases included,
carries the hash tag ``{NAME:P}``, so one Lua call touches one Redis Cluster
slot.
"""

from __future__ import annotations

from bloomcrawl.core import defaults

FORMAT_VERSION = 1

META_SUFFIX = ":meta"
STATE_SUFFIX = ":state"


def spider_key(pattern: str, spider_name: str) -> str:
    """Expand a ``%(spider)s`` key pattern."""
    key = pattern % {"spider": spider_name}
    check_key(key)
    return key


def check_key(key: str) -> None:
    """Reject key names that would break hash-tag routing."""
    if not key:
        raise ValueError("Redis key name is empty")
    if "{" in key or "}" in key:
        raise ValueError(
            f"Redis key name {key!r} contains '{{' or '}}': bloomcrawl adds its own hash tags"
        )


def meta_key(name: str) -> str:
    return name + META_SUFFIX


def partition_tag(name: str, partition: int) -> str:
    """The hash tag shared by every key of one partition."""
    return "{%s:%d}" % (name, partition)


def state_key(name: str, partition: int) -> str:
    return partition_tag(name, partition) + STATE_SUFFIX


def call_record_key(name: str, partition: int, caller: str) -> str:
    """One caller's last add call in the partition: its token and answer (bloom_add.lua)."""
    return partition_tag(name, partition) + ":call:" + caller


def chunk_key(name: str, partition: int, slice_index: int, chunk: int) -> str:
    return "%s:s%d:c%d" % (partition_tag(name, partition), slice_index, chunk)


def redisbloom_key(name: str, partition: int) -> str:
    """The partition's RedisBloom scalable filter (redisbloom backend)."""
    return partition_tag(name, partition) + ":rb"


def _ring(window: int) -> str:
    """A ring's part of its generations' names: ":g" (the default window), ":w<i>g"."""
    return ":g" if not window else ":w%dg" % window


def generation_state_key(name: str, partition: int, generation: int, window: int = 0) -> str:
    """A revisit window's generation of a partition (bloom_window.lua); ``window`` 0 is
    BLOOMFILTER_REVISIT_AFTER's ring, i the i-th named window's (1-based)."""
    return "%s%s%d%s" % (partition_tag(name, partition), _ring(window), generation,
                         STATE_SUFFIX)


def generation_chunk_key(name: str, partition: int, generation: int, slice_index: int,
                         chunk: int, window: int = 0) -> str:
    return "%s%s%d:s%d:c%d" % (partition_tag(name, partition), _ring(window), generation,
                               slice_index, chunk)


def _escaped_tag(name: str, partition: int) -> str:
    """The partition's hash tag with its braces escaped for a SCAN pattern."""
    return partition_tag(name, partition).replace("{", "\\{").replace("}", "\\}")


def generation_pattern(name: str, partition: int, window: int | None = 0) -> str:
    """SCAN pattern matching every key of a partition's revisit-window generations: of
    one ring, or (``window`` None) of the named windows' rings."""
    return _escaped_tag(name, partition) + (":w*" if window is None else _ring(window) + "*")


def generations_field(window: int) -> str:
    """The partition state's field listing a ring's live generations."""
    return "gens" if not window else "gens:%d" % window


def call_record_pattern(name: str, partition: int) -> str:
    """SCAN pattern matching every caller's call record of a partition."""
    return _escaped_tag(name, partition) + ":call:*"


def chunk_pattern(name: str, partition: int) -> str:
    """SCAN pattern matching every bit chunk of a partition."""
    return _escaped_tag(name, partition) + ":s*:c*"


def queue_key(queue: str, filter_name: str, partition: int) -> str:
    """A partition of the request queue; it lives in the filter partition's slot."""
    return "%s:%s:queue" % (queue, partition_tag(filter_name, partition))


def politeness_key(queue: str, filter_name: str, partition: int, name: str) -> str:
    """One of the partition's per-host structures (see :class:`FrontierKeys`)."""
    return "%s:%s:%s" % (queue, partition_tag(filter_name, partition), name)


def lease_payloads_key(queue: str, filter_name: str, partition: int) -> str:
    return "%s:%s:leases" % (queue, partition_tag(filter_name, partition))


def lease_deadlines_key(queue: str, filter_name: str, partition: int) -> str:
    return "%s:%s:deadlines" % (queue, partition_tag(filter_name, partition))


def lease_counter_key(queue: str, filter_name: str, partition: int) -> str:
    """Numbers the partition's lease tokens (minted in Redis, so a resent call is safe)."""
    return "%s:%s:seq" % (queue, partition_tag(filter_name, partition))


def crawl_key(spider_name: str) -> str:
    """The id of the spider's crawl under way (see the key list above)."""
    return "%s:crawl" % spider_name


def item_ids_key(items_key: str) -> str:
    """The set of ids of items stored by earlier versions, which kept every id (same
    slot as the items list).

    Never added to any more: still read, so that what it holds stays stored once, and
    bounded by the dedup window: the first push that finds it without an expiry gives it
    one of one window (items_push.lua), after which each of its ids is older than the
    window.
    """
    return "{%s}:ids" % items_key


def recent_item_ids_key(items_key: str) -> str:
    """The zset of ids of the items stored within the dedup window, scored by when (ms)."""
    return "{%s}:recent_ids" % items_key


def item_calls_prefix(items_key: str) -> str:
    """What the records of each items pipeline's last call start with (same slot)."""
    return "{%s}:call:" % items_key


def item_call_key(items_key: str, caller: str) -> str:
    """One items pipeline's record of its last call: a call sent again answers what it
    did the first time (expires some minutes after the pipeline's last call)."""
    return item_calls_prefix(items_key) + caller


def filter_name_from_meta(key: str) -> str:
    return key[: -len(META_SUFFIX)]


# --- one spider's frontier ----------------------------------------------------
#
# The scheduler records, in the filter's meta hash, which spider uses the
# filter and where its other keys are, so the exporter and the CLI find
# everything from a SCAN for "*:meta" alone:
#
#   NAME:meta  fields  params (JSON), ready ("1"),
#                      spider, queue (the queue key), queue_type
#                      ("priority" | "fifo" | "lifo"), stats, start_urls, items
#
#   <queue>:{NAME:P}:h:<host>   the host's queue: zset (priority: score = -priority) or list
#   <queue>:{NAME:P}:ready      zset  host -> ms (Redis TIME) from when it may be leased;
#                               exactly the hosts with queued requests and a free slot
#   <queue>:{NAME:P}:depth      zset  host -> requests queued for it
#   <queue>:{NAME:P}:busy       hash  host -> requests leased (in flight)
#   <queue>:{NAME:P}:next       hash  host -> ms of its next allowed lease (last + delay)
#   <queue>:{NAME:P}:policy     hash  delay:<host>, conc:<host> (bloomcrawl throttle),
#                               sdelay:<host>, sconc:<host> (DOWNLOAD_SLOTS), robots:<host>
#                               (Crawl-delay), auto:<host> (AutoThrottle), until:<host>
#                               (back-off after 429/503); delays in ms
#   <queue>:{NAME:P}:queued     string  requests queued in the partition
#   <queue>:{NAME:P}:queue      the queue before per-host queues (moved into them on open)
#   <queue>:{NAME:P}:leases     hash  token -> "score|host|request JSON"
#   <queue>:{NAME:P}:deadlines  zset  token -> lease deadline, ms of Redis TIME
#   <queue>:{NAME:P}:seq        string  lease token counter
#   <queue>:{NAME:P}:requeued   hash  leases the partition's reaps requeued, counted by
#                               the reap itself (frontier_reap.lua): epoch (new each time
#                               the counter is made), n
#   <queue>:{NAME:P}:sent       zset  key of a dont_filter entry -> ms (Redis TIME) until
#                               which it is kept: queued once however often the exchange
#                               carrying it is sent (frontier_enqueue.lua)
#   <spider>:stats              hash  pages, items, filtered, requeued, errors,
#                                     bad_start_urls, unserializable, local (HINCRBY)
#   <spider>:crawl              hash  id: the crawl under way (crawl_id.lua): dont_filter start
#                                     requests go through the filter under it;
#                                     start_items:<crawl id>: the worker that took the
#                                     items start() yields in that crawl
#   {<spider>:stats}:applied    hash  worker -> number of its last exchange counted
#                                     (a resent exchange is counted once)
#   {<spider>:stats}:pages_by_node
#                               hash  hostname of the worker -> pages it crawled
#                               (both in the stats hash's slot: one script updates all three)
#   {<spider>:stats}:requeued   hash  "<requeued counter key>|<epoch>" -> the n last added
#                                     to the stats' requeued (frontier_requeued.lua): a reap
#                                     whose reply was lost is counted by the next, once
#   {<spider>:stats}:workers    zset  worker -> ms (Redis TIME) its presence lasts unrenewed:
#                                     the workers alive (frontier_workers.lua), renewed with
#                                     their leases; who is the last to close
#   <spider>:start_urls         list  URLs or JSON {"url", "meta", "priority"}
#   {<spider>:start_urls}:leases, :deadlines, :seq
#                               start URLs taken by a worker and not queued yet
#                               (same slot as the list: its name is their hash tag)
#   <spider>:items              list  items as JSON (scrapy-redis RedisPipeline)

STATS_FIELDS = (
    "pages",
    "items",
    "filtered",
    "requeued",
    "errors",
    "bad_start_urls",
    "unserializable",
    "local",
)


#: the per-partition politeness structures, in the order the scripts take them as KEYS
POLITE_KEY_NAMES = ("ready", "depth", "busy", "next", "policy", "queued")


class FrontierKeys:
    """Every key of one spider's frontier."""

    def __init__(
        self,
        spider: str,
        *,
        filter_pattern: str = defaults.FILTER_KEY,
        queue_pattern: str = defaults.QUEUE_KEY,
        partitions: int = 1,
    ) -> None:
        self.spider = spider
        self.filter = spider_key(filter_pattern, spider)
        self.queue = spider_key(queue_pattern, spider)
        self.stats = spider_key(defaults.STATS_KEY, spider)
        # the stats script touches all three: one hash tag, one Redis Cluster slot
        # (``S:stats`` hashes as a whole, ``{S:stats}:...`` by its tag: the same slot)
        self.stats_applied = "{%s}:applied" % self.stats
        self.pages_by_node = "{%s}:pages_by_node" % self.stats
        self.workers = "{%s}:workers" % self.stats
        self.requeued_added = "{%s}:requeued" % self.stats
        self.use_start_urls(spider_key(defaults.START_URLS_KEY, spider))
        self.items = spider_key(defaults.ITEMS_KEY, spider)
        self.item_ids = item_ids_key(self.items)
        self.recent_item_ids = recent_item_ids_key(self.items)
        self.meta = meta_key(self.filter)
        self.partitions = partitions

    def use_start_urls(self, name: str) -> None:
        """Read start URLs from the list ``name`` (a scrapy-redis spider's ``redis_key``);
        its leases' keys take its name as their hash tag (the list's slot)."""
        self.start_urls = name
        tag = "{%s}" % name
        self.start_leases = tag + ":leases"
        self.start_deadlines = tag + ":deadlines"
        self.start_counter = tag + ":seq"

    def queue_part(self, partition: int) -> str:
        """The partition's single queue of before per-host queues (moved on open)."""
        return queue_key(self.queue, self.filter, partition)

    def polite(self, partition: int, name: str) -> str:
        """``ready``, ``depth``, ``busy``, ``next``, ``policy`` or ``queued`` of a partition."""
        return politeness_key(self.queue, self.filter, partition, name)

    def host_queue_prefix(self, partition: int) -> str:
        """``<prefix><host>`` is a host's queue in the partition (same slot)."""
        return politeness_key(self.queue, self.filter, partition, "h:")

    def host_queue(self, partition: int, host: str) -> str:
        return self.host_queue_prefix(partition) + host

    def polite_keys(self, partition: int) -> list[str]:
        """The KEYS of every politeness script: ready, depth, busy, next, policy, queued."""
        return [self.polite(partition, n) for n in POLITE_KEY_NAMES]

    def leases(self, partition: int) -> str:
        return lease_payloads_key(self.queue, self.filter, partition)

    def deadlines(self, partition: int) -> str:
        return lease_deadlines_key(self.queue, self.filter, partition)

    def lease_counter(self, partition: int) -> str:
        return lease_counter_key(self.queue, self.filter, partition)

    def sent(self, partition: int) -> str:
        """The partition's dont_filter entries queued in the last minutes (an exchange
        sent again queues them once)."""
        return politeness_key(self.queue, self.filter, partition, "sent")

    def requeued(self, partition: int) -> str:
        """How many leases the partition's reaps put back, counted as they did."""
        return politeness_key(self.queue, self.filter, partition, "requeued")

    def state(self, partition: int) -> str:
        return state_key(self.filter, partition)
