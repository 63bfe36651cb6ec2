"""The ``bloomcrawl`` command: run a cluster, ship the project to it, crawl, watch.

``up`` starts the cluster with docker-compose when a Docker engine answers, and
otherwise as local processes on 127.0.0.1 (redis-server, N scrapyd, the
exporter, Prometheus when installed), recording every pid in the state
directory (``.run/``) so that ``down`` stops exactly those. Either way the
other commands find the cluster from that state: Redis, the scrapyd nodes and
their credentials (from ``.env``, which ``up`` creates with random secrets).

``deploy`` builds the egg once (``scrapyd-deploy --build-egg``) and uploads it
to every node, failing when any node fails; ``schedule`` starts a job on every
node; ``seed`` pushes start URLs; ``crawl`` does both; ``status`` and
``filter-info`` read the cluster through :mod:`bloomcrawl.inspect`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bloomcrawl import __version__
from bloomcrawl.core import defaults, keys
from bloomcrawl.ops import inspection as inspect

DEFAULT_PROJECT = "bloomcrawl"
DEFAULT_SPIDER = "site"
DEFAULT_WORKERS = 3
COMPOSE_SERVICE = "worker"
SCRAPYD_PORT = 6800
HEALTH_TIMEOUT = 300.0
HTTP_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
# scrapyd nodes, Redis and the demo site are this cluster's own: never through a proxy
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class CliError(Exception):
    """A failure the command reports in one line and exits 1 for."""


def say(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


# --- where things are -------------------------------------------------------------


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
    def cluster_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def local_dir(self) -> Path:
        return self.state_dir / "local"

    def project_dir(self) -> Path:
        """The Scrapy project scrapyd-deploy packages (the directory of scrapy.cfg)."""
        for candidate in (self.root / "crawler", Path(__file__).resolve().parent.parent):
            if (candidate / "scrapy.cfg").is_file():
                return candidate
        raise CliError(f"no scrapy.cfg found in {self.root}/crawler")


# --- .env -------------------------------------------------------------------------


ENV_HEADER = """\
# bloomcrawl cluster settings, written by `bloomcrawl up` (make up) with random
# secrets. Keep this file private; docker-compose reads it. See .env.example.
"""


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name.strip()] = value
    return values


def new_secret() -> str:
    """URL-safe without escaping: it goes into redis:// URLs and basic auth."""
    return secrets.token_hex(16)


def ensure_env_file(path: Path) -> dict[str, str]:
    """Create ``path`` with random secrets when missing; add missing secrets otherwise."""
    values = read_env_file(path)
    wanted = {
        "COMPOSE_PROJECT_NAME": "bloomcrawl",
        "REDIS_PASSWORD": new_secret(),
        "SCRAPYD_USERNAME": "bloomcrawl",
        "SCRAPYD_PASSWORD": new_secret(),
        "GRAFANA_ADMIN_PASSWORD": new_secret(),
    }
    missing = {name: value for name, value in wanted.items() if not values.get(name)}
    if not missing:
        return values
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    with path.open("a") as f:
        if not existed:
            f.write(ENV_HEADER)
        for name, value in missing.items():
            f.write(f"{name}={value}\n")
    path.chmod(0o600)
    say("{} {} ({})".format("updated" if existed else "created", path, ", ".join(missing)))
    return read_env_file(path)


# --- the cluster's state ----------------------------------------------------------


@dataclass
class ProcessRecord:
    """A local process ``up`` started: its own session, so its group is its pid."""

    name: str
    pid: int
    start_ticks: int
    log: str
    port: int | None = None


@dataclass
class Cluster:
    """What the commands need to reach a running cluster."""

    mode: str  # "docker" or "local"
    redis_url: str
    username: str
    password: str
    project_name: str = "bloomcrawl"
    processes: list[ProcessRecord] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = {
            "mode": self.mode,
            "project_name": self.project_name,
            "ports": self.ports,
            "processes": [p.__dict__ for p in self.processes],
        }
        if self.mode == "local":
            data["redis_url"] = self.redis_url
        return data


def load_cluster(paths: Paths) -> Cluster | None:
    """The cluster ``up`` recorded, or ``None``. Secrets are read from ``.env``."""
    if not paths.cluster_file.is_file():
        return None
    data = json.loads(paths.cluster_file.read_text())
    env = read_env_file(paths.env_file)
    ports = {str(k): int(v) for k, v in data.get("ports", {}).items()}
    if data["mode"] == "docker":
        redis_url = "redis://:%s@127.0.0.1:%d/0" % (
            env.get("REDIS_PASSWORD", ""), int(env.get("REDIS_PORT") or 6379))
    else:
        redis_url = data["redis_url"]
    return Cluster(
        mode=data["mode"],
        redis_url=redis_url,
        username=env.get("SCRAPYD_USERNAME", ""),
        password=env.get("SCRAPYD_PASSWORD", ""),
        project_name=data.get("project_name", "bloomcrawl"),
        processes=[ProcessRecord(**p) for p in data.get("processes", [])],
        ports=ports,
    )


def save_cluster(paths: Paths, cluster: Cluster) -> None:
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    tmp = paths.cluster_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(cluster.to_json(), indent=2) + "\n")
    tmp.replace(paths.cluster_file)


# --- processes --------------------------------------------------------------------


