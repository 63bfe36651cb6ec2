"""The cluster in containers: docker-compose (v1 or v2) on this checkout's compose file.

On a Redis Cluster (``up --redis cluster``, recorded in the state directory)
every command also reads ``docker-compose.cluster.yml``, which makes the
service ``redis`` node 1 of six and adds ``redis-2`` .. ``redis-6`` and the
one-shot ``redis-cluster-init``.

A project's requirements reach the workers at deploy time
(:meth:`Compose.install_requirements`): the containers have no package index
to reach, so the wheels are built on the host, with a Python of the image's
version, and installed in each running worker container into
:data:`PROJECT_PACKAGES`, the image's PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.cluster.envfile import read_env_file
from bloomcrawl.ops.cluster.processes import run
from bloomcrawl.ops.cluster.state import (
    REDIS_CLUSTER,
    Paths,
    recorded_redis,
    recorded_redis_bind,
)
from bloomcrawl.ops.console import OpsError, say
from bloomcrawl.ops.requirements import (
    Wheelhouse,
    build_wheelhouse,
    install_command,
    send_wheels,
    wheel_builder,
    worker_environment,
)

COMPOSE_SERVICE = "worker"
HEALTH_TIMEOUT = 300.0
#: the Redis Cluster's nodes (docker-compose.cluster.yml), node 1 first
REDIS_CLUSTER_SERVICES = ("redis", "redis-2", "redis-3", "redis-4", "redis-5", "redis-6")
REDIS_CLUSTER_INIT = "redis-cluster-init"
#: Redis published on REDIS_BIND with TLS, for worker hosts (``up --redis-bind``)
REMOTE_COMPOSE_FILE = "docker-compose.remote.yml"
#: in the state directory: what that file mounts into the redis container (the CA, the
#: server's certificate and key, and the role users' ``user`` lines, password digests)
REDIS_TLS_DIR = "redis-tls"
REDIS_USERS_FILE = "users.conf"
#: the variable docker-compose.remote.yml mounts that directory from
REDIS_TLS_DIR_VARIABLE = "BLOOMCRAWL_REDIS_TLS_DIR"
#: services that run once and must exit 0 (``wait_healthy`` waits for that)
ONE_SHOT_SERVICES = (REDIS_CLUSTER_INIT,)
REDIS_CONTAINER_PORT = 6379
#: where a worker's scrapyd finds the projects' packages: PYTHONPATH in deploy/Dockerfile.
#: In the container's filesystem, as the eggs are (/var/lib/scrapyd/eggs): a new or
#: recreated container gets both from the next deploy.
PROJECT_PACKAGES = "/opt/bloomcrawl/project-packages"
#: worker containers installed into at once
MAX_PARALLEL_INSTALLS = 8


def docker_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                                capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def compose_command() -> list[str]:
    configured = os.environ.get("BLOOMCRAWL_COMPOSE")
    if configured:
        return configured.split()
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return ["docker", "compose"]


class Compose:
    """docker-compose (v1 or v2) on this checkout's compose file and ``.env``."""

    def __init__(self, paths: Paths, redis: str | None = None) -> None:
        """``redis``: ``single`` or ``cluster``; by default what ``up`` recorded."""
        self.paths = paths
        env = read_env_file(paths.env_file)
        self.project = env.get("COMPOSE_PROJECT_NAME") or "bloomcrawl"
        self.grafana = env.get("GRAFANA_ENABLED") == "1"
        self.redis_cluster = (redis or recorded_redis(paths)) == REDIS_CLUSTER
        #: Redis published for worker hosts too (docker-compose.remote.yml)
        self.redis_bind = recorded_redis_bind(paths)
        if self.redis_bind:
            # docker-compose reads it from the environment (the file's port and address)
            os.environ.setdefault("REDIS_BIND", self.redis_bind)
            # what ``up`` wrote for the redis container is in the state directory, which
            # BLOOMCRAWL_STATE_DIR may put anywhere: the file mounts it from here
            os.environ[REDIS_TLS_DIR_VARIABLE] = str(paths.state_dir / REDIS_TLS_DIR)

    def files(self) -> list[Path]:
        files = [self.paths.compose_file]
        if self.redis_cluster:
            files.append(self.paths.cluster_compose_file)
        if self.redis_bind:
            files.append(self.paths.root / REMOTE_COMPOSE_FILE)
        return files

    def base(self, *profiles: str) -> list[str]:
        cmd = [*compose_command(), "--env-file", str(self.paths.env_file)]
        for file in self.files():
            cmd += ["-f", str(file)]
        cmd += ["-p", self.project]
        for profile in profiles:
            cmd += ["--profile", profile]
        return cmd

    def run(self, *args: str, profiles: Sequence[str] = (), capture: bool = False,
            check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        return run(self.base(*profiles) + list(args), cwd=self.paths.root, capture=capture,
                   check=check, timeout=timeout)

    def is_v1(self) -> bool:
        if compose_command() != ["docker-compose"]:
            return False
        result = run(["docker-compose", "version", "--short"], capture=True, check=False,
                     timeout=30)
        return result.stdout.strip().startswith("1.")

    def up_workers(self, workers: int, profiles: Sequence[str], *,
                   only_workers: bool = False) -> None:
        """``up -d --scale worker=N``; with Compose v2 one new replica at a time.

        v2 creates replicas in parallel, and two of them may then race for the
        same port of the published range; v1 creates them one after another.
        """
        service = [COMPOSE_SERVICE] if only_workers else []
        options = ["--no-recreate"] if only_workers else ["--remove-orphans"]
        if self.is_v1():
            self.run("up", "-d", *options, "--scale", "%s=%d" % (COMPOSE_SERVICE, workers),
                     *service, profiles=profiles)
            return
        running = len(self.containers(COMPOSE_SERVICE))
        steps = list(range(running + 1, workers + 1)) or [workers]
        for count in steps:
            self.run("up", "-d", *options, "--scale", "%s=%d" % (COMPOSE_SERVICE, count),
                     *service, profiles=profiles)
            options = ["--no-recreate"]

    def containers(self, service: str | None = None) -> list[dict[str, Any]]:
        """``docker inspect`` of this project's containers (of one service)."""
        cmd = ["docker", "ps", "-a", "-q", "--filter",
               f"label=com.docker.compose.project={self.project}"]
        if service:
            cmd += ["--filter", f"label=com.docker.compose.service={service}"]
        ids = run(cmd, capture=True, timeout=30).stdout.split()
        if not ids:
            return []
        result = run(["docker", "inspect", *ids], capture=True, check=False, timeout=30)
        if result.returncode != 0:  # a container went away between ps and inspect
            return [c for i in ids for c in self._inspect_one(i)]
        data: list[dict[str, Any]] = json.loads(result.stdout)
        return data

    def _inspect_one(self, container_id: str) -> list[dict[str, Any]]:
        result = run(["docker", "inspect", container_id], capture=True, check=False, timeout=30)
        return list(json.loads(result.stdout)) if result.returncode == 0 else []

    def worker_urls(self) -> list[str]:
        """``http://127.0.0.1:PORT`` of every running worker replica, by replica number."""
        urls = []
        for c in self.containers(COMPOSE_SERVICE):
            if not c["State"].get("Running"):
                continue
            ports = c["NetworkSettings"].get("Ports") or {}
            bindings = ports.get("%d/tcp" % scrapyd.DEFAULT_PORT)
            if not bindings:
                continue
            number = int(c["Config"]["Labels"].get("com.docker.compose.container-number", 0))
            host = bindings[0].get("HostIp") or "127.0.0.1"
            if host in ("0.0.0.0", "::"):
                host = "127.0.0.1"
            urls.append((number, "http://{}:{}".format(host, bindings[0]["HostPort"])))
        return [url for _, url in sorted(urls)]

    def install_requirements(self, requirements: Path) -> Wheelhouse:
        """Install what ``requirements`` needs in every running worker container.

        The first container tells its Python version and packages; the wheels
        are built here (:func:`~bloomcrawl.ops.requirements.wheel_builder`) and
        sent to each container, whose own bloomcrawl installs them into
        :data:`PROJECT_PACKAGES`.
        """
        running = [c for c in self.containers(COMPOSE_SERVICE) if c["State"].get("Running")]
        if not running:
            raise OpsError("no worker container is running: `make up`")
        workers = worker_environment(["docker", "exec", running[0]["Id"], "python"])
        python = wheel_builder(workers.python_version, self.paths.root / ".cache")
        with tempfile.TemporaryDirectory(prefix="bloomcrawl-wheels-") as tmp:
            wheelhouse = build_wheelhouse(python, requirements, Path(tmp), workers)
            if wheelhouse.wheels:
                def install(container: dict[str, Any]) -> None:
                    name = container["Name"].lstrip("/")
                    command = install_command(["docker", "exec", "-i", container["Id"], "python"],
                                              PROJECT_PACKAGES)
                    try:
                        send_wheels(command, wheelhouse.wheels,
                                    what=f"installing the project's requirements in {name}")
                    except OpsError as exc:
                        if "No module named bloomcrawl.ops.requirements" not in str(exc):
                            raise
                        raise OpsError(f"{name} runs a worker image older than this bloomcrawl,"
                                       " which cannot take a project's requirements: rebuild it"
                                       " (`bloomcrawl up --build`), then deploy again") from exc

                with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_INSTALLS, len(running)),
                                        thread_name_prefix="install") as pool:
                    list(pool.map(install, running))  # raises the first failure
        return wheelhouse

    def has_redis_cluster(self) -> bool:
        """Whether the project has a Redis Cluster node's container or volume (redis-2 ...).

        ``down`` then reads docker-compose.cluster.yml too, whatever was
        recorded, so that no node or volume is left behind.
        """
        label = f"label=com.docker.compose.project={self.project}"
        for service in REDIS_CLUSTER_SERVICES[1:]:
            if run(["docker", "ps", "-a", "-q", "--filter", label, "--filter",
                    f"label=com.docker.compose.service={service}"],
                   capture=True, timeout=30).stdout.strip():
                return True
        volumes = run(["docker", "volume", "ls", "-q", "--filter", label], capture=True,
                      timeout=30).stdout.split()
        wanted = {f"{self.project}_{service}-data" for service in REDIS_CLUSTER_SERVICES[1:]}
        return any(v in wanted for v in volumes)

    def redis_node_ports(self) -> dict[str, int]:
        """Each running Redis Cluster node's published port on 127.0.0.1, by service name.

        The nodes announce their service names (docker-compose.cluster.yml), which
        resolve only inside the compose network: a client on the host maps
        ``(service, 6379)`` to ``("127.0.0.1", port)``.
        """
        ports = {}
        for c in self.containers():
            service = c["Config"]["Labels"].get("com.docker.compose.service", "")
            if service not in REDIS_CLUSTER_SERVICES or not c["State"].get("Running"):
                continue
            bindings = (c["NetworkSettings"].get("Ports") or {}).get(
                "%d/tcp" % REDIS_CONTAINER_PORT) or []
            for binding in bindings:
                if binding.get("HostIp") in ("127.0.0.1", "0.0.0.0", ""):
                    ports[service] = int(binding["HostPort"])
                    break
        return ports

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT, services: Sequence[str] = ()) -> None:
        """Until every running container with a healthcheck is healthy.

        A one-shot service's container (:data:`ONE_SHOT_SERVICES`) must have
        exited 0.
        """
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            waiting = []
            for c in self.containers():
                service = c["Config"]["Labels"].get("com.docker.compose.service", "")
                if services and service not in services:
                    continue
                state = c["State"]
                name = c["Name"].lstrip("/")
                if service in ONE_SHOT_SERVICES and state.get("Status") in ("created", "running",
                                                                            "restarting"):
                    waiting.append(name)
                    continue
                if not state.get("Running"):
                    if state.get("Status") in ("exited", "dead") and state.get("ExitCode"):
                        logs = run(["docker", "logs", "--tail", "30", c["Id"]], capture=True,
                                   check=False, timeout=30)
                        raise OpsError("{} exited with {}:\n{}{}".format(
                            name, state.get("ExitCode"), logs.stdout, logs.stderr))
                    continue
                health = (state.get("Health") or {}).get("Status")
                if health == "unhealthy":
                    log = (state["Health"].get("Log") or [{}])[-1].get("Output", "")
                    raise OpsError(f"{name} is unhealthy: {log.strip()[-500:]}")
                if health not in (None, "healthy"):
                    waiting.append(name)
            if not waiting:
                return
            summary = ", ".join(sorted(waiting))
            if summary != last:
                say("waiting for: " + summary)
                last = summary
            if time.monotonic() > deadline:
                raise OpsError(f"not healthy after {timeout:g}s: {summary}")
            time.sleep(1)
