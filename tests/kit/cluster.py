"""A real Redis Cluster for the tests: 3 masters with 1 replica each, on free 127.0.0.1 ports.

:class:`RedisClusterProcesses` starts six ``redis-server --cluster-enabled yes``
processes (each a :class:`kit.redis.RedisServer`, so it keeps its port,
data directory and ``nodes-<port>.conf`` across a restart and is signalled by
pid only), joins them with ``redis-cli --cluster create`` and waits until every
live node reports ``cluster_state:ok`` and all of them agree on the slot map and
on who replicates whom. Every wait is bounded; on timeout the error carries
``redis-cli --cluster check`` output, which says which node disagrees.

Topology changes the tests need are real ones: :meth:`kill_master` (SIGKILL,
then the replica's automatic failover), :meth:`failover` (a manual ``CLUSTER
FAILOVER``), :meth:`migrate_slots` (``redis-cli --cluster reshard``) and
:meth:`migrate_slot_of_key` (the IMPORTING/MIGRATING/MIGRATE/SETSLOT NODE
protocol for one slot), so clients see the MOVED and ASK redirections they
would see in production.

The fixtures (:mod:`kit.fixtures`): ``redis_cluster`` is one cluster for the
session; ``clean_cluster`` is that cluster emptied and healthy again (dead
nodes restarted); ``private_cluster`` is a fresh cluster for one destructive
test. ``bench/scale.py`` builds its clusters of 1 to 3 masters on this class.
A missing redis-server or redis-cli is an error, not a skip: ``make test``
installs them.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from bloomcrawl.ops.cluster.processes import free_port

from kit.redis import ClosingRedis, RedisServer
from kit.wait import WaitTimeout, wait_until

HOST = "127.0.0.1"
SLOTS = 16384
#: ``--cluster-node-timeout``: 2 s lets a killed master fail over in about 4-5 s
NODE_TIMEOUT_MS = 2000
#: seconds any wait for the cluster to settle may take
WAIT_TIMEOUT_S = 30.0
#: seconds a ``redis-cli --cluster ...`` command may take
CLI_TIMEOUT_S = 120.0
POLL_S = 0.05
#: keys per CLUSTER GETKEYSINSLOT / MIGRATE batch in :meth:`migrate_slot_of_key`
MIGRATE_BATCH = 100
START_ATTEMPTS = 3

_FAIL_FLAGS = {"fail", "fail?", "handshake", "noaddr"}


class ClusterError(RuntimeError):
    """The cluster did not reach the state a method waits for; the message says why."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ClusterError("%s is not installed; `make test` installs it" % name)
    return path


@dataclass(frozen=True)
class NodeView:
    """What one node says about the cluster (CLUSTER NODES), with its own flags removed.

    PFAIL (``fail?``) is a node's private suspicion, so it is kept: two views
    only agree once the suspicion became a cluster-wide FAIL or went away.
    """

    #: port -> (node id, "master"/"slave", master's port or None, flags that say it is down)
    nodes: dict[int, tuple[str, str, int | None, frozenset[str]]]
    #: (first slot, last slot, owner's port), sorted
    slots: tuple[tuple[int, int, int], ...]
    #: slots some node is importing or migrating: "[slot->-id]" / "[slot-<-id]"
    open_slots: tuple[str, ...] = field(default=())

    def agreement_key(self) -> tuple[Any, ...]:
        return tuple(sorted(self.nodes.items())), self.slots


def _parse_nodes(text: str) -> NodeView:
    lines = [line.split() for line in text.splitlines() if line.strip()]
    port_of: dict[str, int] = {}
    for parts in lines:
        # 127.0.0.1:7000@17000[,hostname]
        port_of[parts[0]] = int(parts[1].split("@")[0].rsplit(":", 1)[1])
    nodes: dict[int, tuple[str, str, int | None, frozenset[str]]] = {}
    slots: list[tuple[int, int, int]] = []
    open_slots: list[str] = []
    for parts in lines:
        node_id, flags = parts[0], set(parts[2].split(","))
        port = port_of[node_id]
        role = "master" if "master" in flags else "slave"
        master = port_of.get(parts[3]) if parts[3] != "-" else None
        nodes[port] = (node_id, role, master, frozenset(flags & _FAIL_FLAGS))
        for item in parts[8:]:
            if item.startswith("["):
                open_slots.append(item)
            elif "-" in item:
                first, last = item.split("-")
                slots.append((int(first), int(last), port))
            else:
                slots.append((int(item), int(item), port))
    return NodeView(nodes, tuple(sorted(slots)), tuple(sorted(open_slots)))


