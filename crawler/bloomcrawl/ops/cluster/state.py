"""Where the cluster runs from, and what ``up`` recorded about it (``.run/cluster.json``).

The record says how the cluster runs (``docker``: compose; ``swarm``: a Docker
Swarm stack; or ``local``), on which Redis
(``single``, or ``cluster``: the compose Redis Cluster of
``docker-compose.cluster.yml``), its ports and, for a local cluster, every
process it started (pid and start time, so that ``down`` stops exactly those).
Secrets are never in it: they are read from ``.env`` each time. It is written
owner-only all the same (created 0600, in a state directory created 0700), as
the local cluster's data and logs under it are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bloomcrawl
from bloomcrawl.ops.cluster.envfile import open_private, read_env_file
from bloomcrawl.ops.cluster.processes import ProcessRecord, is_ours, redis_url
from bloomcrawl.ops.console import OpsError

DEFAULT_REDIS_PORT = 6379
SCRAPYD_PREFIX = "scrapyd-"
#: what Redis the cluster runs on: one server, or a Redis Cluster (compose only)
REDIS_SINGLE = "single"
REDIS_CLUSTER = "cluster"
REDIS_KINDS = (REDIS_SINGLE, REDIS_CLUSTER)
#: how a cluster runs: compose, local processes, or a worker host's scrapyd nodes alone
MODES = ("docker", "local", "worker-host")


@dataclass
class Paths:
    """The checkout the cluster runs from, its ``.env`` and its state directory."""

    root: Path
    env_file: Path
    state_dir: Path

    @classmethod
    def from_environment(cls) -> Paths:
        root = Path(os.environ.get("BLOOMCRAWL_ROOT") or os.getcwd()).resolve()
        env_file = Path(os.environ.get("BLOOMCRAWL_ENV_FILE") or root / ".env")
        state_dir = Path(os.environ.get("BLOOMCRAWL_STATE_DIR") or root / ".run")
        return cls(root, env_file.resolve(), state_dir.resolve())

    @property
    def compose_file(self) -> Path:
        return self.root / "docker-compose.yml"

    @property
    def cluster_compose_file(self) -> Path:
        """The override that puts the compose cluster on a Redis Cluster."""
        return self.root / "docker-compose.cluster.yml"

    @property
    def swarm_stack_file(self) -> Path:
        """The stack ``up`` deploys on a Docker Swarm manager."""
        return self.root / "docker-compose.swarm.yml"

    @property
    def cluster_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def local_dir(self) -> Path:
        return self.state_dir / "local"

    @property
    def certs_dir(self) -> Path:
        """Where ``make certs`` writes the CA and the certificates (never committed)."""
        return Path(os.environ.get("BLOOMCRAWL_CERTS_DIR") or self.state_dir / "certs")

    @property
    def project_packages(self) -> Path:
        """The local cluster's scrapyd nodes run with it on their PYTHONPATH: ``deploy``
        installs the projects' requirements there (and ``down`` deletes it with the eggs)."""
        return self.local_dir / "site-packages"

    def project_dir(self) -> Path:
        """The Scrapy project scrapyd-deploy packages (the directory of scrapy.cfg)."""
        package_parent = Path(bloomcrawl.__file__).resolve().parent.parent
        for candidate in (self.root / "crawler", package_parent):
            if (candidate / "scrapy.cfg").is_file():
                return candidate
        raise OpsError(f"no scrapy.cfg found in {self.root}/crawler")


@dataclass
class Cluster:
    """What the commands need to reach a running cluster."""

    mode: str  # "docker", "swarm" or "local"
    redis_url: str
    username: str
    password: str
    project_name: str = "bloomcrawl"
    processes: list[ProcessRecord] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    #: ``single`` or ``cluster`` (:data:`REDIS_KINDS`)
    redis: str = REDIS_SINGLE
    #: the address Redis is published on besides 127.0.0.1 (``up --redis-bind``), or ""
    redis_bind: str = ""
    #: Redis speaks TLS alone, with the certificates of ``make certs``
    tls: bool = False

    def scrapyd_processes(self) -> list[ProcessRecord]:
        """The local scrapyd nodes, by node number."""
        nodes = [p for p in self.processes if p.name.startswith(SCRAPYD_PREFIX)]
        return sorted(nodes, key=lambda p: int(p.name[len(SCRAPYD_PREFIX):]))

    def scrapyd_urls(self) -> list[str]:
        """``http://127.0.0.1:PORT`` of every local scrapyd node, by node number."""
        return ["http://127.0.0.1:%s" % p.port for p in self.scrapyd_processes() if p.port]

    def gone(self) -> list[ProcessRecord]:
        """The recorded local processes that are no longer running."""
        return [p for p in self.processes if not is_ours(p)]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "mode": self.mode,
            "redis": self.redis,
            "project_name": self.project_name,
            "ports": self.ports,
            "processes": [p.__dict__ for p in self.processes],
        }
        if self.redis_bind:
            data["redis_bind"] = self.redis_bind
        if self.tls:
            data["tls"] = True
        return data


