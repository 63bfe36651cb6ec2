"""What one scrape of the exporter reports: metric names, help texts and labels.

Pure functions from what :mod:`bloomcrawl.ops.inspection` read in Redis and
what the scrapyd nodes answered to fresh metric families; the collector in
:mod:`bloomcrawl.ops.exporter` does the reading, the logging and the locking.
Every family is labelled by ``spider``, ``node`` (``host:port``) or a fixed
set of values: no label takes a URL, a job id or an error message.

``bloomcrawl_domain_*`` are labelled by ``spider`` and ``domain`` (a host
name) for the busiest hosts of each spider only (the exporter's
``--top-domains``, most requests queued and in flight first), so their number
is bounded whatever the crawl reaches; the per-spider
``bloomcrawl_politeness_*`` gauges count every host.

``bloomcrawl_redis_node_*`` and ``bloomcrawl_filter_node_*`` are labelled by
the Redis master (``host:port``): each master of a Redis Cluster, or the one
Redis, so that dashboards read the same series either way; their number is
the number of masters (times spiders for the filter's).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bloomcrawl.core import keys
from bloomcrawl.core.bloom_info import BloomInfo
from bloomcrawl.core.politeness import DomainState, PolitenessSummary
from bloomcrawl.ops import inspection, scrapyd

#: Shared crawl stats (``<spider>:stats``, :data:`bloomcrawl.keys.STATS_FIELDS`) -> counters.
STATS_METRICS: dict[str, tuple[str, str]] = {
    "pages": ("bloomcrawl_pages_total",
              "Pages crawled (responses whose outcome is final), from the shared crawl stats."),
    "items": ("bloomcrawl_items_total", "Items scraped, from the shared crawl stats."),
    "filtered": ("bloomcrawl_requests_filtered_total",
                 "Requests the scheduler dropped as already seen, by the filter or by a"
                 " worker's own memory of what it sent, from the shared crawl stats."),
    "requeued": ("bloomcrawl_leases_requeued_total",
                 "Expired leases put back into the queue (their worker died or stalled)."),
    "errors": ("bloomcrawl_errors_total",
               "Requests that ended in an error, from the shared crawl stats."),
    "bad_start_urls": ("bloomcrawl_bad_start_urls_total",
                       "Malformed start-URL entries skipped."),
    "unserializable": ("bloomcrawl_unserializable_requests_total",
                       "Requests the frontier could not share, refused (FRONTIER_STRICT)."),
    "local": ("bloomcrawl_local_requests_total",
              "Requests the frontier could not share, crawled by the worker that made them."),
}
JOB_STATES = scrapyd.JOB_STATES
NODE_PAGES_METRIC = "bloomcrawl_node_pages_total"
READ_ERRORS_METRIC = "bloomcrawl_spider_read_errors"

# name, help, value of a filter; all labelled by spider
_FILTER_GAUGES: tuple[tuple[str, str, Callable[[BloomInfo], float]], ...] = (
    ("bloomcrawl_filter_capacity",
     "BLOOMFILTER_CAPACITY: items the filter holds before its new slices tighten (a floor,"
     " not an allocation: memory follows the items).",
     lambda f: f.capacity),
    ("bloomcrawl_filter_items", "Distinct items added to the filter.", lambda f: f.items),
    ("bloomcrawl_filter_bits", "Bits of all the filter's slices (allocated or not).",
     lambda f: f.bits),
    ("bloomcrawl_filter_bits_set", "Bits set, counted exactly as they are set.",
     lambda f: f.bits_set),
    ("bloomcrawl_filter_fill_ratio", "Bits set / bits.", lambda f: f.fill_ratio),
    ("bloomcrawl_filter_slices", "Slices of the fullest partition (1 until the filter grows).",
     lambda f: f.slices),
    ("bloomcrawl_filter_partitions", "Partitions (Redis Cluster slots) of filter and queue.",
     lambda f: f.partitions),
    ("bloomcrawl_filter_hashes", "Bits set per item in the first slice (k).",
     lambda f: f.hashes),
    ("bloomcrawl_filter_target_false_positive_ratio",
     "False-positive rate the filter was created for.", lambda f: f.error_rate),
    ("bloomcrawl_filter_estimated_false_positive_ratio",
     "False-positive rate estimated from each slice's items and size.",
     lambda f: f.estimated_false_positive_rate),
    ("bloomcrawl_filter_memory_bytes", "Bytes of filter bits Redis holds (allocated chunks).",
     lambda f: f.memory_bytes),
)
_FILTER_COUNTERS: tuple[tuple[str, str, Callable[[BloomInfo], float]], ...] = (
    ("bloomcrawl_filter_checked_total", "Fingerprints checked against the filter.",
     lambda f: f.checked),
    ("bloomcrawl_filter_duplicates_total",
     "Fingerprints the filter answered as already seen; a duplicate a worker knew it"
     " had sent never reaches the filter (see bloomcrawl_requests_filtered_total).",
     lambda f: f.filtered),
)
# name, help, value of one filter's partitions on one master; labelled by spider and node
_FILTER_NODE_GAUGES: tuple[tuple[str, str, Callable[[inspection.NodeFill], float]], ...] = (
    ("bloomcrawl_filter_node_partitions",
     "Partitions of the filter whose slot the Redis master (node) holds.",
     lambda n: n.partitions),
    ("bloomcrawl_filter_node_items", "Distinct items in the filter's partitions on the node.",
     lambda n: n.items),
    ("bloomcrawl_filter_node_bits", "Bits of the filter's partitions on the node.",
     lambda n: n.bits),
    ("bloomcrawl_filter_node_bits_set", "Bits set in the filter's partitions on the node.",
     lambda n: n.bits_set),
    ("bloomcrawl_filter_node_fill_ratio",
     "Bits set / bits of the filter's partitions on the node.", lambda n: n.fill_ratio),
)
_NodeValue = Callable[[inspection.RedisNode], int | None]
# name, help, value of one Redis master; labelled by node, left out while it is down
_REDIS_NODE_GAUGES: tuple[tuple[str, str, _NodeValue], ...] = (
    ("bloomcrawl_redis_node_memory_used_bytes", "used_memory of the Redis master (INFO memory).",
     lambda n: n.memory.used_bytes if n.memory else None),
    ("bloomcrawl_redis_node_memory_max_bytes",
     "maxmemory of the Redis master; 0 when unlimited.",
     lambda n: n.memory.max_bytes if n.memory else None),
    ("bloomcrawl_redis_node_keys", "Keys the Redis master holds (DBSIZE).", lambda n: n.keys),
)
_SpiderValue = Callable[[inspection.SpiderState], int | None]
_SPIDER_GAUGES: tuple[tuple[str, str, _SpiderValue], ...] = (
    ("bloomcrawl_queue_requests", "Requests waiting in the queue.", lambda s: s.queue_length),
    ("bloomcrawl_leased_requests", "Requests leased to a worker and not yet acked.",
     lambda s: s.leased),
    ("bloomcrawl_leases_expired", "Leases past their deadline, not yet requeued.",
     lambda s: s.leases_expired),
    ("bloomcrawl_start_urls", "Start-URL entries waiting to be read.", lambda s: s.start_urls),
    ("bloomcrawl_start_urls_leased",
     "Start-URL entries a worker took and has not queued yet; back in the list when their"
     " lease expires.", lambda s: s.start_urls_leased),
    ("bloomcrawl_stored_items", "Items waiting in the spider's Redis items list.",
     lambda s: s.items_stored),
    ("bloomcrawl_stored_item_ids",
     "Ids of stored items remembered so that each is stored once: those stored within"
     " REDIS_ITEMS_DEDUP_WINDOW (7 days), plus any set of before ids expired.",
     lambda s: s.item_ids),
    ("bloomcrawl_stats_workers",
     "Worker runs whose stats are recorded in {<spider>:stats}:applied (one field per run;"
     " cleared with the spider).", lambda s: s.stats_workers),
)
# name, help, value of a spider's politeness summary; labelled by spider
_POLITENESS_GAUGES: tuple[tuple[str, str, Callable[[PolitenessSummary], float]], ...] = (
    ("bloomcrawl_politeness_held_back_requests",
     "Requests queued whose host may not be fetched now: waiting for its delay, its"
     " concurrency or a back-off.", lambda p: p.held_back),
    ("bloomcrawl_politeness_hosts", "Hosts with queued requests.", lambda p: p.hosts),
)
# name, help, value of one of a spider's busiest hosts; labelled by spider and domain
_DOMAIN_GAUGES: tuple[tuple[str, str, Callable[[DomainState], float]], ...] = (
    ("bloomcrawl_domain_queued_requests",
     "Requests queued for the host (the spider's busiest hosts only).", lambda d: d.queued),
    ("bloomcrawl_domain_in_flight_requests",
     "Requests for the host leased to a worker and not yet acked (the spider's busiest"
     " hosts only).", lambda d: d.in_flight),
    ("bloomcrawl_domain_delay_seconds",
     "Seconds the host's next lease waits after its last, before jitter: the override or"
     " the default, raised by robots.txt Crawl-delay and AutoThrottle (the spider's busiest"
     " hosts only).", lambda d: d.delay),
    ("bloomcrawl_domain_concurrency",
     "Requests for the host allowed in flight at once across the cluster (the spider's"
     " busiest hosts only).", lambda d: d.concurrency),
)
_SPIDER_COUNTERS: tuple[tuple[str, str, _SpiderValue], ...] = (
    ("bloomcrawl_leases_total",
     "Requests leased to workers, from the partitions' lease counters; above"
     " bloomcrawl_pages_total by the leases that expired and were leased again.",
     lambda s: s.leases_total),
)


def redis_families(snap: inspection.RedisSnapshot) -> list[Metric]:
    """Redis's memory (in all and per master) and the number of filters found."""
    return [
        GaugeMetricFamily("bloomcrawl_redis_memory_used_bytes",
                          "Redis used_memory (INFO memory), summed over the masters of a"
                          " cluster.", value=snap.memory.used_bytes),
        GaugeMetricFamily("bloomcrawl_redis_memory_max_bytes",
                          "Redis maxmemory, summed over the masters of a cluster; 0 when"
                          " unlimited (on any master).", value=snap.memory.max_bytes),
        GaugeMetricFamily("bloomcrawl_spiders", "Spiders (Bloom filters) found in Redis.",
                          value=len(snap.spiders)),
        *redis_node_families(snap.nodes),
    ]


