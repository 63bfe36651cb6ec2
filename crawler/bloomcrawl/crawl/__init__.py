"""The Scrapy integration: what a worker's crawl process runs (and the egg ships)."""
