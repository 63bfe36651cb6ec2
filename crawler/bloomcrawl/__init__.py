"""bloomcrawl: a distributed Scrapy crawl cluster on Redis.

An exact, leased Redis frontier (:mod:`bloomcrawl.scheduler`) and a scalable
blocked Bloom-filter duplicate filter (:mod:`bloomcrawl.bloom`,
:mod:`bloomcrawl.dupefilter`), packaged for scrapyd, watched by one
Prometheus exporter (:mod:`bloomcrawl.exporter`).
"""

__version__ = "0.1.0"