def redis_node_families(nodes: list[inspection.RedisNode]) -> list[Metric]:
    """Each Redis master's reachability, memory and keys (reported also while Redis,
    or one master of a cluster, is down)."""
    count = GaugeMetricFamily(
        "bloomcrawl_redis_nodes",
        "Redis servers holding the frontier: the masters of a cluster, else 1.",
        value=len(nodes))
    up = GaugeMetricFamily(
        "bloomcrawl_redis_node_up", "1 when the Redis master (node) answered INFO and DBSIZE"
        " this scrape, else 0.", labels=["node"])
    out: list[Metric] = [count, up]
    for node in nodes:
        up.add_metric([node.name], 1 if node.up else 0)
    for name, doc, node_value in _REDIS_NODE_GAUGES:
        metric = GaugeMetricFamily(name, doc, labels=["node"])
        for node in nodes:
            value = node_value(node)
            if value is not None:
                metric.add_metric([node.name], value)
        out.append(metric)
    return out


def spider_families(spiders: list[inspection.SpiderState]) -> list[Metric]:
    """Every spider's filter, frontier and shared stats, as far as each could be read.

    ``spiders`` holds each spider name once. A value that could not be read
    is left out rather than reported as 0 (a counter dropping to 0 reads as a
    reset, and a rate spike follows when it comes back).
    """
    info = GaugeMetricFamily(
        "bloomcrawl_spider_info",
        "Each spider's filter, queue type and filter backend (bitmap or redisbloom).",
        labels=["spider", "filter", "queue_type", "backend"])
    errors = GaugeMetricFamily(
        READ_ERRORS_METRIC,
        "Kinds of the spider's keys this scrape could not read (malformed filter parameters,"
        " a key of the wrong type, a counter that is not a number); 0 when all were read."
        " The exporter's log says which.", labels=["spider"])
    for state in spiders:
        info.add_metric([state.spider, state.filter_name, state.queue_type or "",
                         state.backend or ""], 1)
        errors.add_metric([state.spider], len({i.kind for i in state.issues if i.read_error}))
    out: list[Metric] = [info, errors]
    out += filter_node_families(spiders)
    out += politeness_families(spiders)
    with_filter = [(state, state.filter) for state in spiders if state.filter is not None]
    for family, filter_table in ((GaugeMetricFamily, _FILTER_GAUGES),
                                 (CounterMetricFamily, _FILTER_COUNTERS)):
        for name, doc, filter_value in filter_table:
            metric = family(name, doc, labels=["spider"])
            for state, bloom in with_filter:
                metric.add_metric([state.spider], filter_value(bloom))
            out.append(metric)
    for family, spider_table in ((GaugeMetricFamily, _SPIDER_GAUGES),
                                 (CounterMetricFamily, _SPIDER_COUNTERS)):
        for name, doc, spider_value in spider_table:
            metric = family(name, doc, labels=["spider"])
            for state in spiders:
                value = spider_value(state)
                if value is not None:
                    metric.add_metric([state.spider], value)
            out.append(metric)
    for stat in keys.STATS_FIELDS:
        name, doc = STATS_METRICS.get(
            stat, (f"bloomcrawl_{stat}_total", f"Shared crawl stat {stat!r}."))
        counter = CounterMetricFamily(name, doc, labels=["spider"])
        for state in spiders:
            if stat in state.stats:
                counter.add_metric([state.spider], state.stats[stat])
        out.append(counter)
    return out


