"""The test kit: one of each thing the tests and the benchmarks start, wait for or check.

* :mod:`kit.wait`: :func:`~kit.wait.wait_until`, the one polling loop;
* :mod:`kit.redis`: :class:`~kit.redis.RedisServer`, a redis-server started by the
  project's process manager (:func:`bloomcrawl.ops.cluster.processes.start_redis`),
  and :class:`~kit.redis.ClosingRedis`;
* :mod:`kit.cluster`: :class:`~kit.cluster.RedisClusterProcesses`, a Redis Cluster of
  such servers;
* :mod:`kit.workers`: :class:`~kit.workers.Worker`, the one ``scrapy crawl`` launcher,
  and :class:`~kit.workers.WorkerPool`, which stops every worker it started;
* :mod:`kit.scrapyd`: :class:`~kit.scrapyd.ScrapydNode`, one scrapyd process;
* :mod:`kit.web`: :func:`~kit.web.fetch`, one HTTP request to a site on 127.0.0.1;
* :mod:`kit.cli`: :func:`~kit.cli.run_cli`, ``bloomcrawl`` in-process, and
  :func:`~kit.cli.run_cli_process` where a test needs the real process;
* :mod:`kit.checks`: what a crawl left behind, and the exactly-once checks;
* :mod:`kit.data`: fingerprints, filters and frontiers written as the scheduler lays
  them out;
* :mod:`kit.fixtures`: the pytest fixtures over all of these, registered by
  ``tests/conftest.py`` with ``pytest_plugins``.

Nothing here imports pytest but :mod:`kit.fixtures`: the benchmarks (``bench/``) use
the same modules. Every process is started and stopped by pid, never found by name.
"""

from __future__ import annotations

from pathlib import Path

#: the checkout
ROOT = Path(__file__).resolve().parents[2]
#: the Scrapy project (its scrapy.cfg) and the ``bloomcrawl`` package
CRAWLER = ROOT / "crawler"
#: the tests' own import directory (``kit``, ``faults``, ``testspiders``)
TESTS = ROOT / "tests"