def run(cmd: Sequence[str], *, cwd: Path | None = None, capture: bool = False,
        check: bool = True, timeout: float | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            list(cmd), cwd=cwd, text=True, timeout=timeout, env=env,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
        )
    except FileNotFoundError as exc:
        raise CliError(f"{cmd[0]}: command not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise CliError("{} timed out after {}s".format(" ".join(cmd[:3]), timeout)) from exc
    if check and result.returncode != 0:
        detail = (result.stderr or "").strip()[-2000:] if capture else ""
        raise CliError("%s failed (exit %d)%s" % (
            " ".join(cmd[:4]), result.returncode, ":\n" + detail if detail else ""))
    return result


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone.

    A pid with another start time is a recycled number, not the process we started.
    """
    try:
        stat = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces: split after its closing paren
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def is_ours(record: ProcessRecord) -> bool:
    return process_start_ticks(record.pid) == record.start_ticks


def stop_process(record: ProcessRecord, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process group ``up`` started (scrapyd's jobs too), then SIGKILL."""
    if not is_ours(record):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(record.pid):
            return
        time.sleep(0.1)
    warn("%s (pid %d) did not stop in %gs: SIGKILL" % (record.name, record.pid, timeout))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while group_alive(record.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            # reap our own children so they do not linger as zombies
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(int(entry.name), os.WNOHANG)
            return True
    return False


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int, taken: set[int]) -> int:
    """``preferred`` when it is free, else any free port; never one in ``taken``."""
    if preferred and preferred not in taken and port_is_free(preferred):
        taken.add(preferred)
        return preferred
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port
    raise CliError("no free port on 127.0.0.1")


def wait_for(what: str, check: Any, timeout: float, proc: ProcessRecord | None = None) -> None:
    """Poll ``check()`` until it is true; fail after ``timeout`` or when ``proc`` died."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if proc is not None and not is_ours(proc):
            raise CliError(f"{what} exited; see {proc.log}")
        if time.monotonic() > deadline:
            raise CliError("{} not ready after {:g}s{}".format(
                what, timeout, f"; see {proc.log}" if proc else ""))
        time.sleep(0.2)


# --- scrapyd over HTTP ------------------------------------------------------------


@dataclass
class Node:
    url: str
    username: str
    password: str

    def request(self, path: str, data: dict[str, Any] | list[tuple[str, str]] | None = None,
                *, body: bytes | None = None, content_type: str | None = None,
                timeout: float = HTTP_TIMEOUT) -> Any:
        """A scrapyd JSON endpoint; raises :class:`CliError` on any failure."""
        url = self.url.rstrip("/") + "/" + path
        if data is not None:
            body = urllib.parse.urlencode(data).encode()
            content_type = "application/x-www-form-urlencoded"
        request = urllib.request.Request(url, data=body)
        if content_type:
            request.add_header("Content-Type", content_type)
        if self.username:
            token = base64.b64encode((f"{self.username}:{self.password}").encode())
            request.add_header("Authorization", "Basic " + token.decode())
        try:
            with _OPENER.open(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read(500).decode(errors="replace").strip()
            raise CliError("%s: HTTP %d %s %s" % (url, exc.code, exc.reason, detail)) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise CliError("{}: {}".format(url, getattr(exc, "reason", exc))) from exc
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise CliError(f"{url}: not JSON: {raw[:200]!r}") from exc
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            message = answer.get("message", answer) if isinstance(answer, dict) else answer
            raise CliError(f"{url}: {str(message).strip()[-1500:]}")
        return answer


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts: list[bytes] = []
    for name, value in fields.items():
        parts.append((f"--{boundary}\r\nContent-Disposition: form-data;"
                      f' name="{name}"\r\n\r\n{value}\r\n').encode())
    for name, (filename, content) in files.items():
        head = (f"--{boundary}\r\nContent-Disposition: form-data;"
                f' name="{name}"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n")
        parts.append(head.encode() + content + b"\r\n")
    parts.append((f"--{boundary}--\r\n").encode())
    return b"".join(parts), "multipart/form-data; boundary=" + boundary


def for_each_node(nodes: Sequence[Node], action: Any) -> list[tuple[Node, Any, str | None]]:
    """``action(node)`` on every node at once: (node, result, error) in node order."""
    def attempt(node: Node) -> tuple[Node, Any, str | None]:
        try:
            return node, action(node), None
        except CliError as exc:
            return node, None, str(exc)

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        return list(pool.map(attempt, nodes))


# --- docker -----------------------------------------------------------------------


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

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        env = read_env_file(paths.env_file)
        self.project = env.get("COMPOSE_PROJECT_NAME") or "bloomcrawl"
        self.grafana = env.get("GRAFANA_ENABLED") == "1"

    def base(self, *profiles: str) -> list[str]:
        cmd = [*compose_command(), "--env-file", str(self.paths.env_file),
               "-f", str(self.paths.compose_file), "-p", self.project]
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
            bindings = (c["NetworkSettings"].get("Ports") or {}).get("%d/tcp" % SCRAPYD_PORT)
            if not bindings:
                continue
            number = int(c["Config"]["Labels"].get("com.docker.compose.container-number", 0))
            host = bindings[0].get("HostIp") or "127.0.0.1"
            if host in ("0.0.0.0", "::"):
                host = "127.0.0.1"
            urls.append((number, "http://{}:{}".format(host, bindings[0]["HostPort"])))
        return [url for _, url in sorted(urls)]

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT, services: Sequence[str] = ()) -> None:
        """Until every running container with a healthcheck is healthy."""
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
                if not state.get("Running"):
                    if state.get("Status") in ("exited", "dead") and state.get("ExitCode"):
                        logs = run(["docker", "logs", "--tail", "30", c["Id"]], capture=True,
                                   check=False, timeout=30)
                        raise CliError("{} exited with {}:\n{}{}".format(
                            name, state.get("ExitCode"), logs.stdout, logs.stderr))
                    continue
                health = (state.get("Health") or {}).get("Status")
                if health == "unhealthy":
                    log = (state["Health"].get("Log") or [{}])[-1].get("Output", "")
                    raise CliError(f"{name} is unhealthy: {log.strip()[-500:]}")
                if health not in (None, "healthy"):
                    waiting.append(name)
            if not waiting:
                return
            summary = ", ".join(sorted(waiting))
            if summary != last:
                say("waiting for: " + summary)
                last = summary
            if time.monotonic() > deadline:
                raise CliError(f"not healthy after {timeout:g}s: {summary}")
            time.sleep(1)


# --- finding the cluster from a command -------------------------------------------


@dataclass
class Target:
    """Redis, the scrapyd nodes and their credentials, however they were given."""

    redis_url: str
    nodes: list[Node]
    cluster: Cluster | None
    compose: Compose | None

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, socket_connect_timeout=5, socket_timeout=30)


def resolve_target(args: argparse.Namespace, paths: Paths, *, need_nodes: bool) -> Target:
    cluster = load_cluster(paths)
    env = read_env_file(paths.env_file)
    username = (getattr(args, "username", None) or os.environ.get("SCRAPYD_USERNAME")
                or (cluster.username if cluster else "") or env.get("SCRAPYD_USERNAME", ""))
    password = (os.environ.get("SCRAPYD_PASSWORD")
                or (cluster.password if cluster else "") or env.get("SCRAPYD_PASSWORD", ""))
    redis_url = (getattr(args, "redis_url", None) or os.environ.get("REDIS_URL")
                 or (cluster.redis_url if cluster else "") or "redis://127.0.0.1:6379/0")
    compose = Compose(paths) if cluster is not None and cluster.mode == "docker" else None
    urls: list[str] = []
    if getattr(args, "nodes", None):
        urls = [u for u in args.nodes.split(",") if u.strip()]
    elif os.environ.get("SCRAPYD_NODES"):
        urls = [u for u in os.environ["SCRAPYD_NODES"].split(",") if u.strip()]
    elif getattr(args, "scrapyd_service", None):
        urls = inspect.resolve_service(args.scrapyd_service, SCRAPYD_PORT)
    elif cluster is not None and need_nodes:
        if compose is not None:
            urls = compose.worker_urls()
        else:
            urls = ["http://127.0.0.1:%s" % p.port for p in cluster.processes
                    if p.name.startswith("scrapyd-") and p.port]
    if need_nodes and not urls:
        raise CliError("no scrapyd nodes: run `make up`, or pass --nodes URL,... (SCRAPYD_NODES)")
    nodes = [Node(inspect.normalise_node_url(u), username, password) for u in urls]
    return Target(redis_url, nodes, cluster, compose)


# --- up / down / scale ------------------------------------------------------------


def cmd_up(args: argparse.Namespace, paths: Paths) -> int:
    if args.workers < 1:
        raise CliError("--workers must be at least 1")
    existing = load_cluster(paths)
    mode = "local" if args.local else "docker" if args.docker else None
    if existing is not None:
        if mode and mode != existing.mode:
            raise CliError(f"a {existing.mode} cluster is already up; `make down` first")
        mode = existing.mode
    if mode is None:
        if docker_reachable():
            mode = "docker"
        else:
            say("no Docker engine is reachable: running the cluster as local processes"
                " on 127.0.0.1 (`make down` stops them)")
            mode = "local"
    elif mode == "docker" and not docker_reachable():
        raise CliError("no Docker engine is reachable (is dockerd running?)")
    env = ensure_env_file(paths.env_file)
    if mode == "docker":
        return docker_up(paths, args.workers, args.demo, args.build)
    return LocalCluster(paths, env).up(args.workers, demo=args.demo)


def docker_up(paths: Paths, workers: int, demo: bool, build: bool) -> int:
    started = time.monotonic()
    if build or not Compose(paths).containers(COMPOSE_SERVICE):
        run([str(paths.root / "scripts" / "build-images.sh"), str(paths.env_file)],
            cwd=paths.root)
    compose = Compose(paths)
    save_cluster(paths, Cluster("docker", "", "", "", project_name=compose.project))
    profiles = (["grafana"] if compose.grafana else []) + (["demo"] if demo else [])
    compose.up_workers(workers, profiles)
    compose.wait_healthy()
    urls = compose.worker_urls()
    say("cluster up in %.0fs: %d worker(s): %s" % (time.monotonic() - started, len(urls),
                                                  " ".join(urls)))
    env = read_env_file(paths.env_file)
    say("redis: 127.0.0.1:{}   prometheus: http://127.0.0.1:{}   exporter: http://127.0.0.1:{}"
        "/metrics".format(env.get("REDIS_PORT", "6379"), env.get("PROMETHEUS_PORT", "9090"),
                      env.get("EXPORTER_PORT", "9410")))
    if compose.grafana:
        say("grafana: http://127.0.0.1:%s (admin / GRAFANA_ADMIN_PASSWORD in %s)"
            % (env.get("GRAFANA_PORT", "3000"), paths.env_file))
    else:
        say("grafana: not started (its image needs a container registry; see README.md)")
    return 0


def cmd_down(args: argparse.Namespace, paths: Paths) -> int:
    cluster = load_cluster(paths)
    if cluster is not None and cluster.mode == "local":
        LocalCluster(paths, read_env_file(paths.env_file)).down(keep_data=args.keep_data)
    elif cluster is not None or (paths.env_file.is_file() and docker_reachable()):
        if not docker_reachable():
            raise CliError("no Docker engine is reachable to stop the cluster with")
        compose = Compose(paths)
        cmd = ["down", "--remove-orphans", "--timeout", "10"]
        if not args.keep_data:
            cmd.append("--volumes")
        compose.run(*cmd, profiles=["demo", "grafana"])
        if paths.cluster_file.exists():
            paths.cluster_file.unlink()
        say("cluster down%s" % (" (volumes kept)" if args.keep_data else ""))
    else:
        say(f"no cluster recorded in {paths.state_dir}")
    return 0


def cmd_scale(args: argparse.Namespace, paths: Paths) -> int:
    cluster = load_cluster(paths)
    if cluster is None:
        raise CliError("no cluster is up: `make up WORKERS=%d`" % args.workers)
    if cluster.mode == "local":
        return LocalCluster(paths, read_env_file(paths.env_file)).scale(args.workers)
    compose = Compose(paths)
    profiles = ["grafana"] if compose.grafana else []
    compose.up_workers(args.workers, profiles, only_workers=True)
    compose.wait_healthy(services=[COMPOSE_SERVICE])
    urls = compose.worker_urls()
    say("%d worker(s): %s" % (len(urls), " ".join(urls)))
    say("new workers have no project yet: `make deploy` reaches every worker")
    return 0


# --- the local-process cluster ----------------------------------------------------


class LocalCluster:
    """The compose topology as processes on 127.0.0.1, for machines without Docker."""

    def __init__(self, paths: Paths, env: dict[str, str]) -> None:
        self.paths = paths
        self.env = env
        self.dir = paths.local_dir
        self.python = sys.executable

    def _spawn(self, name: str, cmd: list[str], *, cwd: Path | None = None,
               env: dict[str, str] | None = None, port: int | None = None) -> ProcessRecord:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.dir / (f"{name}.log")
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=cwd or self.dir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        ticks = process_start_ticks(proc.pid)
        if ticks is None:
            raise CliError(f"{name} exited at once; see {log}")
        return ProcessRecord(name=name, pid=proc.pid, start_ticks=ticks, log=str(log), port=port)

    def _child_env(self, redis_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            REDIS_URL=redis_url,
            SCRAPYD_USERNAME=self.env["SCRAPYD_USERNAME"],
            SCRAPYD_PASSWORD=self.env["SCRAPYD_PASSWORD"],
            PYTHONUNBUFFERED="1",
        )
        # the jobs scrapyd starts import the project from the egg, not from this checkout
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        env.pop("PYTHONPATH", None)
        return env

    def up(self, workers: int, *, demo: bool = False) -> int:
        started = time.monotonic()
        cluster = load_cluster(self.paths)
        created = cluster is None
        try:
            if cluster is None:
                cluster = self._start_redis()
            alive = [p for p in cluster.processes if is_ours(p)]
            if len(alive) != len(cluster.processes):
                dead = sorted({p.name for p in cluster.processes} - {p.name for p in alive})
                raise CliError("recorded processes are gone (%s): `make down`, then `make up`"
                               % ", ".join(dead))
            self._scale_to(cluster, workers)
            self._ensure_prometheus(cluster)
            if demo:
                self.start_demo(cluster)
        except BaseException:
            if created:
                self.down(keep_data=False, quiet=True)
            raise
        urls = ["http://127.0.0.1:%s" % p.port for p in cluster.processes
                if p.name.startswith("scrapyd-")]
        say("local cluster up in %.0fs: %d scrapyd node(s): %s" % (
            time.monotonic() - started, len(urls), " ".join(urls)))
        say("redis: 127.0.0.1:%d   exporter: http://127.0.0.1:%d/metrics%s" % (
            cluster.ports["redis"], cluster.ports["exporter"],
            "   prometheus: http://127.0.0.1:%d" % cluster.ports["prometheus"]
            if "prometheus" in cluster.ports else "   prometheus: not installed"))
        say(f"grafana: not started in local mode; state and logs in {self.dir}")
        return 0

    def _taken_ports(self, cluster: Cluster) -> set[int]:
        return {p.port for p in cluster.processes if p.port} | set(cluster.ports.values())

    def _start_redis(self) -> Cluster:
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise CliError("redis-server is not installed (apt-get install redis-server)")
        redis_port = pick_port(int(self.env.get("REDIS_PORT") or 6379), set())
        password = self.env["REDIS_PASSWORD"]
        redis_url = "redis://:%s@127.0.0.1:%d/0" % (password, redis_port)
        cluster = Cluster("local", redis_url, self.env["SCRAPYD_USERNAME"],
                          self.env["SCRAPYD_PASSWORD"], ports={"redis": redis_port})
        data_dir = self.dir / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        record = self._spawn("redis", [
            redis_server, "--port", str(redis_port), "--bind", "127.0.0.1",
            "--daemonize", "no", "--dir", str(data_dir), "--appendonly", "yes",
            "--requirepass", password, "--save", "",
        ], port=redis_port)
        cluster.processes.append(record)
        save_cluster(self.paths, cluster)
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=1)
        wait_for("redis-server", client.ping, 20, record)
        client.close()
        return cluster

    def _ensure_prometheus(self, cluster: Cluster) -> None:
        prometheus = shutil.which("prometheus")
        if prometheus is None or any(p.name == "prometheus" for p in cluster.processes):
            return
        port = pick_port(int(self.env.get("PROMETHEUS_PORT") or 9090), self._taken_ports(cluster))
        config = self._prometheus_config(cluster.ports["exporter"], port)
        record = self._spawn("prometheus", [
            prometheus, f"--config.file={config}",
            "--storage.tsdb.path=%s" % (self.dir / "prometheus-data"),
            "--web.listen-address=127.0.0.1:%d" % port,
        ], port=port)
        cluster.ports["prometheus"] = port
        cluster.processes.append(record)
        save_cluster(self.paths, cluster)
        wait_for("prometheus", lambda: http_ok("http://127.0.0.1:%d/-/ready" % port), 60, record)

    def _exporter_env(self, cluster: Cluster) -> dict[str, str]:
        env = self._child_env(cluster.redis_url)
        env["SCRAPYD_NODES"] = ",".join(
            "http://127.0.0.1:%s" % p.port for p in cluster.processes
            if p.name.startswith("scrapyd-"))
        return env

    def _prometheus_config(self, exporter_port: int, prometheus_port: int) -> Path:
        """monitoring/prometheus/ with the compose addresses rewritten to 127.0.0.1 ports."""
        source = self.paths.root / "monitoring" / "prometheus"
        target = self.dir / "prometheus"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        exporter = "127.0.0.1:%d" % exporter_port
        if (source / "prometheus.yml").is_file():
            for path in source.rglob("*"):
                if path.is_file():
                    dest = target / path.relative_to(source)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_text(path.read_text().replace("exporter:9410", exporter).replace(
                        "localhost:9090", "127.0.0.1:%d" % prometheus_port))
        else:
            (target / "prometheus.yml").write_text(
                "global:\n  scrape_interval: 5s\nscrape_configs:\n"
                "  - job_name: bloomcrawl\n    static_configs:\n"
                f"      - targets: ['{exporter}']\n")
        return target / "prometheus.yml"

    def _start_scrapyd(self, cluster: Cluster, index: int, taken: set[int]) -> ProcessRecord:
        port = pick_port(SCRAPYD_PORT + index - 1, taken)
        node_dir = self.dir / ("scrapyd-%d" % index)
        node_dir.mkdir(parents=True, exist_ok=True)
        max_proc = int(self.env.get("SCRAPYD_MAX_PROC") or 2)
        (node_dir / "scrapyd.conf").write_text(
            "[scrapyd]\nbind_address = 127.0.0.1\nhttp_port = %d\nmax_proc = %d\n"
            "poll_interval = 1.0\neggs_dir = %s\nlogs_dir = %s\ndbs_dir = %s\nitems_dir =\n"
            % (port, max_proc, node_dir / "eggs", node_dir / "logs", node_dir / "dbs"))
        env = self._child_env(cluster.redis_url)
        env["SCRAPYD_BIND_ADDRESS"] = "127.0.0.1"
        env["SCRAPYD_HTTP_PORT"] = str(port)
        env["HOME"] = str(node_dir)  # Scrapy keeps job state under ~/.local/state
        record = self._spawn("scrapyd-%d" % index, [self.python, "-m", "scrapyd", "--pidfile="],
                             cwd=node_dir, env=env, port=port)
        cluster.processes.append(record)
        save_cluster(self.paths, cluster)
        node = Node("http://127.0.0.1:%d" % port, cluster.username, cluster.password)
        wait_for(record.name, lambda: node.request("daemonstatus.json", timeout=2), 60, record)
        return record

    def _scale_to(self, cluster: Cluster, workers: int) -> None:
        nodes = sorted((p for p in cluster.processes if p.name.startswith("scrapyd-")),
                       key=lambda p: int(p.name.split("-")[1]))
        changed = False
        if len(nodes) < workers:
            taken = self._taken_ports(cluster)
            for index in range(len(nodes) + 1, workers + 1):
                self._start_scrapyd(cluster, index, taken)
            changed = True
        for record in nodes[workers:]:
            stop_process(record)
            cluster.processes.remove(record)
            save_cluster(self.paths, cluster)
            changed = True
        if changed or not any(p.name == "exporter" for p in cluster.processes):
            self._restart_exporter(cluster)

    def _restart_exporter(self, cluster: Cluster) -> None:
        """The exporter learns the node list when it starts: (re)start it with the list."""
        for record in [p for p in cluster.processes if p.name == "exporter"]:
            stop_process(record)
            cluster.processes.remove(record)
        port = cluster.ports.get("exporter") or pick_port(
            int(self.env.get("EXPORTER_PORT") or 9410), self._taken_ports(cluster))
        cluster.ports["exporter"] = port
        record = self._spawn("exporter", [
            self.python, "-m", "bloomcrawl.ops.exporter", "--bind", "127.0.0.1",
            "--port", str(port), "--redis-url", cluster.redis_url,
        ], env=self._exporter_env(cluster), port=port)
        cluster.processes.append(record)
        save_cluster(self.paths, cluster)
        wait_for("exporter", lambda: http_ok("http://127.0.0.1:%d/metrics" % port), 30, record)

    def scale(self, workers: int) -> int:
        cluster = load_cluster(self.paths)
        if cluster is None:
            raise CliError("no cluster is up")
        if workers < 1:
            raise CliError("WORKERS must be at least 1")
        self._scale_to(cluster, workers)
        urls = ["http://127.0.0.1:%s" % p.port for p in cluster.processes
                if p.name.startswith("scrapyd-")]
        say("%d scrapyd node(s): %s" % (len(urls), " ".join(urls)))
        say("new nodes have no project yet: `make deploy` reaches every node")
        return 0

    def start_demo(self, cluster: Cluster, pages: int | None = None,
                   delay_ms: float | None = None) -> str:
        """Start the demo site once; its URL."""
        for record in cluster.processes:
            if record.name == "demo" and is_ours(record):
                return "http://127.0.0.1:%s/" % record.port
        port = pick_port(int(self.env.get("DEMO_PORT") or 8000), self._taken_ports(cluster))
        cmd = [self.python, "-m", "bloomcrawl.ops.demo_site", "--host", "127.0.0.1", "--port", str(port),
               "--pages", str(pages or int(self.env.get("DEMO_PAGES") or 2000))]
        cmd += ["--delay-ms", str(delay_ms if delay_ms is not None
                                  else float(self.env.get("DEMO_DELAY_MS") or 0))]
        record = self._spawn("demo", cmd, port=port)
        cluster.processes.append(record)
        cluster.ports["demo"] = port
        save_cluster(self.paths, cluster)
        wait_for("demo site", lambda: http_ok("http://127.0.0.1:%d/__stats" % port), 30, record)
        return "http://127.0.0.1:%d/" % port

    def down(self, *, keep_data: bool, quiet: bool = False) -> None:
        cluster = load_cluster(self.paths)
        if cluster is None:
            return
        # scrapyd nodes (and their jobs) first, Redis last
        order = sorted(cluster.processes, key=lambda p: (p.name == "redis", p.name))
        for record in order:
            if is_ours(record):
                if not quiet:
                    say("stopping %s (pid %d)" % (record.name, record.pid))
                stop_process(record)
        self.paths.cluster_file.unlink(missing_ok=True)
        if not keep_data and self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        if not quiet:
            say("local cluster down%s" % (f" (data kept in {self.dir})" if keep_data else ""))


def cli_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def http_ok(url: str) -> bool:
    with _OPENER.open(url, timeout=3) as response:
        return bool(200 <= response.status < 300)


# --- deploy / schedule / seed -----------------------------------------------------


def build_egg(project_dir: Path, out: Path) -> None:
    """``scrapyd-deploy --build-egg``: the same egg ``scrapyd-deploy`` would upload."""
    result = run([sys.executable, "-m", "scrapyd_client.deploy", "--build-egg", str(out)],
                 cwd=project_dir, capture=True, check=False, timeout=300)
    if result.returncode != 0 or not out.is_file():
        raise CliError(f"building the egg in {project_dir} failed:\n"
                       f"{result.stdout[-2000:]}{result.stderr[-2000:]}")


def cmd_deploy(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(args, paths, need_nodes=True)
    # like scrapyd-deploy: a timestamp, so scrapyd (which runs the highest) runs the newest
    version = args.version or str(int(time.time()))
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-egg-") as tmp:
        if args.egg:
            egg = Path(args.egg)
        else:
            egg = Path(tmp) / (f"{args.project}-{version}.egg")
            build_egg(paths.project_dir(), egg)
        content = egg.read_bytes()
    body, content_type = multipart({"project": args.project, "version": version},
                                   {"egg": ("project.egg", content)})

    def upload(node: Node) -> Any:
        return node.request("addversion.json", body=body, content_type=content_type)

    results = for_each_node(target.nodes, upload)
    failed = 0
    for node, answer, error in results:
        if error:
            failed += 1
            say(f"FAIL {node.url}: {error}")
        else:
            say("ok   {}: {} {}, spiders: {}".format(node.url, args.project, version,
                                                 answer.get("spiders")))
    say("deployed %s %s to %d of %d node(s)" % (args.project, version,
                                                len(results) - failed, len(results)))
    return 1 if failed else 0


def parse_pairs(pairs: Sequence[str], what: str) -> list[tuple[str, str]]:
    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"{what} {pair!r}: expected NAME=VALUE")
        out.append((name, value))
    return out


def schedule_on(nodes: Sequence[Node], project: str, spider: str,
                settings: Sequence[tuple[str, str]],
                spider_args: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Start one job on every node; {node url: job id}. Fails when any node fails."""
    data: list[tuple[str, str]] = [("project", project), ("spider", spider)]
    data += [("setting", "{}={}".format(*pair)) for pair in settings]
    data += list(spider_args)
    results = for_each_node(nodes, lambda node: node.request("schedule.json", data))
    errors = [f"{node.url}: {error}" for node, _, error in results if error]
    if errors:
        raise CliError("scheduling %s failed on %d of %d node(s):\n  %s" % (
            spider, len(errors), len(results), "\n  ".join(errors)))
    return {node.url: str(answer["jobid"]) for node, answer, _ in results}


def crawl_arguments(args: argparse.Namespace, urls: Sequence[str]) -> list[tuple[str, str]]:
    spider_args = parse_pairs(args.arg or [], "spider argument")
    names = {name for name, _ in spider_args}
    if args.allowed_domains:
        spider_args.append(("allowed_domains", args.allowed_domains))
    elif urls and "allowed_domains" not in names:
        hosts = sorted({urllib.parse.urlsplit(u).hostname or "" for u in urls} - {""})
        spider_args.append(("allowed_domains", ",".join(hosts)))
    if args.depth_limit is not None:
        spider_args.append(("depth_limit", str(args.depth_limit)))
    return spider_args


def crawl_settings(args: argparse.Namespace) -> list[tuple[str, str]]:
    settings = parse_pairs(args.setting or [], "setting")
    if args.max_idle is not None and "MAX_IDLE_TIME_BEFORE_CLOSE" not in dict(settings):
        settings.append(("MAX_IDLE_TIME_BEFORE_CLOSE", str(args.max_idle)))
    return settings


def cmd_schedule(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(args, paths, need_nodes=True)
    jobs = schedule_on(target.nodes, args.project, args.spider, crawl_settings(args),
                       crawl_arguments(args, []))
    for url, job in jobs.items():
        say(f"{url} {job}")
    return 0


def seed(client: redis.Redis, spider: str, urls: Sequence[str]) -> int:
    key = keys.spider_key(defaults.START_URLS_KEY, spider)
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CliError(f"not an http(s) URL: {url!r}")
    if urls:
        client.rpush(key, *urls)
    return len(urls)


def cmd_seed(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(args, paths, need_nodes=False)
    count = seed(target.redis(), args.spider, args.urls)
    say("pushed %d start URL(s) to %s" % (count, keys.spider_key(
        defaults.START_URLS_KEY, args.spider)))
    return 0


def cmd_crawl(args: argparse.Namespace, paths: Paths) -> int:
    if not args.urls:
        raise CliError("give at least one start URL (make crawl URL=https://...)")
    target = resolve_target(args, paths, need_nodes=True)
    jobs = schedule_on(target.nodes, args.project, args.spider, crawl_settings(args),
                       crawl_arguments(args, args.urls))
    count = seed(target.redis(), args.spider, args.urls)
    say("seeded %d URL(s); %s running on %d node(s)" % (count, args.spider, len(jobs)))
    if args.wait:
        return watch(target, args.spider, args.project, jobs, args.timeout)
    return 0


def job_states(target: Target, project: str, jobs: dict[str, str]) -> dict[str, str]:
    """{job id: pending | running | finished | unknown} across the nodes that run them."""
    states = {job: "unknown" for job in jobs.values()}
    wanted = {url: job for url, job in jobs.items()}

    def ask(node: Node) -> Any:
        return node.request(f"listjobs.json?project={urllib.parse.quote(project)}", timeout=10)

    for _node, answer, _error in for_each_node([n for n in target.nodes if n.url in wanted], ask):
        if answer is None:
            continue
        for state in ("pending", "running", "finished"):
            for job in answer.get(state, []):
                if job.get("id") in states:
                    states[job["id"]] = state
    return states


def frontier_line(client: redis.Redis, spider: str) -> tuple[str, inspect.SpiderState | None]:
    state = None
    with contextlib.suppress(redis.RedisError):
        meta = keys.meta_key(keys.spider_key(defaults.FILTER_KEY, spider))
        state = inspect.spider_state(client, meta)
    stats: dict[str, int] = {}
    with contextlib.suppress(redis.RedisError):
        raw = client.hgetall(keys.spider_key(defaults.STATS_KEY, spider))
        stats = {cli_text(k): int(v) for k, v in raw.items()}
    if state is None:
        return ("pages %d  items %d" % (stats.get("pages", 0), stats.get("items", 0)), None)
    return ("pages %d  items %d  queue %s  leased %s  filtered %d  requeued %d" % (
        stats.get("pages", 0), stats.get("items", 0), state.queue_length, state.leased,
        stats.get("filtered", 0), stats.get("requeued", 0)), state)


def watch(target: Target, spider: str, project: str, jobs: dict[str, str],
          timeout: float) -> int:
    """Print progress every 2 s until every job finished; 1 on timeout."""
    client = target.redis()
    started = time.monotonic()
    deadline = started + timeout
    while True:
        states = job_states(target, project, jobs)
        line, _ = frontier_line(client, spider)
        counts = {s: sum(1 for v in states.values() if v == s)
                  for s in ("pending", "running", "finished", "unknown")}
        say("[%4.0fs] %s  jobs: %d running, %d pending, %d finished" % (
            time.monotonic() - started, line, counts["running"], counts["pending"],
            counts["finished"]))
        if counts["finished"] + counts["unknown"] == len(states) and counts["finished"]:
            return 0
        if time.monotonic() > deadline:
            warn(f"jobs still running after {timeout:g}s")
            return 1
        time.sleep(2)


def clear_spider(client: redis.Redis, spider: str) -> int:
    """Delete a spider's frontier: filter, queue, leases, stats, start URLs, items."""
    frontier = keys.FrontierKeys(spider)
    names = [frontier.meta, frontier.stats, frontier.start_urls, frontier.items]
    patterns = [
        keys.partition_tag(frontier.filter, 0).replace(":0}", ":*}").replace("{", "\\{")
        .replace("}", "\\}") + "*",
        frontier.queue + ":\\{" + frontier.filter + ":*",
    ]
    deleted = int(client.delete(*names))
    for pattern in patterns:
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.delete(*batch))
                batch = []
        if batch:
            deleted += int(client.delete(*batch))
    return deleted


def cmd_clear(args: argparse.Namespace, paths: Paths) -> int:
    if not args.yes:
        raise CliError(f"this deletes {args.spider}'s filter, queue and stats: add --yes")
    target = resolve_target(args, paths, need_nodes=False)
    say("deleted %d key(s) of %s" % (clear_spider(target.redis(), args.spider), args.spider))
    return 0


# --- status / filter info ---------------------------------------------------------


def percent(value: float | None) -> str:
    return "-" if value is None else "%.2f%%" % (100 * value)


def table(rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def cmd_status(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(args, paths, need_nodes=False)
    if target.cluster is not None and not target.nodes:
        with contextlib.suppress(CliError):
            target = resolve_target(args, paths, need_nodes=True)
    mode = target.cluster.mode if target.cluster else "not recorded (using REDIS_URL / --nodes)"
    say(f"cluster: {mode}")
    nodes = inspect.scrapyd_nodes([n.url for n in target.nodes],
                                  username=target.nodes[0].username if target.nodes else None,
                                  password=target.nodes[0].password if target.nodes else None)
    up = sum(1 for n in nodes if n.up)
    say("nodes: %d of %d up" % (up, len(nodes)))
    if nodes:
        rows: list[list[object]] = [["node", "up", "pending", "running", "finished", "error"]]
        for n in nodes:
            rows.append([n.node, "yes" if n.up else "NO", n.pending, n.running, n.finished,
                         n.error or ""])
        say(table(rows))
    try:
        snap = inspect.snapshot(target.redis())
    except redis.RedisError as exc:
        say(f"redis: unreachable ({exc})")
        return 1
    say("redis: %.1f MiB used" % (snap.memory.used_bytes / 2**20))
    if not snap.spiders:
        say("spiders: none yet")
        return 0 if up == len(nodes) else 1
    rows = [["spider", "queue", "leased", "pages", "items", "filtered", "filter items",
             "fill", "est. FP rate", "slices", "memory"]]
    for s in snap.spiders:
        info = s.filter
        rows.append([
            s.spider, s.queue_length if s.queue_length is not None else "-",
            s.leased if s.leased is not None else "-", s.stats.get("pages", 0),
            s.stats.get("items", 0), s.stats.get("filtered", 0),
            info.items if info else "-", percent(info.fill_ratio if info else None),
            f"{info.estimated_false_positive_rate:.2g}" if info else "-",
            info.slices if info else "-",
            "%.1f MiB" % (info.memory_bytes / 2**20) if info else "-",
        ])
    say(table(rows))
    for s in snap.spiders:
        for problem in s.problems:
            say(f"{s.spider}: {problem}")
    return 0 if up == len(nodes) else 1


def cmd_filter_info(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(args, paths, need_nodes=False)
    client = target.redis()
    name = args.filter or keys.spider_key(defaults.FILTER_KEY, args.spider)
    state = inspect.spider_state(client, keys.meta_key(name))
    if state is None or state.filter is None:
        raise CliError(f"no Bloom filter {name!r} in Redis")
    info = dict(state.filter.__dict__)
    info["name"] = name
    say(json.dumps(info, indent=2, sort_keys=True))
    return 0


# --- demo -------------------------------------------------------------------------


DEMO_FILTER_CAPACITY = 100_000


def demo_stats(url: str) -> dict[str, Any]:
    with _OPENER.open(url.rstrip("/") + "/__stats", timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def cmd_demo(args: argparse.Namespace, paths: Paths) -> int:
    cluster = load_cluster(paths)
    if cluster is None:
        cmd_up(argparse.Namespace(workers=args.workers, local=args.local, docker=False,
                                  demo=False, build=False), paths)
        cluster = load_cluster(paths)
        assert cluster is not None
    env = read_env_file(paths.env_file)
    if cluster.mode == "docker":
        compose = Compose(paths)
        compose.run("up", "-d", "demo", profiles=["demo"])
        compose.wait_healthy(services=["demo"])
        crawl_url = "http://demo:8000/"
        stats_url = "http://127.0.0.1:%s/" % (env.get("DEMO_PORT") or 8000)
    else:
        local = LocalCluster(paths, env)
        crawl_url = stats_url = local.start_demo(cluster, args.pages, args.delay_ms)
    deploy_args = argparse.Namespace(nodes=None, username=None, scrapyd_service=None,
                                     project=args.project, version=None, egg=None)
    if cmd_deploy(deploy_args, paths) != 0:
        return 1
    target = resolve_target(argparse.Namespace(), paths, need_nodes=True)
    client = target.redis()
    clear_spider(client, DEFAULT_SPIDER)
    with contextlib.suppress(OSError):
        req = urllib.request.Request(stats_url + "__reset", data=b"", method="POST")
        _OPENER.open(req, timeout=10).close()
    started = time.monotonic()
    host = urllib.parse.urlsplit(crawl_url).hostname or ""
    # a filter sized for the demo, so its fill is visible in status and Grafana
    jobs = schedule_on(target.nodes, args.project, DEFAULT_SPIDER,
                       [("MAX_IDLE_TIME_BEFORE_CLOSE", str(args.max_idle)),
                        ("BLOOMFILTER_CAPACITY", str(DEMO_FILTER_CAPACITY))],
                       [("allowed_domains", host)])
    seed(client, DEFAULT_SPIDER, [crawl_url])
    say("crawling %s on %d node(s)" % (crawl_url, len(jobs)))
    code = watch(target, DEFAULT_SPIDER, args.project, jobs, args.timeout)
    elapsed = time.monotonic() - started
    stats = demo_stats(stats_url)
    line, state = frontier_line(client, DEFAULT_SPIDER)
    say("")
    say("demo site: %d pages, %d fetched at least once, %d missing, %d fetched twice or more"
        % (stats["pages"], stats["distinct"], stats["missing"], stats["duplicates"]))
    say(f"frontier: {line}")
    if state is not None and state.filter is not None:
        say("filter: %d items, fill %s, estimated false-positive rate %.2g" % (
            state.filter.items, percent(state.filter.fill_ratio),
            state.filter.estimated_false_positive_rate))
    say("took {:.0f}s ({:.0f} pages/s over the whole run, idle wait included)".format(
        elapsed, stats["total"] / elapsed if elapsed else 0))
    return code


# --- logs -------------------------------------------------------------------------


def cmd_logs(args: argparse.Namespace, paths: Paths) -> int:
    cluster = load_cluster(paths)
    if cluster is not None and cluster.mode == "local":
        for record in cluster.processes:
            if args.service and not record.name.startswith(args.service):
                continue
            say(f"==> {record.log} <==")
            with contextlib.suppress(OSError):
                lines = Path(record.log).read_text(errors="replace").splitlines()
                say("\n".join(lines[-args.tail:]))
        return 0
    compose = Compose(paths)
    cmd = ["logs", "--tail", str(args.tail)]
    if args.follow:
        cmd.append("--follow")
    if args.service:
        cmd.append(args.service)
    compose.run(*cmd, profiles=["demo", "grafana"])
    return 0


def cmd_nodes(args: argparse.Namespace, paths: Paths) -> int:
    for node in resolve_target(args, paths, need_nodes=True).nodes:
        say(node.url)
    return 0


# --- argument parsing -------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bloomcrawl",
        description="Run a bloomcrawl cluster, deploy the project to it, crawl, watch.",
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add_nodes(p: argparse.ArgumentParser) -> None:
        p.add_argument("--nodes", help="comma-separated scrapyd URLs (SCRAPYD_NODES);"
                       " default: the cluster `up` started")
        p.add_argument("--scrapyd-service", help="a DNS name whose every address is a node"
                       " (inside the compose network: worker)")
        p.add_argument("--username", help="scrapyd user (SCRAPYD_USERNAME; password:"
                       " SCRAPYD_PASSWORD)")

    def add_redis(p: argparse.ArgumentParser) -> None:
        p.add_argument("--redis-url", help="(REDIS_URL) default: the cluster `up` started")

    def add_crawl_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--spider", default=DEFAULT_SPIDER)
        p.add_argument("--project", default=DEFAULT_PROJECT)
        p.add_argument("--allowed-domains", help="comma list; default: the start URLs' hosts")
        p.add_argument("--depth-limit", type=int)
        p.add_argument("--max-idle", type=float, default=None,
                       help="MAX_IDLE_TIME_BEFORE_CLOSE: seconds of empty frontier before"
                       " the jobs close")
        p.add_argument("-s", "--setting", action="append", metavar="NAME=VALUE")
        p.add_argument("-a", "--arg", action="append", metavar="NAME=VALUE",
                       help="spider argument")

    p = sub.add_parser("up", help="start the cluster (docker-compose, or local processes)")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--local", action="store_true", help="local processes even with Docker")
    group.add_argument("--docker", action="store_true", help="fail without a Docker engine")
    p.add_argument("--demo", action="store_true", help="start the demo site too")
    p.add_argument("--build", action="store_true", help="rebuild the worker image")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("down", help="stop the cluster; removes its data unless --keep-data")
    p.add_argument("--keep-data", action="store_true")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("scale", help="run N workers")
    p.add_argument("workers", type=int)
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("nodes", help="print every scrapyd node's URL")
    add_nodes(p)
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser("deploy", help="build the egg and upload it to every node;"
                       " fails if any node fails")
    add_nodes(p)
    p.add_argument("--project", default=DEFAULT_PROJECT)
    p.add_argument("--version", dest="version", help="default: the time, as scrapyd-deploy does")
    p.add_argument("--egg", help="upload this egg instead of building one")
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser("schedule", help="start a job of SPIDER on every node")
    add_nodes(p)
    add_crawl_options(p)
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("seed", help="push start URLs to <spider>:start_urls")
    add_redis(p)
    p.add_argument("--spider", default=DEFAULT_SPIDER)
    p.add_argument("urls", nargs="+")
    p.set_defaults(func=cmd_seed)

    p = sub.add_parser("crawl", help="schedule SPIDER on every node and seed URLS")
    add_nodes(p)
    add_redis(p)
    add_crawl_options(p)
    p.add_argument("--wait", action="store_true", help="print progress until the jobs end")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("urls", nargs="*")
    p.set_defaults(func=cmd_crawl)

    p = sub.add_parser("clear", help="delete a spider's filter, queue, leases and stats")
    add_redis(p)
    p.add_argument("--spider", default=DEFAULT_SPIDER)
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=cmd_clear)

    p = sub.add_parser("status", help="nodes, jobs, queue, leases, filter fill")
    add_nodes(p)
    add_redis(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("filter-info", help="a Bloom filter's size and fill, as JSON")
    add_redis(p)
    p.add_argument("--spider", default=DEFAULT_SPIDER)
    p.add_argument("--filter", help="filter name (default <spider>:bloomfilter)")
    p.set_defaults(func=cmd_filter_info)

    p = sub.add_parser("demo", help="up, deploy, crawl the demo site, print progress, summary")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    p.add_argument("--local", action="store_true")
    p.add_argument("--project", default=DEFAULT_PROJECT)
    p.add_argument("--pages", type=int, help="local mode: pages of the demo site")
    p.add_argument("--delay-ms", type=float, help="local mode: response delay")
    p.add_argument("--max-idle", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("logs", help="recent logs of the cluster's services")
    p.add_argument("service", nargs="?")
    p.add_argument("--tail", type=int, default=100)
    p.add_argument("-f", "--follow", action="store_true")
    p.set_defaults(func=cmd_logs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    paths = Paths.from_environment()
    try:
        return int(args.func(args, paths))
    except CliError as exc:
        warn(f"bloomcrawl {args.command}: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