class RedisClusterProcesses:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each, owned by the caller.

    ``extra_args`` go on every node's command line (``["--loadmodule", path]``);
    ``appendonly`` turns AOF on (``appendfsync always``) so a restarted node
    keeps its acknowledged writes. Each node gets an explicit ``--cluster-port``
    on a free port, so no bus port is ever ``port + 10000`` beyond 65535 or
    taken by someone else.
    """

    def __init__(self, workdir: Path, *, masters: int = 3, replicas: int = 1,
                 node_timeout_ms: int = NODE_TIMEOUT_MS, appendonly: bool = False,
                 extra_args: list[str] | None = None, timeout: float = WAIT_TIMEOUT_S) -> None:
        self.redis_cli = _binary("redis-cli")
        _binary("redis-server")
        self.workdir = workdir
        self.n_masters = masters
        self.n_replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.appendonly = appendonly
        self.extra_args = list(extra_args or [])
        self.timeout = timeout
        self.nodes: dict[int, RedisServer] = {}
        #: every pid this object started, for a test to check none is left running
        self.pids: list[int] = []
        #: port -> node id; ids live in nodes-<port>.conf, so they survive a restart
        self._ids: dict[int, str] = {}
        #: the last view every node agreed on (used to find a dead master's replica)
        self._settled: NodeView | None = None
        #: the clients cluster_client() made, closed by close_clients()
        self._clients: list[RedisCluster] = []
        workdir.mkdir(parents=True, exist_ok=True)

    # --- processes ------------------------------------------------------------------

    def _node_args(self, port: int, bus_port: int) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.workdir / ("nodes-%d.conf" % port)),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-port", str(bus_port),
            # diskless full sync starts after 5 s by default: a replica would lag that long
            "--repl-diskless-sync-delay", "0",
            *self.extra_args,
        ]

    def _start_node(self, taken: set[int]) -> RedisServer:
        """Start one node on free ports; on a lost race for a port, again on other ones."""
        error: Exception | None = None
        for _ in range(START_ATTEMPTS):
            port = bus_port = 0
            while port in taken or bus_port in taken or port == bus_port:
                port, bus_port = free_port(), free_port()
            node = RedisServer(self.workdir / str(port), port=port, appendonly=self.appendonly,
                               extra_args=self._node_args(port, bus_port))
            try:
                node.start()
            except RuntimeError as exc:
                error = exc
                continue
            taken.update((port, bus_port))
            self.pids.append(node.pid)
            return node
        raise ClusterError("redis-server did not start in %d attempts: %s"
                           % (START_ATTEMPTS, error))

    def start(self) -> RedisClusterProcesses:
        """Start the nodes, create the cluster, wait until it is settled; stop all on failure."""
        taken: set[int] = set()
        try:
            for _ in range(self.n_masters * (1 + self.n_replicas)):
                node = self._start_node(taken)
                self.nodes[node.port] = node
            # with one IP, redis-cli makes the first `masters` nodes the masters
            self._cli("create", *("%s:%d" % (HOST, p) for p in self.ports),
                      "--cluster-replicas", str(self.n_replicas), "--cluster-yes")
            self.wait_settled()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM every node still running (all at once), SIGKILL any that outlive the wait."""
        self.close_clients()
        for node in self.nodes.values():
            node.send_signal(signal.SIGCONT)
            node.send_signal(signal.SIGTERM)
        for node in self.nodes.values():
            node.stop()  # waits, then SIGKILL; a no-op for a node already gone

    def running(self, port: int) -> bool:
        return self.nodes[port].running()

    # --- addresses and clients ------------------------------------------------------

    @property
    def ports(self) -> list[int]:
        """Every node's port, in start order (the first ``masters`` were the first masters)."""
        return list(self.nodes)

    @property
    def live_ports(self) -> list[int]:
        return [p for p in self.nodes if self.running(p)]

    @property
    def startup_url(self) -> str:
        """``redis+cluster://`` URL of the first masters (startup nodes; any live one will do)."""
        return "redis+cluster://" + ",".join(
            "%s:%d" % (HOST, p) for p in self.ports[:self.n_masters])

    def node_client(self, port: int, **kwargs: Any) -> redis.Redis:
        """A plain client of one node: no redirections followed; close() closes its sockets."""
        kwargs.setdefault("socket_timeout", 10)
        return ClosingRedis(host=HOST, port=port, **kwargs)

    def cluster_client(self, **kwargs: Any) -> RedisCluster:
        """A ``redis.cluster.RedisCluster`` started from a live master, for test assertions.

        The fixtures close it when the test ends (:meth:`close_clients`).
        """
        kwargs.setdefault("socket_timeout", 10)
        client = RedisCluster(host=HOST, port=self.masters()[0], **kwargs)
        self._clients.append(client)
        return client

    def close_clients(self) -> None:
        """Close the sockets of every cluster_client().

        A RedisCluster sits in reference cycles, and redis-py 5.0.0's close() leaves
        its sockets open: the garbage collector would close them, maybe finalizing a
        socket before its connection (a ResourceWarning, an error in the tests).
        """
        while self._clients:
            client = self._clients.pop()
            client.close()
            client.disconnect_connection_pools()

    def _call(self, port: int, *args: Any) -> Any:
        client = self.node_client(port)
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    def _info(self, port: int, section: str) -> dict[str, Any]:
        client = self.node_client(port)
        try:
            return client.info(section)
        finally:
            client.close()

    # --- topology -------------------------------------------------------------------

    def view(self, port: int | None = None) -> NodeView:
        """CLUSTER NODES as node ``port`` (by default the first live node) sees it."""
        if port is None:
            port = self.live_ports[0]
        text = self._call(port, "CLUSTER", "NODES")
        view = _parse_nodes(text.decode() if isinstance(text, bytes) else text)
        self._ids.update({p: entry[0] for p, entry in view.nodes.items()})
        return view

    def node_id(self, port: int) -> str:
        if port not in self._ids:
            self.view()
        return self._ids[port]

    def masters(self) -> list[int]:
        """Ports of the masters that are up, as a live node sees them now."""
        return sorted(p for p, (_, role, _, down) in self.view().nodes.items()
                      if role == "master" and not down and self.running(p))

    def replicas_of(self, master_port: int) -> list[int]:
        return sorted(p for p, (_, role, master, down) in self.view().nodes.items()
                      if role == "slave" and master == master_port and not down
                      and self.running(p))

    def replica_of(self, master_port: int) -> int:
        """The port of ``master_port``'s replica (the lowest, if it has several)."""
        replicas = self.replicas_of(master_port)
        if not replicas:
            raise ClusterError("master %d has no live replica:\n%s"
                               % (master_port, self.check_output()))
        return replicas[0]

    def slot_of(self, key: str | bytes) -> int:
        return int(self._call(self.live_ports[0], "CLUSTER", "KEYSLOT", key))

    def owner_of_slot(self, slot: int) -> int:
        for first, last, port in self.view().slots:
            if first <= slot <= last:
                return port
        raise ClusterError("slot %d has no owner:\n%s" % (slot, self.check_output()))

    def slot_count(self, port: int) -> int:
        return sum(last - first + 1 for first, last, owner in self.view().slots if owner == port)

    # --- waiting --------------------------------------------------------------------

    def check_output(self) -> str:
        """``redis-cli --cluster check`` from a live node: the text for an error message."""
        live = self.live_ports
        if not live:
            return "(no node is running)"
        try:
            result = subprocess.run(
                [self.redis_cli, "--cluster", "check", "%s:%d" % (HOST, live[0])],
                capture_output=True, text=True, timeout=30)
            return result.stdout + result.stderr
        except subprocess.TimeoutExpired as exc:
            return "redis-cli --cluster check timed out: %s" % exc

    def _wait(self, what: str, ready: Callable[[], str | None], timeout: float | None) -> float:
        """Poll ``ready`` (None when done, else why not) until done; return the seconds taken."""
        started = time.monotonic()
        reason: list[str | None] = ["not checked yet"]

        def done() -> bool:
            try:
                reason[0] = ready()
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
                reason[0] = "%s: %s" % (type(exc).__name__, exc)
            return reason[0] is None

        try:
            wait_until(done, timeout or self.timeout, interval=POLL_S)
        except WaitTimeout:
            raise ClusterError("%s: not done after %.0f s (%s)\n%s"
                               % (what, timeout or self.timeout, reason[0],
                                  self.check_output())) from None
        return time.monotonic() - started

    def _settled_reason(self) -> str | None:
        live = self.live_ports
        views: dict[int, NodeView] = {}
        for port in live:
            info = self._call(port, "CLUSTER", "INFO")
            info = info.decode() if isinstance(info, bytes) else info
            if "cluster_state:ok" not in info:
                return "node %d: cluster_state is not ok" % port
            if "cluster_slots_ok:%d" % SLOTS not in info:
                return "node %d: not every slot is ok" % port
            views[port] = self.view(port)
        first = views[live[0]]
        for port, view in views.items():
            if view.agreement_key() != first.agreement_key():
                return "nodes %d and %d disagree on the topology" % (live[0], port)
            if view.open_slots:
                return "node %d has open slots %s" % (port, view.open_slots)
        covered = sum(last - first_slot + 1 for first_slot, last, _ in first.slots)
        if covered != SLOTS:
            return "%d of %d slots assigned" % (covered, SLOTS)
        for port in live:
            _, role, master, down = first.nodes[port]
            if down:
                return "node %d is running but flagged %s" % (port, sorted(down))
            if role == "slave":
                replication = self._info(port, "replication")
                if replication.get("role") != "slave" or replication.get("master_port") != master:
                    return "node %d does not replicate %s yet" % (port, master)
                if replication.get("master_link_status") != "up":
                    return "node %d: link to master %s is down" % (port, master)
            elif self._info(port, "replication").get("role") != "master":
                return "node %d does not know it is a master yet" % port
        self._settled = first
        return None

    def wait_settled(self, timeout: float | None = None) -> float:
        """Wait until every live node: state ok, all slots ok, the same topology, links up."""
        return self._wait("cluster settled", self._settled_reason, timeout)

    # --- failures and failovers -----------------------------------------------------

    def kill_master(self, port: int, timeout: float | None = None) -> int:
        """SIGKILL master ``port``, wait for its replica to take over; return the new master."""
        self.wait_settled(timeout)
        if port not in self.masters():
            raise ClusterError("%d is not a live master" % port)
        self.nodes[port].kill()
        return self.wait_failover(port, timeout)

    def wait_failover(self, old_port: int, timeout: float | None = None) -> int:
        """Wait until a replica of dead master ``old_port`` is master and the rest agree."""
        if self._settled is None:
            raise ClusterError("no settled topology known to find %d's replicas in" % old_port)
        candidates = [p for p, (_, role, master, _) in self._settled.nodes.items()
                      if role == "slave" and master == old_port and self.running(p)]
        if not candidates:
            raise ClusterError("master %d had no live replica to fail over to" % old_port)
        promoted: list[int] = []

        def ready() -> str | None:
            if not promoted:
                for port in candidates:
                    if self._info(port, "replication").get("role") == "master":
                        promoted.append(port)
                        break
                else:
                    return "no replica of %d reports role:master" % old_port
            return self._settled_reason()

        self._wait("failover of %d" % old_port, ready, timeout)
        return promoted[0]

    def restart(self, port: int, timeout: float | None = None) -> float:
        """Start a stopped node again (same port, nodes.conf); wait until it has rejoined.

        A killed master comes back as a replica of the node promoted in its
        place. Returns the seconds the rejoin took.
        """
        node = self.nodes[port]
        if self.running(port):
            raise ClusterError("node %d is still running" % port)
        node.start()
        self.pids.append(node.pid)
        return self.wait_settled(timeout)

    def failover(self, replica_port: int, timeout: float | None = None) -> int:
        """Manual ``CLUSTER FAILOVER`` on a replica; return the old master (now its replica)."""
        self.wait_settled(timeout)
        old_master = self._settled.nodes[replica_port][2] if self._settled else None
        if old_master is None:
            raise ClusterError("%d is not a replica" % replica_port)
        self._call(replica_port, "CLUSTER", "FAILOVER")

        def ready() -> str | None:
            view = self.view(replica_port)
            if view.nodes[replica_port][1] != "master":
                return "%d is not master yet" % replica_port
            if view.nodes[old_master][2] != replica_port:
                return "%d does not replicate %d yet" % (old_master, replica_port)
            return self._settled_reason()

        self._wait("failover to %d" % replica_port, ready, timeout)
        return old_master

    def ensure_healthy(self, timeout: float | None = None) -> None:
        """Resume stopped (SIGSTOP) nodes, restart dead ones, wait until settled."""
        for port, node in self.nodes.items():
            if self.running(port):
                node.send_signal(signal.SIGCONT)
        for port in self.ports:
            if not self.running(port):
                self.restart(port, timeout)
        self.wait_settled(timeout)

    # --- data -----------------------------------------------------------------------

    def flushall(self, timeout: float | None = None) -> None:
        """FLUSHALL on every master, until their replicas are empty too; SCRIPT FLUSH everywhere."""
        live = self.live_ports
        roles = {p: self._info(p, "replication").get("role") for p in live}
        for port in live:
            if roles[port] == "master":
                self._call(port, "FLUSHALL")
        for port in live:
            self._call(port, "SCRIPT", "FLUSH")

        def empty() -> str | None:
            for port in live:
                if self._call(port, "DBSIZE"):
                    return "node %d still has keys" % port
            return None

        self._wait("flushall", empty, timeout)

    def _cli(self, *args: str) -> str:
        cmd = [self.redis_cli, "--cluster", *args]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                                    stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError("%s timed out after %.0f s:\n%s"
                               % (" ".join(cmd), CLI_TIMEOUT_S, exc.stdout or "")) from exc
        output = result.stdout + result.stderr
        # redis-cli --cluster exits 0 after some errors; it prints them as "[ERR]"
        if result.returncode != 0 or "[ERR]" in output:
            raise ClusterError("%s failed (exit %d):\n%s"
                               % (" ".join(cmd), result.returncode, output))
        return output

    def migrate_slots(self, count: int, from_port: int, to_port: int,
                      timeout: float | None = None) -> float:
        """Move ``count`` slots and their keys with ``redis-cli --cluster reshard``.

        Returns the seconds the reshard and the wait for agreement took.
        """
        self.wait_settled(timeout)  # reshard refuses a cluster whose nodes disagree
        started = time.monotonic()
        self._cli("reshard", "%s:%d" % (HOST, from_port),
                  "--cluster-from", self.node_id(from_port),
                  "--cluster-to", self.node_id(to_port),
                  "--cluster-slots", str(count), "--cluster-yes")
        self.wait_settled(timeout)
        return time.monotonic() - started

    def migrate_slot_of_key(self, key: str | bytes, to_port: int,
                            timeout: float | None = None) -> int:
        """Move the slot ``key`` hashes to, with its keys, to master ``to_port``; return the slot.

        The protocol redis-cli runs per slot: IMPORTING on the target,
        MIGRATING on the source, MIGRATE the keys in batches, then SETSLOT
        NODE on the target, the source and every other master. Clients keep
        working throughout (ASK while the slot is open, MOVED after).
        """
        self.wait_settled(timeout)
        slot = self.slot_of(key)
        from_port = self.owner_of_slot(slot)
        if from_port == to_port:
            raise ClusterError("slot %d of %r is already on %d" % (slot, key, to_port))
        if to_port not in self.masters():
            raise ClusterError("%d is not a live master" % to_port)
        from_id, to_id = self.node_id(from_port), self.node_id(to_port)
        self._call(to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", from_id)
        self._call(from_port, "CLUSTER", "SETSLOT", slot, "MIGRATING", to_id)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            keys = self._call(from_port, "CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH)
            if not keys:
                break
            if time.monotonic() > deadline:
                raise ClusterError("slot %d: keys still on %d after %.0f s\n%s"
                                   % (slot, from_port, timeout or self.timeout,
                                      self.check_output()))
            self._call(from_port, "MIGRATE", HOST, to_port, "", 0, 10_000, "KEYS", *keys)
        others = [p for p in self.masters() if p not in (from_port, to_port)]
        for port in (to_port, from_port, *others):
            self._call(port, "CLUSTER", "SETSLOT", slot, "NODE", to_id)
        self.wait_settled(timeout)
        return slot
