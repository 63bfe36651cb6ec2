"""The compose topology as local processes on 127.0.0.1, for machines without Docker.

redis-server (with the ``.env`` password, append-only file on), N scrapyd
nodes, the exporter, Prometheus when it is installed, and the demo site on
demand, each started through :mod:`bloomcrawl.ops.cluster.processes` on its
``.env`` port when free (else any free port) and recorded in the cluster's
state as soon as it is ready, so that ``down`` stops exactly those. Data and
logs are under ``.run/local/``.

The scrapyd nodes run with ``.run/local/site-packages`` on their PYTHONPATH
(scrapyd passes it on to ``scrapy list`` and to its jobs): ``deploy`` installs
a project's requirements there (:meth:`LocalCluster.install_requirements`),
never into the interpreter's own environment.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from bloomcrawl.core import defaults
from bloomcrawl.ops import acl, scrapyd
from bloomcrawl.ops.cluster.processes import (
    ManagedProcess,
    is_ours,
    pick_port,
    redis_url,
    spawn,
    start_prometheus,
    start_redis,
    start_scrapyd,
    stop_process,
)
from bloomcrawl.ops.cluster.state import Cluster, Paths, load_cluster, save_cluster
from bloomcrawl.ops.console import OpsError, say
from bloomcrawl.ops.noproxy import http_ok
from bloomcrawl.ops.requirements import (
    Wheelhouse,
    build_wheelhouse,
    install_wheels,
    worker_environment,
)

DEMO_SITE_NEEDS = "the demo site needs aiohttp: pip install 'bloomcrawl[demo]'"


class LocalCluster:
    """The compose topology as processes on 127.0.0.1, for machines without Docker."""

    def __init__(self, paths: Paths, env: dict[str, str]) -> None:
        self.paths = paths
        self.env = env
        self.dir = paths.local_dir
        self.python = sys.executable

    def _record(self, cluster: Cluster, process: ManagedProcess) -> None:
        cluster.processes.append(process.record)
        save_cluster(self.paths, cluster)

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

    def up(self, workers: int, *, demo: bool = False, redis_bind: str = "",
           tls: bool = False) -> int:
        """``redis_bind``: publish Redis on that address too, with TLS when ``tls`` (the
        certificates of ``make certs``) and an ACL user per role (:mod:`bloomcrawl.ops.acl`)."""
        started = time.monotonic()
        cluster = load_cluster(self.paths)
        created = cluster is None
        # the state (pids, ports), data and logs are the operator's alone
        self.paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        try:
            if cluster is None:
                cluster = self._start_redis(redis_bind, tls)
            self._check_alive(cluster)
            self._scale_to(cluster, workers)
            self._ensure_timer(cluster)
            self._ensure_prometheus(cluster)
            if demo:
                self.start_demo(cluster)
        except BaseException:
            if created:
                self.down(keep_data=False, quiet=True)
            raise
        urls = cluster.scrapyd_urls()
        say("local cluster up in %.0fs: %d scrapyd node(s): %s" % (
            time.monotonic() - started, len(urls), " ".join(urls)))
        say("redis: 127.0.0.1:%d   exporter: http://127.0.0.1:%d/metrics%s" % (
            cluster.ports["redis"], cluster.ports["exporter"],
            "   prometheus: http://127.0.0.1:%d" % cluster.ports["prometheus"]
            if "prometheus" in cluster.ports else "   prometheus: not installed"))
        say(f"grafana: not started in local mode; state and logs in {self.dir}")
        if cluster.redis_bind:
            say(remote_workers_hint(cluster.redis_bind, cluster.ports["redis"], cluster.tls,
                                    self.paths))
        return 0

    @staticmethod
    def _check_alive(cluster: Cluster) -> None:
        gone = cluster.gone()
        if gone:
            raise OpsError("recorded processes are gone (%s): `make down KEEP_DATA=1`, then"
                           " `make up` (plain `make down` deletes the data)"
                           % ", ".join(sorted(p.name for p in gone)))

    def _taken_ports(self, cluster: Cluster) -> set[int]:
        return {p.port for p in cluster.processes if p.port} | set(cluster.ports.values())

    def _start_redis(self, redis_bind: str = "", tls: bool = False) -> Cluster:
        port = pick_port(int(self.env.get("REDIS_PORT") or 6379))
        password = self.env["REDIS_PASSWORD"]
        tls_dir = self.paths.certs_dir if tls else None
        users = acl.config_lines(self.env) if redis_bind else []
        process = start_redis(self.dir / "redis", port=port, log=self.dir / "redis.log",
                              password=password, appendonly=True, tls_dir=tls_dir,
                              bind=[redis_bind] if redis_bind else [], users=users)
        cluster = Cluster("local", redis_url(port, password, tls_dir=tls_dir),
                          self.env["SCRAPYD_USERNAME"], self.env["SCRAPYD_PASSWORD"],
                          ports={"redis": port}, redis_bind=redis_bind, tls=tls)
        self._record(cluster, process)
        return cluster

    def _ensure_prometheus(self, cluster: Cluster) -> None:
        if shutil.which("prometheus") is None or any(
                p.name == "prometheus" for p in cluster.processes):
            return
        port = pick_port(int(self.env.get("PROMETHEUS_PORT") or 9090), self._taken_ports(cluster))
        config = self._prometheus_config(cluster.ports["exporter"], port)
        process = start_prometheus(config, self.dir / "prometheus-data", port=port,
                                   log=self.dir / "prometheus.log", cwd=self.dir)
        cluster.ports["prometheus"] = port
        self._record(cluster, process)

    def _ensure_timer(self, cluster: Cluster) -> None:
        """The timer that fires recurring crawls (``bloomcrawl schedule --every``); it reads
        the nodes from the recorded cluster at each firing, so scaling needs no restart."""
        if any(p.name == "timer" for p in cluster.processes):
            return
        env = self._child_env(cluster.redis_url)
        env["BLOOMCRAWL_ROOT"] = str(self.paths.root)
        env["BLOOMCRAWL_STATE_DIR"] = str(self.paths.state_dir)
        env["BLOOMCRAWL_ENV_FILE"] = str(self.paths.env_file)
        process = spawn("timer", [self.python, "-m", "bloomcrawl.ops.cli", "timer"],
                        log=self.dir / "timer.log", cwd=self.dir, env=env)
        self._record(cluster, process)

    def _exporter_env(self, cluster: Cluster) -> dict[str, str]:
        env = self._child_env(cluster.redis_url)
        env["SCRAPYD_NODES"] = ",".join(cluster.scrapyd_urls())
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

    def _start_scrapyd(self, cluster: Cluster, index: int, taken: set[int]) -> None:
        name = "scrapyd-%d" % index
        first, last = worker_ports(self.env)
        preferred = first + index - 1
        port = pick_port(preferred if preferred <= last else 0, taken)
        node_dir = self.dir / name
        env = self._child_env(cluster.redis_url)
        env["HOME"] = str(node_dir)  # Scrapy keeps job state under ~/.local/state
        # the nodes share this host: each gets a name of its own, which its jobs count
        # their pages under and it reports as node_name (the exporter labels by it)
        node_name = "%s-%s" % (socket.gethostname(), name)
        env[defaults.NODE_ENV] = node_name
        # the projects' requirements: `deploy` installs them there, any time later
        self.paths.project_packages.mkdir(parents=True, exist_ok=True)
        env["PYTHONPATH"] = str(self.paths.project_packages)
        process = start_scrapyd(node_dir, port=port, username=cluster.username,
                                password=cluster.password, env=env,
                                log=self.dir / f"{name}.log", name=name, settings={
                                    "node_name": node_name,
                                    "max_proc": int(self.env.get("SCRAPYD_MAX_PROC") or 2),
                                    "poll_interval": 1.0,
                                    "eggs_dir": node_dir / "eggs",
                                    "logs_dir": node_dir / "logs",
                                    "dbs_dir": node_dir / "dbs",
                                    "items_dir": "",
                                })
        self._record(cluster, process)

    def _scale_to(self, cluster: Cluster, workers: int) -> None:
        nodes = cluster.scrapyd_processes()
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
            save_cluster(self.paths, cluster)
        port = cluster.ports.get("exporter") or pick_port(
            int(self.env.get("EXPORTER_PORT") or 9410), self._taken_ports(cluster))
        cluster.ports["exporter"] = port
        # REDIS_URL (password included) goes in its environment, never on its command line
        process = spawn("exporter", [
            self.python, "-m", "bloomcrawl.ops.exporter", "--bind", "127.0.0.1",
            "--port", str(port),
        ], log=self.dir / "exporter.log", cwd=self.dir, env=self._exporter_env(cluster),
            port=port)
        process.wait_ready(lambda: http_ok("http://127.0.0.1:%d/metrics" % port), 30)
        self._record(cluster, process)

    def scale(self, workers: int) -> int:
        cluster = load_cluster(self.paths)
        if cluster is None:
            raise OpsError("no cluster is up")
        if workers < 1:
            raise OpsError("WORKERS must be at least 1")
        self._check_alive(cluster)
        before = set(cluster.scrapyd_urls())
        self._scale_to(cluster, workers)
        urls = cluster.scrapyd_urls()
        say("%d scrapyd node(s): %s" % (len(urls), " ".join(urls)))
        if set(urls) - before:
            say("new nodes have no project yet: `make deploy` reaches every node")
        return 0

    def install_requirements(self, requirements: Path) -> Wheelhouse:
        """Install what ``requirements`` needs for the nodes, in :attr:`Paths.project_packages`.

        The wheels are built and installed by the nodes' interpreter, which is
        this one; what it has already is not installed again.
        """
        python = [self.python]
        workers = worker_environment(python)
        with tempfile.TemporaryDirectory(prefix="bloomcrawl-wheels-") as tmp:
            wheelhouse = build_wheelhouse(python, requirements, Path(tmp), workers)
            install_wheels(python, wheelhouse.wheels, self.paths.project_packages)
        return wheelhouse

    def start_demo(self, cluster: Cluster, pages: int | None = None,
                   delay_ms: float | None = None) -> str:
        """Start the demo site once; its URL."""
        for record in cluster.processes:
            if record.name == "demo" and is_ours(record):
                return "http://127.0.0.1:%s/" % record.port
        if importlib.util.find_spec("aiohttp") is None:
            raise OpsError(DEMO_SITE_NEEDS)
        port = pick_port(int(self.env.get("DEMO_PORT") or 8000), self._taken_ports(cluster))
        cmd = [self.python, "-m", "bloomcrawl.ops.demo_site", "--host", "127.0.0.1",
               "--port", str(port),
               "--pages", str(pages or int(self.env.get("DEMO_PAGES") or 2000))]
        cmd += ["--delay-ms", str(delay_ms if delay_ms is not None
                                  else float(self.env.get("DEMO_DELAY_MS") or 0))]
        process = spawn("demo", cmd, log=self.dir / "demo.log", cwd=self.dir, port=port)
        process.wait_ready(lambda: http_ok("http://127.0.0.1:%d/__stats" % port), 30,
                           what="demo site")
        cluster.ports["demo"] = port
        self._record(cluster, process)
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


def remote_workers_hint(address: str, port: int, tls: bool, paths: Paths) -> str:
    """What a worker host needs to join: the URL (the password stays in .env), and files."""
    if not tls:
        return ("redis for worker hosts: redis://%s:<%s>@%s:%d/0, PLAIN TEXT (--insecure):"
                " `make worker-host INSECURE=1 ...`" % (
                    acl.user_name("worker"), acl.password_variable("worker"), address, port))
    return ("redis for worker hosts: rediss://%s:<%s in %s>@%s:%d/0; give each host %s/ca.crt,"
            " client.crt and client.key and its own certificate (make certs NAME=... HOSTS=...):"
            " `make worker-host` (docs/deploy.md)" % (
                acl.user_name("worker"), acl.password_variable("worker"), paths.env_file,
                address, port, paths.certs_dir))


def worker_ports(env: dict[str, str]) -> tuple[int, int]:
    """``WORKER_PORTS`` of ``.env`` (``FIRST-LAST`` or one port; default 6800-6819): node N
    prefers port FIRST + N - 1 within the range, and takes any free port when that is
    taken or past LAST."""
    raw = (env.get("WORKER_PORTS") or "").strip()
    if not raw:
        return scrapyd.DEFAULT_PORT, scrapyd.DEFAULT_PORT + 19
    found = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", raw)
    first = int(found[1]) if found else 0
    last = int(found[2] or found[1]) if found else 0
    if not found or not 0 < first <= last < 65536:
        raise OpsError(f"WORKER_PORTS={raw!r} in .env: give a port or a range FIRST-LAST of"
                       " ports, e.g. 6800-6819")
    return first, last