def load_cluster(paths: Paths) -> Cluster | None:
    """The cluster ``up`` recorded, or ``None``. Secrets are read from ``.env``."""
    if not paths.cluster_file.is_file():
        return None
    env = read_env_file(paths.env_file)
    try:
        data = json.loads(paths.cluster_file.read_text())
        ports = {str(k): int(v) for k, v in data.get("ports", {}).items()}
        kind = data.get("redis", REDIS_SINGLE)
        if kind not in REDIS_KINDS:
            raise ValueError("redis is %r, not one of %s" % (kind, ", ".join(REDIS_KINDS)))
        if data["mode"] == "docker" and kind == REDIS_CLUSTER:
            # node 1's published port; the host's client learns the other nodes
            # (Target.redis maps their announced names to their published ports)
            url = cluster_redis_url(
                [int(env.get("REDIS_PORT") or DEFAULT_REDIS_PORT)], env.get("REDIS_PASSWORD", ""))
        elif data["mode"] == "swarm":
            # inside the stack's network only: its commands run there (ops/cluster/swarm.py)
            url = ""
        elif data["mode"] == "docker":
            url = redis_url(int(env.get("REDIS_PORT") or DEFAULT_REDIS_PORT),
                            env.get("REDIS_PASSWORD", ""))
        elif "redis" in ports:
            url = redis_url(ports["redis"], env.get("REDIS_PASSWORD", ""),
                            tls_dir=paths.certs_dir if data.get("tls") else None)
        elif data["mode"] == "worker-host":
            url = ""  # its nodes' jobs have it in their environment, never written here
        else:  # recorded by an older version, password included
            url = data["redis_url"]
        return Cluster(
            mode=data["mode"],
            redis_url=url,
            username=env.get("SCRAPYD_USERNAME", ""),
            password=env.get("SCRAPYD_PASSWORD", ""),
            project_name=data.get("project_name", "bloomcrawl"),
            processes=[ProcessRecord(**p) for p in data.get("processes", [])],
            ports=ports,
            redis=kind,
            redis_bind=str(data.get("redis_bind", "")),
            tls=bool(data.get("tls", False)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OpsError(f"{paths.cluster_file} is unreadable ({type(exc).__name__}: {exc}):"
                       " stop what it started by hand, then delete it") from exc


def recorded_redis(paths: Paths) -> str:
    """The Redis kind ``up`` recorded (``single`` when nothing readable is recorded)."""
    try:
        kind = json.loads(paths.cluster_file.read_text()).get("redis", REDIS_SINGLE)
    except (OSError, ValueError, AttributeError):
        return REDIS_SINGLE
    return kind if kind in REDIS_KINDS else REDIS_SINGLE


def recorded_redis_bind(paths: Paths) -> str:
    """The address ``up --redis-bind`` published Redis on, or ``""``."""
    try:
        return str(json.loads(paths.cluster_file.read_text()).get("redis_bind", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def cluster_redis_url(ports: list[int], password: str | None = None,
                      host: str = "127.0.0.1") -> str:
    """``redis+cluster://[:password@]host:port,...``: a Redis Cluster's startup nodes."""
    auth = f":{password}@" if password else ""
    return "redis+cluster://%s%s" % (auth, ",".join(f"{host}:{port}" for port in ports))


def save_cluster(paths: Paths, cluster: Cluster) -> None:
    """Write the record at once (a new file renamed over the old one), owner-only."""
    paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = paths.cluster_file.with_suffix(".tmp")
    with open_private(tmp) as f:
        f.write(json.dumps(cluster.to_json(), indent=2) + "\n")
    tmp.replace(paths.cluster_file)
