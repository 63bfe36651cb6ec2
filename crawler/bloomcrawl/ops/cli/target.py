"""The cluster a command acts on: Redis, the scrapyd nodes and their credentials.

Each comes from the command line when given there, else from the environment
(``REDIS_URL``, ``SCRAPYD_NODES``, ``SCRAPYD_SERVICE``, ``SCRAPYD_USERNAME``,
``SCRAPYD_PASSWORD``),
else from the cluster ``up`` recorded and its ``.env``. With none of these, a
command that needs Redis or the nodes fails with :func:`no_cluster`'s line,
saying how to start one; never with a guess at a server that may be someone
else's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import redis

from bloomcrawl.core.connection import REDIS_ERRORS, ping, redis_from_url
from bloomcrawl.core.errors import RedisUnavailableError
from bloomcrawl.ops import remote_nodes, scrapyd
from bloomcrawl.ops.cluster.compose import REDIS_CLUSTER_SERVICES, REDIS_CONTAINER_PORT, Compose
from bloomcrawl.ops.cluster.envfile import read_env_file
from bloomcrawl.ops.cluster.state import (
    REDIS_CLUSTER,
    Cluster,
    Paths,
    cluster_redis_url,
    load_cluster,
)
from bloomcrawl.ops.console import OpsError, warn


@dataclass
class TargetOptions:
    """Where the command line said the cluster is; ``None``: not said."""

    #: comma-separated scrapyd URLs (``--nodes``)
    nodes: str | None = None
    #: a DNS name whose every address is a node (``--scrapyd-service``)
    scrapyd_service: str | None = None
    username: str | None = None
    redis_url: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TargetOptions:
        """The options the command has (``--nodes`` and friends, ``--redis-url``)."""
        return cls(**{f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)})


@dataclass
class Target:
    """Redis, the scrapyd nodes and their credentials, however they were given."""

    redis_url: str
    nodes: list[scrapyd.Node]
    cluster: Cluster | None
    compose: Compose | None
    #: the URL is the recorded compose Redis Cluster's: reach its nodes on 127.0.0.1
    compose_redis_cluster: bool = False
    #: the nodes are the recorded cluster's own (not given by --nodes, SCRAPYD_NODES or
    #: --scrapyd-service): ``deploy`` may install a project's requirements on them
    nodes_recorded: bool = False
    #: the scrapyd credentials every node of the cluster shares
    username: str = ""
    password: str = dataclasses.field(default="", repr=False)

    def redis(self) -> redis.Redis:
        """A client to the cluster's Redis, which answered a PING.

        Raises :class:`~bloomcrawl.core.errors.RedisUnavailableError` naming the
        server (never its password) when it does not answer or refuses the
        credentials.
        """
        url, params = self.redis_url, dict[str, Any]()
        if self.compose_redis_cluster and self.compose is not None:
            url, params = self._compose_cluster_client_args()
        # a RedisCluster for a redis+cluster:// URL: the commands use the same methods
        client: redis.Redis = redis_from_url(url, socket_connect_timeout=5, socket_timeout=30,
                                             **params)
        try:
            ping(client)
        except RedisUnavailableError as exc:
            gone = [p for p in self.cluster.gone() if p.name == "redis"] if (
                self.cluster is not None and self.cluster.mode == "local") else []
            if gone:
                raise OpsError(f"{exc} (the local cluster's redis-server, pid {gone[0].pid},"
                               " is not running: `make down KEEP_DATA=1`, then `make up`)") from exc
            raise
        return client

    def _compose_cluster_client_args(self) -> tuple[str, dict[str, Any]]:
        """Every node's 127.0.0.1 port as a startup node, and the map from announced names."""
        assert self.compose is not None
        ports = self.compose.redis_node_ports()
        if not ports:
            return self.redis_url, {}
        published = {(service, REDIS_CONTAINER_PORT): ("127.0.0.1", port)
                     for service, port in ports.items()}

        def address_remap(address: tuple[str, int]) -> tuple[str, int]:
            return published.get(address, address)

        password = read_env_file(self.compose.paths.env_file).get("REDIS_PASSWORD", "")
        url = cluster_redis_url([ports[s] for s in REDIS_CLUSTER_SERVICES if s in ports],
                                password)
        return url, {"address_remap": address_remap}


