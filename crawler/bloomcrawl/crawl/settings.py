"""Settings of the bloomcrawl Scrapy project (``scrapy crawl site`` from crawler/).

Every setting can be overridden on the command line (``-s NAME=VALUE``) or,
under scrapyd, per job. REDIS_URL also comes from the environment.
"""

from __future__ import annotations

import os

from bloomcrawl.core import defaults

BOT_NAME = "bloomcrawl"
SPIDER_MODULES = ["bloomcrawl.crawl.spiders"]
NEWSPIDER_MODULE = "bloomcrawl.crawl.spiders"

REDIS_URL = os.environ.get("REDIS_URL", defaults.REDIS_URL)

SCHEDULER = "bloomcrawl.crawl.scheduler.Scheduler"
DUPEFILTER_CLASS = "bloomcrawl.crawl.dupefilter.RedisBloomDupeFilter"
SCHEDULER_PERSIST = True
SCHEDULER_LEASE_TIMEOUT = defaults.LEASE_TIMEOUT
MAX_IDLE_TIME_BEFORE_CLOSE = int(os.environ.get("MAX_IDLE_TIME_BEFORE_CLOSE", "0"))

BLOOMFILTER_CAPACITY = 100_000_000
BLOOMFILTER_ERROR_RATE = 0.001

SPIDER_MIDDLEWARES = {"bloomcrawl.crawl.middleware.FrontierSpiderMiddleware": 10}
DOWNLOADER_MIDDLEWARES = {"bloomcrawl.crawl.middleware.FrontierDownloaderMiddleware": 10}
ITEM_PIPELINES = {"bloomcrawl.crawl.pipelines.RedisItemsPipeline": 300}

ROBOTSTXT_OBEY = True
CONCURRENT_REQUESTS = 16
CONCURRENT_ITEMS = 8
TELNETCONSOLE_ENABLED = False
USER_AGENT = "bloomcrawl (+https://github.com/bloomcrawl/bloomcrawl)"
