"""Bench-only Scrapy glue for ``bench/crawl.py`` and ``bench/worker_kill.py``.

* :mod:`crawlbench.settings`: the project's settings plus the probes below;
  each contender's scheduler and dupefilter are set on the command line.
* :mod:`crawlbench.probe`: a count of every redis-py connection's round trips, an
  extension writing per-worker numbers to a JSON file, and the idle poller
  the scrapy-redis contenders need to stay open while another worker fills
  the shared queue.
* :mod:`crawlbench.spiders`: the project's ``site`` spider, started from a
  spider argument for the schedulers that do not read ``site:start_urls``.
"""
