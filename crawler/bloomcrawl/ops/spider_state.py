"""What a snapshot knows of one spider: its filter, queue, leases and shared stats.

Plain records, filled in by :mod:`bloomcrawl.ops.inspection` and read by the
exporter (:mod:`bloomcrawl.ops.metrics`) and ``bloomcrawl status``. What could
not be read is a :class:`Problem` of the spider's, never an exception: one
spider's malformed keys must not hide the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bloomcrawl.core.bloom_info import BloomInfo
from bloomcrawl.core.politeness import PolitenessSummary


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
    #: ids of stored items remembered to store each once: those of the dedup window
    #: (``{<items>}:recent_ids``) and, from before ids expired, ``{<items>}:ids``
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