#: what reading the remote nodes may fail with (the nodes of this host still count)
LISTING_ERRORS: tuple[type[BaseException], ...] = (OpsError, *REDIS_ERRORS)


def _split(urls: str) -> list[str]:
    return [u for u in urls.split(",") if u.strip()]


def no_cluster(paths: Paths, instead: str = "", *,
               hint: str = "start one with `make up` or `make demo`") -> OpsError:
    """The line a command fails with when no cluster is recorded and none was given.

    ``instead`` names the options that point the command at a cluster ``up``
    did not start.
    """
    return OpsError(f"no cluster is running (none recorded in {paths.state_dir}): {hint}"
                    + (f", or pass {instead}" if instead else ""))


def resolve_target(paths: Paths, options: TargetOptions | None = None, *,
                   need_nodes: bool, need_redis: bool = False,
                   quiet: bool = False) -> Target:
    """The target; :class:`OpsError` when a part it needs is nowhere to be found.

    With ``need_nodes``, at least one scrapyd node must be known; with
    ``need_redis``, a Redis URL (``redis_url`` is ``""`` when none is known).
    The nodes of other hosts listed in Redis come too, unless ``--nodes`` or
    SCRAPYD_NODES lists them all; when Redis does not answer they are left
    out, with a warning unless ``quiet`` (a command that reports Redis itself).
    """
    options = options or TargetOptions()
    cluster = load_cluster(paths)
    env = read_env_file(paths.env_file)
    username = (options.username or os.environ.get("SCRAPYD_USERNAME")
                or (cluster.username if cluster else "") or env.get("SCRAPYD_USERNAME", ""))
    password = (os.environ.get("SCRAPYD_PASSWORD")
                or (cluster.password if cluster else "") or env.get("SCRAPYD_PASSWORD", ""))
    redis_url = (options.redis_url or os.environ.get("REDIS_URL")
                 or (cluster.redis_url if cluster else ""))
    compose_redis_cluster = (cluster is not None and cluster.mode == "docker"
                             and cluster.redis == REDIS_CLUSTER
                             and redis_url == cluster.redis_url)
    if need_redis and not redis_url:
        raise no_cluster(paths, "--redis-url URL (REDIS_URL)")
    compose = Compose(paths) if cluster is not None and cluster.mode == "docker" else None
    urls: list[str] = []
    recorded = False
    if options.nodes:
        urls = _split(options.nodes)
    elif os.environ.get("SCRAPYD_NODES"):
        urls = _split(os.environ["SCRAPYD_NODES"])
    elif options.scrapyd_service or os.environ.get("SCRAPYD_SERVICE"):
        service = options.scrapyd_service or os.environ["SCRAPYD_SERVICE"]
        try:
            urls = scrapyd.resolve_service(service)
        except OSError as exc:
            raise OpsError(f"scrapyd service {service!r}: {exc}") from exc
    elif cluster is not None and need_nodes:
        urls = compose.worker_urls() if compose is not None else cluster.scrapyd_urls()
        recorded = True
    if need_nodes and not urls and cluster is None and not redis_url:
        raise no_cluster(paths, "--nodes URL,... (SCRAPYD_NODES)")
    explicit = bool(options.nodes or os.environ.get("SCRAPYD_NODES"))
    if explicit:
        urls = [scrapyd.check_node_url(url) for url in urls]
    nodes = [scrapyd.Node(url, username, password) for url in urls]
    target = Target(redis_url, nodes, cluster, compose, compose_redis_cluster,
                    nodes_recorded=recorded, username=username, password=password)
    if need_nodes and not explicit and redis_url:
        # the nodes of other hosts (`bloomcrawl nodes add`), listed in the cluster's Redis
        known = set(urls)
        try:
            client = target.redis()
            try:
                listed = remote_nodes.listed(client)
            finally:
                client.close()
        except LISTING_ERRORS as exc:
            if not quiet:
                warn(f"the remote nodes listed in Redis are left out: {exc}")
            listed = []
        nodes += [entry.node(username, password) for entry in listed if entry.url not in known]
    if need_nodes and not nodes:
        if cluster is None:
            raise no_cluster(paths, "--nodes URL,... (SCRAPYD_NODES)")
        raise OpsError(f"the cluster recorded in {paths.state_dir} has no scrapyd node:"
                       " `make up`, or pass --nodes URL,... (SCRAPYD_NODES)")
    return target
