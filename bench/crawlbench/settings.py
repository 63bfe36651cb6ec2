"""The bloomcrawl project's settings, plus what the crawl benchmarks measure with.

``SCRAPY_SETTINGS_MODULE=crawlbench.settings``; each contender overrides
SCHEDULER, DUPEFILTER_CLASS and the middlewares with ``-s`` (see
``bench/crawl.py``). Only objects that ``-s`` cannot carry live here.
"""

import os

from bloomcrawl.crawl.settings import *  # noqa: F403
from crawlbench.probe import RoundTrips

# every Redis connection of the worker counts its round trips (plain Redis and Redis Cluster)
RoundTrips.install()

# the scrapy-redis contenders add crawlbench.probe.IdlePoll (see bench/_crawl.py)
EXTENSIONS = {"crawlbench.probe.Probe": 0}

LOG_LEVEL = "INFO"
REMOTE_CONTROL_ENABLED = False
TELNETCONSOLE_ENABLED = False
ROBOTSTXT_OBEY = False
ITEM_PIPELINES = {}  # the bench sets them per run (--items)

# bench/crawl.py --pin-workers: the CPUs this worker runs on (its threads start later and
# inherit them)
_cpus = os.environ.get("BENCH_WORKER_CPUS")
if _cpus:
    os.sched_setaffinity(0, {int(c) for c in _cpus.split(",")})
