"""The cluster a command acts on: Redis, the scrapyd nodes and their credentials.

Each comes from the command line when given there, else from the environment
(``REDIS_URL``, ``SCRAPYD_NODES``, ``SCRAPYD_USERNAME``, ``SCRAPYD_PASSWORD``),
else from the cluster ``up`` recorded and its ``.env``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

import redis

from bloomcrawl.core import defaults
from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.cluster.compose import Compose
from bloomcrawl.ops.cluster.envfile import read_env_file
from bloomcrawl.ops.cluster.state import Cluster, Paths, load_cluster
from bloomcrawl.ops.console import OpsError


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

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_connect_timeout=5, socket_timeout=30)


def _split(urls: str) -> list[str]:
    return [u for u in urls.split(",") if u.strip()]


def resolve_target(paths: Paths, options: TargetOptions | None = None, *,
                   need_nodes: bool) -> Target:
    """The target; with ``need_nodes``, :class:`OpsError` when no scrapyd node is known."""
    options = options or TargetOptions()
    cluster = load_cluster(paths)
    env = read_env_file(paths.env_file)
    username = (options.username or os.environ.get("SCRAPYD_USERNAME")
                or (cluster.username if cluster else "") or env.get("SCRAPYD_USERNAME", ""))
    password = (os.environ.get("SCRAPYD_PASSWORD")
                or (cluster.password if cluster else "") or env.get("SCRAPYD_PASSWORD", ""))
    redis_url = (options.redis_url or os.environ.get("REDIS_URL")
                 or (cluster.redis_url if cluster else "") or defaults.REDIS_URL)
    compose = Compose(paths) if cluster is not None and cluster.mode == "docker" else None
    urls: list[str] = []
    if options.nodes:
        urls = _split(options.nodes)
    elif os.environ.get("SCRAPYD_NODES"):
        urls = _split(os.environ["SCRAPYD_NODES"])
    elif options.scrapyd_service:
        try:
            urls = scrapyd.resolve_service(options.scrapyd_service)
        except OSError as exc:
            raise OpsError(f"scrapyd service {options.scrapyd_service!r}: {exc}") from exc
    elif cluster is not None and need_nodes:
        urls = compose.worker_urls() if compose is not None else cluster.scrapyd_urls()
    if need_nodes and not urls:
        raise OpsError("no scrapyd nodes: run `make up`, or pass --nodes URL,... (SCRAPYD_NODES)")
    nodes = [scrapyd.Node(url, username, password) for url in urls]
    return Target(redis_url, nodes, cluster, compose)
