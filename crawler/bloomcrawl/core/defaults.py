"""Every default value, in one place: the library, the Scrapy components, the tools."""

from __future__ import annotations

REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_SOCKET_CONNECT_TIMEOUT = 5.0
REDIS_SOCKET_TIMEOUT = 30.0
REDIS_HEALTH_CHECK_INTERVAL = 30
# a Redis whose maxmemory-policy evicts keys is refused unless this says the loss is accepted
REDIS_ALLOW_EVICTION = False
#: the environment variable naming a worker's node in ``<spider>:pages_by_node`` (default:
#: its host name, which is also scrapyd's default node_name); the local cluster sets it
#: per scrapyd node, all of which share one host
NODE_ENV = "BLOOMCRAWL_NODE"

# the Bloom filter (BLOOMFILTER_*)
FILTER_KEY = "%(spider)s:bloomfilter"
FILTER_CAPACITY = 100_000_000
FILTER_ERROR_RATE = 0.001
FILTER_PARTITIONS = 4
# on Redis Cluster, when BLOOMFILTER_PARTITIONS is not set: this many per master
CLUSTER_PARTITIONS_PER_MASTER = 8
FILTER_GROWTH = 2.0
FILTER_TIGHTENING = 0.4
FILTER_BACKEND = "auto"
# items the first slice of each partition of a new filter holds: memory follows the URLs
# seen, and BLOOMFILTER_CAPACITY is how many the filter holds before it tightens further
FILTER_INITIAL_CAPACITY = 256
# True: opening a filter stored with other sizing (capacity, error rate, growth...) is an
# error; False: the stored filter is used and what differed is logged
FILTER_STRICT_PARAMS = False
# BLOOMFILTER_REVISIT_AFTER: 0, a filter that never forgets; BLOOMFILTER_GENERATIONS: the
# generations a revisit window is kept in (an item is forgotten W to W (1 + 1/g) after)
FILTER_REVISIT_AFTER = 0
FILTER_GENERATIONS = 4
# the seeds' BLOOMFILTER_BIT / BLOOMFILTER_HASH_NUMBER when only one is set
SEEDS_BIT_EXPONENT = 30
SEEDS_HASHES = 6

# the frontier (SCHEDULER_*)
QUEUE_KEY = "%(spider)s:requests"
QUEUE_TYPE = "priority"
SCHEDULER_PERSIST = True
SCHEDULER_FLUSH_ON_START = False
LEASE_TIMEOUT = 30.0
REAP_INTERVAL = 5.0
MAX_IDLE_TIME_BEFORE_CLOSE = 0.0
PREFETCH = 1
SEEN_CACHE = 200_000
# a request the frontier cannot share is crawled by its worker (True: the spider closes)
FRONTIER_STRICT = False

# the other per-spider keys
START_URLS_KEY = "%(spider)s:start_urls"
ITEMS_KEY = "%(spider)s:items"
STATS_KEY = "%(spider)s:stats"

# the items pipeline
ITEMS_RETRY_TIMEOUT = 300.0
# an item's id is remembered this long (seconds): a page crawled again within it (its
# worker died before the ack) stores nothing twice; older ids are dropped
ITEMS_DEDUP_WINDOW = 7 * 24 * 3600.0
