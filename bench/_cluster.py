"""A Redis Cluster for the benchmarks: the tests' fixture, also with 1 or 2 masters.

:class:`BenchCluster` is the test kit's :class:`kit.cluster.RedisClusterProcesses`
(nodes on free 127.0.0.1 ports, each started and stopped by pid, waits
bounded), with no replicas by default: a benchmark measures the masters'
work, and a replica would only add the replication stream's CPU to the same
two cores.

``redis-cli --cluster create`` refuses fewer than 3 masters, so with 1 or 2
the slots are assigned by hand (``CLUSTER ADDSLOTSRANGE``, ``CLUSTER MEET``
with the node's own bus port), the way redis-cli does it; then the fixture's
own wait for a settled cluster runs. Nothing here prints.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "crawler"), str(ROOT / "tests")]  # bloomcrawl and the test kit

from kit.cluster import HOST, SLOTS, RedisClusterProcesses  # noqa: E402

__all__ = ["BenchCluster"]

#: below this many masters, redis-cli --cluster create refuses to build a cluster
CLI_MIN_MASTERS = 3


class BenchCluster(RedisClusterProcesses):
    """``masters`` masters (no replicas unless asked) on 127.0.0.1; use as a context manager."""

    def __init__(self, workdir: Path, *, masters: int, replicas: int = 0, **kwargs: Any) -> None:
        super().__init__(workdir, masters=masters, replicas=replicas, **kwargs)

    def start(self) -> BenchCluster:
        if self.n_masters >= CLI_MIN_MASTERS or self.n_replicas:
            super().start()
            return self
        taken: set[int] = set()
        try:
            for _ in range(self.n_masters):
                node = self._start_node(taken)
                self.nodes[node.port] = node
            ports = self.ports
            for i, port in enumerate(ports):
                # distinct epochs, as redis-cli sets them: no collision to resolve
                self._call(port, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                first = i * SLOTS // len(ports)
                last = (i + 1) * SLOTS // len(ports) - 1
                self._call(port, "CLUSTER", "ADDSLOTSRANGE", first, last)
            if len(ports) > 1:
                bus_port = self._bus_port(ports[0])
                for port in ports[1:]:
                    self._call(port, "CLUSTER", "MEET", HOST, ports[0], bus_port)
            self.wait_settled()
        except BaseException:
            self.stop()
            raise
        return self

    def _bus_port(self, port: int) -> int:
        """The cluster bus port of node ``port`` (``--cluster-port``, never port + 10000 here)."""
        text = self._call(port, "CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else text
        for line in text.splitlines():
            if "myself" in line.split()[2]:
                return int(line.split()[1].split("@")[1].split(",")[0])
        raise RuntimeError("node %d does not list itself in CLUSTER NODES" % port)

    @property
    def master_ports(self) -> list[int]:
        """The masters' ports, as started (no failover happens in a benchmark)."""
        return self.ports[:self.n_masters]

    def __enter__(self) -> BenchCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
