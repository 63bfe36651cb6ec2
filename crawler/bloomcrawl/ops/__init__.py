"""Operations: never in a worker's egg.

* :mod:`~bloomcrawl.ops.cli`: the ``bloomcrawl`` command, one module per job
* :mod:`~bloomcrawl.ops.cluster`: the cluster it runs (``.env``, its recorded
  state, docker-compose, local processes and the process manager)
* :mod:`~bloomcrawl.ops.scrapyd`: the one scrapyd client
* :mod:`~bloomcrawl.ops.inspection`: a read-only view of the cluster's Redis
* :mod:`~bloomcrawl.ops.exporter`: the Prometheus exporter; :mod:`~bloomcrawl.ops.metrics`:
  what it reports (names, help texts, labels)
* :mod:`~bloomcrawl.ops.demo_site`: the demo website (needs the ``demo`` extra: aiohttp)
* :mod:`~bloomcrawl.ops.console`, :mod:`~bloomcrawl.ops.noproxy`: what a command
  prints and its one-line error; HTTP to the cluster's own services
"""