def filter_node_families(spiders: list[inspection.SpiderState]) -> list[Metric]:
    """Each filter's partitions per Redis master, and its fullest partition's fill."""
    fullest = GaugeMetricFamily(
        "bloomcrawl_filter_max_partition_fill_ratio",
        "Bits set / bits of the filter's fullest partition (a hot partition shows here).",
        labels=["spider"])
    for state in spiders:
        if state.max_partition_fill_ratio is not None:
            fullest.add_metric([state.spider], state.max_partition_fill_ratio)
    out: list[Metric] = [fullest]
    by_node = [(state.spider, state.fill_by_node) for state in spiders]
    for name, doc, node_value in _FILTER_NODE_GAUGES:
        metric = GaugeMetricFamily(name, doc, labels=["spider", "node"])
        for spider, nodes in by_node:
            for node, fill in nodes.items():
                metric.add_metric([spider, node], node_value(fill))
        out.append(metric)
    return out


def politeness_families(spiders: list[inspection.SpiderState]) -> list[Metric]:
    """Each spider's hosts and held-back requests, and the state of its busiest hosts.

    A spider whose politeness state could not be read (or that has no queue)
    is left out of all of them.
    """
    summaries = [(state.spider, state.politeness) for state in spiders
                 if state.politeness is not None]
    out: list[Metric] = []
    for name, doc, summary_value in _POLITENESS_GAUGES:
        metric = GaugeMetricFamily(name, doc, labels=["spider"])
        for spider, summary in summaries:
            metric.add_metric([spider], summary_value(summary))
        out.append(metric)
    for name, doc, domain_value in _DOMAIN_GAUGES:
        metric = GaugeMetricFamily(name, doc, labels=["spider", "domain"])
        for spider, summary in summaries:
            for domain in summary.domains:
                metric.add_metric([spider, domain.host], domain_value(domain))
        out.append(metric)
    return out


