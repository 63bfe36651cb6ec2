"""A cluster to run: its secrets, its recorded state, and how it runs.

:mod:`~bloomcrawl.ops.cluster.envfile` (``.env``), :mod:`~bloomcrawl.ops.cluster.state`
(``.run/cluster.json``), :mod:`~bloomcrawl.ops.cluster.compose` (docker-compose),
:mod:`~bloomcrawl.ops.cluster.local` (the same topology as local processes) and
:mod:`~bloomcrawl.ops.cluster.processes` (starting and stopping those processes;
the tests and the benchmarks use it too).
"""
