"""The cluster as a Docker Swarm stack, on the swarm manager ``docker`` talks to.

``up`` deploys ``docker-compose.swarm.yml`` with ``docker stack deploy`` (the
stack is named after ``COMPOSE_PROJECT_NAME``). The images are built on the
manager and loaded into every other node's engine (``docker save | docker -H
ENGINE load``): no node pulls from a registry. ``SWARM_ENGINES`` in ``.env``
lists the other nodes' engines (``ssh://user@host``, ``tcp://host:2376`` with
the TLS variables docker reads, ``unix:///path``); every node of the swarm
must be the manager's own or one of them, so that a task placed anywhere
finds its image.

Nothing of the stack is published (the routing mesh would publish on every
node's every address): the commands that talk to the cluster's Redis or
scrapyd run in a container of the worker image that joins the stack's
attachable network on the manager (:meth:`Swarm.run_inside`). There, every
service name resolves to its tasks' addresses (``endpoint_mode: dnsrr``), so
``worker`` is every replica, on whatever node and however recently started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bloomcrawl.ops.cluster.envfile import read_env_file
from bloomcrawl.ops.cluster.processes import run
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.console import OpsError, say

#: the node label that places Redis (and so its volume)
REDIS_LABEL = "bloomcrawl.redis"
WORKER_SERVICE = "worker"
DEMO_SERVICE = "demo"
#: the environment a command run inside the stack has: it acts on what it is given
IN_STACK_ENV = "BLOOMCRAWL_IN_STACK"
#: the scrapyd nodes inside the stack's network: every replica's address
SCRAPYD_SERVICE = "worker"
DEMO_URL = "http://demo:8000/"
READY_TIMEOUT = 300.0
DOWN_TIMEOUT = 120.0
#: how long ``down`` leaves the swarm to remove the stack before removing what is left
SWEEP_AFTER = 20.0
LOAD_TIMEOUT = 600.0


def swarm_manager() -> bool:
    """Whether the engine ``docker`` talks to is an active swarm manager."""
    try:
        result = subprocess.run(
            ["docker", "info", "--format", "{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}}"],
            capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.split() == ["active", "true"]


@dataclass
class Task:
    """One running task of a service: its replica's name, node and address."""

    name: str
    node: str
    state: str
    address: str
    error: str = ""


def not_running(service: str, tasks: Sequence[Task]) -> list[str]:
    """A service's tasks that do not run, where each is and its state, with its error
    (``redis.1 on h1: Preparing 5 minutes ago``), or that the service has no task."""
    waiting = [t for t in tasks if not t.state.startswith("Running")]
    if not waiting:
        return [f"{service}: no task scheduled"]
    return ["%s on %s: %s%s" % (t.name, t.node or "no node", t.state,
                                f" ({t.error})" if t.error else "") for t in waiting[:3]]