def node_pages_family(spiders: list[inspection.SpiderState],
                      host_labels: dict[str, str]) -> Metric:
    """Pages per worker host, labelled by ``host_labels`` (host name -> node label)."""
    counter = CounterMetricFamily(
        NODE_PAGES_METRIC,
        "Pages crawled per worker host, from <spider>:pages_by_node; node is the scrapyd"
        " node's host:port when exactly one node reports that host name, else the host"
        " name.", labels=["spider", "node"])
    for state in spiders:
        pages: dict[str, int] = {}
        for host, count in state.pages_by_node.items():
            node = host_labels.get(host, host)
            pages[node] = pages.get(node, 0) + count
        for node, count in sorted(pages.items()):
            counter.add_metric([state.spider, node], count)
    return counter


def node_families(statuses: list[scrapyd.NodeStatus]) -> list[Metric]:
    """How many nodes, which answered, and their jobs by state."""
    nodes = GaugeMetricFamily(
        "bloomcrawl_scrapyd_nodes", "scrapyd nodes configured or resolved from DNS.",
        value=len(statuses))
    up = GaugeMetricFamily(
        "bloomcrawl_scrapyd_node_up", "1 when the node's daemonstatus.json answered.",
        labels=["node"])
    jobs = GaugeMetricFamily(
        "bloomcrawl_scrapyd_jobs", "Jobs on the node by state (scrapyd keeps the last"
        " finished_to_keep finished jobs).", labels=["node", "state"])
    for status in statuses:
        up.add_metric([status.node], 1 if status.up else 0)
        if status.up:
            for state in JOB_STATES:
                jobs.add_metric([status.node, state], getattr(status, state))
    return [nodes, up, jobs]
