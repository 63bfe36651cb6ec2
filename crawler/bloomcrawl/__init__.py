"""bloomcrawl: a distributed Scrapy crawl cluster on Redis.

Three layers, each importing only the ones above it in this list:

:mod:`bloomcrawl.core`
    the library: the Bloom filter and the leased frontier protocol in Redis,
    key names, defaults, errors. No Scrapy import.
:mod:`bloomcrawl.crawl`
    the Scrapy integration a worker runs: scheduler, dupefilter, middleware,
    pipelines, the project's settings and spiders. With ``core``, this is
    what scrapyd-deploy ships in a worker's egg.
:mod:`bloomcrawl.ops`
    operations, never in a worker's egg: the ``bloomcrawl`` CLI, the
    Prometheus exporter, cluster inspection, the demo website.
"""

__version__ = "0.1.0"