class Swarm:
    """This checkout's ``docker-compose.swarm.yml`` as a stack on the manager docker reaches."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.env = read_env_file(paths.env_file)
        self.stack = self.env.get("COMPOSE_PROJECT_NAME") or "bloomcrawl"
        self.network = f"{self.stack}_default"

    # --- what the stack is made of

    def worker_image(self) -> str:
        return "bloomcrawl/worker:%s" % (self.env.get("BLOOMCRAWL_TAG") or "latest")

    def images(self) -> list[str]:
        """The images the stack's tasks run (Grafana only when its image was pulled)."""
        images = [self.worker_image(),
                  self.env.get("REDIS_IMAGE") or "redis:7.2-bookworm",
                  self.env.get("PROMETHEUS_IMAGE") or "prom/prometheus:v2.53.0"]
        if self.grafana:
            images.append(self.env.get("GRAFANA_IMAGE") or "grafana/grafana-oss:11.1.0")
        return images

    @property
    def grafana(self) -> bool:
        return self.env.get("GRAFANA_ENABLED") == "1"

    def service(self, name: str) -> str:
        return f"{self.stack}_{name}"

    def docker(self, *args: str, engine: str | None = None, timeout: float = 120,
               check: bool = True) -> subprocess.CompletedProcess[str]:
        host = ["-H", engine] if engine else []
        return run(["docker", *host, *args], capture=True, check=check, timeout=timeout)

    # --- the nodes and their engines

    def nodes(self) -> list[dict[str, Any]]:
        """``docker node inspect`` of every node of the swarm."""
        ids = self.docker("node", "ls", "-q").stdout.split()
        data: list[dict[str, Any]] = json.loads(self.docker("node", "inspect", *ids).stdout)
        return data

    def engines(self) -> list[str]:
        """``SWARM_ENGINES``: the other nodes' engines, as ``docker -H`` takes them."""
        return [e.strip() for e in self.env.get("SWARM_ENGINES", "").replace(",", " ").split()
                if e.strip()]

    def label_redis_node(self, nodes: list[dict[str, Any]]) -> str:
        """The host name of the node Redis runs on; labels the manager when none is labelled."""
        labelled = [n for n in nodes if n["Spec"].get("Labels", {}).get(REDIS_LABEL) == "true"]
        if labelled:
            return ", ".join(n["Description"]["Hostname"] for n in labelled)
        me = self.docker("info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
        self.docker("node", "update", "--label-add", f"{REDIS_LABEL}=true", me)
        name = next((n["Description"]["Hostname"] for n in nodes if n["ID"] == me), me)
        say(f"no node is labelled {REDIS_LABEL}=true: Redis and its volume go on this"
            f" manager ({name})")
        return name

    def engine_nodes(self) -> dict[str, str]:
        """{node id: engine} of each engine in ``SWARM_ENGINES``."""
        found = {}
        for engine in self.engines():
            result = self.docker("info", "--format", "{{.Swarm.NodeID}}", engine=engine,
                                 check=False, timeout=60)
            node_id = result.stdout.strip()
            if result.returncode != 0 or not node_id:
                raise OpsError(f"SWARM_ENGINES: the engine {engine} does not answer, or is in no"
                               f" swarm: {(result.stderr or result.stdout).strip()[-300:]}")
            found[node_id] = engine
        return found

    def distribute_images(self, nodes: list[dict[str, Any]]) -> None:
        """Load the stack's images into every other ready node's engine, where they differ."""
        me = self.docker("info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
        engines = self.engine_nodes()
        others = [n for n in nodes if n["ID"] != me and n["Status"].get("State") == "ready"]
        missing = [n["Description"]["Hostname"] for n in others if n["ID"] not in engines]
        if missing:
            raise OpsError("no engine known for node(s) %s: list how to reach each in"
                           " SWARM_ENGINES in %s (e.g. ssh://user@host), so that `make up`"
                           " can load the images there" % (", ".join(missing),
                                                            self.paths.env_file))
        images = self.images()
        ids = {image: self.docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
               for image in images}
        names = {n["ID"]: n["Description"]["Hostname"] for n in nodes}

        def load(node_id: str) -> str:
            engine = engines[node_id]
            stale = [image for image in images if self.docker(
                "image", "inspect", "--format", "{{.Id}}", image, engine=engine, check=False,
                timeout=60).stdout.strip() != ids[image]]
            if not stale:
                return f"{names.get(node_id, node_id)}: images up to date"
            started = time.monotonic()
            save = subprocess.Popen(["docker", "save", *stale], stdout=subprocess.PIPE)
            try:
                loaded = subprocess.run(["docker", "-H", engine, "load", "-q"], stdin=save.stdout,
                                        capture_output=True, text=True, timeout=LOAD_TIMEOUT)
            finally:
                assert save.stdout is not None
                save.stdout.close()
                saved = save.wait(timeout=LOAD_TIMEOUT)
            if saved != 0 or loaded.returncode != 0:
                raise OpsError(f"loading the images into {engine} failed:"
                               f" {loaded.stderr.strip()[-500:]}")
            return "%s: loaded %d image(s) in %.0fs" % (names.get(node_id, node_id), len(stale),
                                                       time.monotonic() - started)

        wanted = [n["ID"] for n in others]
        if wanted:
            with ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="load") as pool:
                for line in pool.map(load, wanted):
                    say(line)

    # --- the stack

    def deploy_environment(self, workers: int, demo: bool) -> dict[str, str]:
        """The environment ``docker stack deploy`` interpolates the stack file with."""
        env = dict(os.environ)
        env.update(self.env)
        env.update(WORKERS=str(workers), DEMO_REPLICAS="1" if demo else "0",
                   GRAFANA_REPLICAS="1" if self.grafana else "0")
        return env

    def deploy(self, workers: int, demo: bool) -> None:
        run(["docker", "stack", "deploy", "--resolve-image", "never",
             "-c", str(self.paths.swarm_stack_file), self.stack],
            cwd=self.paths.root, env=self.deploy_environment(workers, demo), capture=True,
            timeout=300)

    def services(self) -> dict[str, tuple[int, int]]:
        """{service (without the stack's prefix): (running, desired)} of the stack."""
        out = self.docker("service", "ls", "--filter", f"label=com.docker.stack.namespace="
                          f"{self.stack}", "--format", "{{.Name}} {{.Replicas}}").stdout
        found = {}
        for line in out.splitlines():
            name, _, replicas = line.partition(" ")
            running, _, desired = replicas.split(" ")[0].partition("/")
            if running.isdigit() and desired.isdigit():
                found[name.removeprefix(self.stack + "_")] = (int(running), int(desired))
        return found

    def demo_deployed(self) -> bool:
        return self.services().get(DEMO_SERVICE, (0, 0))[1] > 0

    def wait_ready(self, timeout: float = READY_TIMEOUT, services: Sequence[str] = ()) -> None:
        """Until every service runs all its replicas (a task with a healthcheck counts once
        healthy); a task that failed is named, with its error, while it is waited for."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            waiting = {name: counts for name, counts in self.services().items()
                       if counts[0] < counts[1] and (not services or name in services)}
            if not waiting:
                return
            summary = ", ".join("%s %d/%d" % (n, *c) for n, c in sorted(waiting.items()))
            if summary != last:
                say("waiting for: " + summary)
                last = summary
            if time.monotonic() > deadline:
                raise OpsError(f"not running after {timeout:g}s: {summary}; " + "; ".join(
                    line for name in sorted(waiting)
                    for line in not_running(name, self.tasks(name, running_only=False))))
            time.sleep(2)

    def tasks(self, service: str, *, running_only: bool = True) -> list[Task]:
        """The tasks of ``service`` that should run, by replica; with their overlay address."""
        result = self.docker("service", "ps", self.service(service), "--no-trunc",
                             "--filter", "desired-state=running", "--format",
                             "{{.ID}}\t{{.Name}}\t{{.Node}}\t{{.CurrentState}}\t{{.Error}}",
                             check=False)
        tasks = []
        for line in result.stdout.splitlines():
            task_id, name, node, state, error = (line.split("\t") + [""] * 5)[:5]
            if running_only and not state.startswith("Running"):
                continue
            address = ""
            inspected = self.docker("inspect", "--type", "task", task_id, check=False)
            if inspected.returncode == 0:
                for attachment in json.loads(inspected.stdout)[0].get("NetworksAttachments") or []:
                    if attachment.get("Network", {}).get("Spec", {}).get("Name") == self.network:
                        address = (attachment.get("Addresses") or [""])[0].split("/")[0]
            tasks.append(Task(name, node, state, address, error))
        return sorted(tasks, key=lambda t: t.name)

    def scale(self, workers: int, timeout: float = READY_TIMEOUT) -> None:
        self.docker("service", "scale", "--detach", f"{self.service(WORKER_SERVICE)}={workers}")
        self.wait_ready(timeout, services=[WORKER_SERVICE])

    def start_demo(self) -> None:
        self.docker("service", "scale", "--detach", f"{self.service(DEMO_SERVICE)}=1")
        self.wait_ready(services=[DEMO_SERVICE])

    def logs(self, service: str | None, *, tail: int, follow: bool) -> None:
        names = [service] if service else sorted(self.services())
        for name in names:
            cmd = ["docker", "service", "logs", "--tail", str(tail), "--timestamps"]
            if follow:
                cmd.append("--follow")
            say(f"==> {self.service(name)} <==")
            run([*cmd, self.service(name)], check=False, timeout=None if follow else 120)

    def down(self, *, keep_data: bool, timeout: float = DOWN_TIMEOUT) -> None:
        """``docker stack rm``, then wait until its tasks and network are gone everywhere;
        without ``keep_data`` remove its volumes on every node's engine.

        ``docker stack rm`` tries to remove the network once, right after the services
        (a task still attached makes that fail, and it is not tried again), and a node
        that came back from a loss can keep its old task containers. After ``SWEEP_AFTER`` seconds
        the stack's leftover containers are removed on their engine and its networks on
        the manager, each round, until nothing of the stack is left.
        """
        self.docker("stack", "rm", self.stack, check=False)
        label = f"label=com.docker.stack.namespace={self.stack}"
        engines = [None, *self.engines()]
        start = time.monotonic()

        def left(engine: str | None) -> tuple[list[str], list[str]]:
            result = self.docker("ps", "-a", "-q", "--filter", label, engine=engine, check=False,
                                 timeout=60)
            if result.returncode != 0:  # an engine out of reach has nothing we can remove
                return [], []
            networks = []
            if engine is None:
                networks = self.docker("network", "ls", "-q", "--filter", label).stdout.split()
            return result.stdout.split(), networks

        while True:
            found = {engine: left(engine) for engine in engines}
            found = {engine: both for engine, both in found.items() if any(both)}
            if not found:
                break
            waited = time.monotonic() - start
            if waited > timeout:
                where = "; ".join(
                    f"{engine or 'the manager'}: {len(containers)} container(s)"
                    + (f", network(s) {' '.join(networks)}" if networks else "")
                    for engine, (containers, networks) in found.items())
                raise OpsError(f"the stack {self.stack} left containers or its network after"
                               f" {timeout:g}s ({where})")
            if waited > SWEEP_AFTER:
                for engine, (containers, networks) in found.items():
                    if containers:
                        self.docker("rm", "-f", *containers, engine=engine, check=False,
                                    timeout=60)
                    if networks:
                        self.docker("network", "rm", *networks, engine=engine, check=False,
                                    timeout=60)
            time.sleep(1)
        if keep_data:
            return
        for engine in engines:
            result = self.docker("volume", "ls", "-q", "--filter", label, engine=engine,
                                 check=False, timeout=60)
            volumes = result.stdout.split() if result.returncode == 0 else []
            if volumes:
                self.docker("volume", "rm", *volumes, engine=engine, timeout=60)

    # --- commands that talk to the cluster

    def run_inside(self, argv: Sequence[str], *, mounts: Sequence[Path] = ()) -> int:
        """``bloomcrawl argv`` in a container of the worker image on the stack's network.

        The checkout (and ``mounts``) are mounted read-only at their own paths, the
        command runs in the current directory when it is one of them; the cluster's
        secrets reach it through the environment, never the command line.
        """
        root = self.paths.root
        cwd = Path.cwd().resolve()
        dirs = [root, *(m.resolve() for m in mounts)]
        workdir = cwd if any(cwd == d or d in cwd.parents for d in dirs) else root
        env = dict(os.environ)
        env.update(
            REDIS_URL="redis://:%s@redis:6379/0" % self.env.get("REDIS_PASSWORD", ""),
            SCRAPYD_USERNAME=self.env.get("SCRAPYD_USERNAME", ""),
            SCRAPYD_PASSWORD=self.env.get("SCRAPYD_PASSWORD", ""),
        )
        cmd = ["docker", "run", "--rm", "-i", "--network", self.network, "--init",
               "-e", "REDIS_URL", "-e", "SCRAPYD_USERNAME", "-e", "SCRAPYD_PASSWORD",
               "-e", f"SCRAPYD_SERVICE={SCRAPYD_SERVICE}", "-e", f"{IN_STACK_ENV}=1",
               "-e", f"BLOOMCRAWL_ROOT={root}", "-e", "BLOOMCRAWL_STATE_DIR=/tmp/bloomcrawl",
               "-e", "BLOOMCRAWL_ENV_FILE=/tmp/bloomcrawl/.env", "-e", "HOME=/tmp",
               "-w", str(workdir)]
        for d in dict.fromkeys(dirs):
            cmd += ["-v", f"{d}:{d}:ro"]
        cmd += [self.worker_image(), "bloomcrawl", *argv]
        sys.stdout.flush()
        return subprocess.run(cmd, env=env, check=False).returncode
