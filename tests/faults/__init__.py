"""The fault suite: real redis-server, ``scrapy crawl site`` workers and the demo site.

:mod:`faults.proxy` is a TCP proxy between the workers and Redis that can
delay, stall, cut, reset or drop a reply after Redis applied the command;
:mod:`faults.harness` runs a crawl through it, injects a fault and measures
what the issue's invariants need; each ``test_*`` module is one scenario
(or a few close ones). ``bench/faults.py`` runs the same scenarios
(:mod:`faults.scenarios`) for bloomcrawl and plain scrapy-redis.
"""
