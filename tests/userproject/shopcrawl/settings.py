"""A user's project settings, plus the lines bloomcrawl's README says to add."""

import os

BOT_NAME = "shopcrawl"
SPIDER_MODULES = ["shopcrawl.spiders"]
NEWSPIDER_MODULE = "shopcrawl.spiders"
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False

# -- bloomcrawl (README, "Your own project") --
SCHEDULER = "bloomcrawl.crawl.scheduler.Scheduler"
DUPEFILTER_CLASS = "bloomcrawl.crawl.dupefilter.RedisBloomDupeFilter"
SPIDER_MIDDLEWARES = {"bloomcrawl.crawl.middleware.FrontierSpiderMiddleware": 10}
DOWNLOADER_MIDDLEWARES = {"bloomcrawl.crawl.middleware.FrontierDownloaderMiddleware": 10}
ITEM_PIPELINES = {"bloomcrawl.crawl.pipelines.RedisItemsPipeline": 300}
# the cluster gives its workers REDIS_URL (with its password) in their environment
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
BLOOMFILTER_CAPACITY = 100_000

SPIDER_CONTRACTS = {"shopcrawl.contracts.ShopUrlContract": 10}
