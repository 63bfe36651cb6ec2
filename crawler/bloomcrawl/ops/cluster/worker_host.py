"""A worker host: scrapyd nodes on this machine whose jobs crawl for a cluster elsewhere.

``bloomcrawl worker-host`` (``make worker-host``) starts N scrapyd nodes on
127.0.0.1 and, for an ``https://ADDR:PORT`` node URL, a TLS proxy
(:mod:`bloomcrawl.ops.tls_proxy`) per node on ``ADDR:PORT+i-1`` with this
host's certificate; scrapyd's basic auth (the cluster's SCRAPYD_USERNAME and
SCRAPYD_PASSWORD) guards every endpoint. With ``http://`` and ``--insecure``
scrapyd itself listens on ADDR. The jobs get REDIS_URL (the cluster's Redis,
``rediss://`` as the ``bloomcrawl-worker`` user) in their environment, with
this host's CA and client certificate added when the URL names none. Nothing
else of the cluster runs here: Redis, the exporter, the timer and the CLI are
the central host's, which reaches these nodes once told (``bloomcrawl nodes
add``). Every process is recorded like a local cluster's, so ``make down``
stops them; the Redis URL is never written down.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.parse
from pathlib import Path

from bloomcrawl.core.connection import INSECURE_ENV, insecure_allowed, ping, redis_from_url
from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.cluster.local import LocalCluster
from bloomcrawl.ops.cluster.processes import (
    CA_FILE,
    CLIENT_CERT,
    SERVER_CERT,
    free_port,
    missing_certs,
    spawn,
    start_scrapyd,
)
from bloomcrawl.ops.cluster.state import Cluster, Paths, load_cluster, save_cluster
from bloomcrawl.ops.console import OpsError, say

#: seconds a TLS proxy gets to listen
PROXY_TIMEOUT = 15.0


def with_certificates(url: str, certs: Path) -> str:
    """A ``rediss://`` URL with this host's CA and client certificate (``make certs``) added
    when it names none; other URLs as they are."""
    parts = urllib.parse.urlsplit(url)
    if not parts.scheme.startswith("rediss"):
        return url
    query = dict(urllib.parse.parse_qsl(parts.query))
    if "ssl_ca_certs" not in query and (certs / CA_FILE).is_file():
        query["ssl_ca_certs"] = str(certs / CA_FILE)
    if "ssl_certfile" not in query and (certs / (CLIENT_CERT + ".crt")).is_file():
        query["ssl_certfile"] = str(certs / (CLIENT_CERT + ".crt"))
        query["ssl_keyfile"] = str(certs / (CLIENT_CERT + ".key"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


class WorkerHost:
    """The scrapyd nodes (and their TLS proxies) of a worker host, recorded in its state."""

    def __init__(self, paths: Paths, env: dict[str, str]) -> None:
        self.paths = paths
        self.env = env
        self.dir = paths.local_dir

    def credentials(self) -> tuple[str, str]:
        username = os.environ.get("SCRAPYD_USERNAME") or self.env.get("SCRAPYD_USERNAME", "")
        password = os.environ.get("SCRAPYD_PASSWORD") or self.env.get("SCRAPYD_PASSWORD", "")
        if not username or not password:
            raise OpsError("the nodes need the cluster's scrapyd credentials: copy"
                           " SCRAPYD_USERNAME and SCRAPYD_PASSWORD from the central host's .env"
                           f" into {self.paths.env_file} (or the environment)")
        return username, password

    def up(self, redis_url: str, node_url: str, workers: int) -> int:
        started = time.monotonic()
        if workers < 1:
            raise OpsError("--workers must be at least 1")
        if load_cluster(self.paths) is not None:
            raise OpsError(f"a cluster is already recorded in {self.paths.state_dir}:"
                           " `make down` first")
        insecure = insecure_allowed()
        node_url = scrapyd.check_node_url(node_url, insecure)
        parts = urllib.parse.urlsplit(node_url)
        address, first_port = parts.hostname or "", parts.port or scrapyd.DEFAULT_PORT
        tls = parts.scheme == "https"
        if tls:
            missing = missing_certs(self.paths.certs_dir, SERVER_CERT)
            if missing:
                raise OpsError(f"{node_url}: the TLS proxy needs this host's certificate"
                               f" (make certs HOSTS='{address}'), missing: {', '.join(missing)}")
        if not redis_url:
            raise OpsError("give the cluster's Redis: REDIS_URL=rediss://bloomcrawl-worker:"
                           "PASSWORD@HOST:PORT/0 (the central host's `make up REDIS_BIND=...`"
                           " prints it)")
        redis_url = with_certificates(redis_url, self.paths.certs_dir)
        username, password = self.credentials()
        # the cluster's Redis must answer with these credentials and certificates first
        client = redis_from_url(redis_url, insecure=insecure, socket_connect_timeout=5)
        try:
            ping(client)
        finally:
            client.close()

        self.paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        cluster = Cluster("worker-host", "", username, password)
        save_cluster(self.paths, cluster)
        urls = []
        try:
            for index in range(1, workers + 1):
                public_port = first_port + index - 1
                self._start_node(cluster, index, redis_url, address, public_port, tls,
                                 insecure)
                urls.append(f"{parts.scheme}://{address}:{public_port}")
        except BaseException:
            LocalCluster(self.paths, self.env).down(keep_data=False, quiet=True)
            raise
        say("worker host up in %.0fs: %d node(s): %s" % (time.monotonic() - started,
                                                         len(urls), " ".join(urls)))
        say("on the central host: " + "; ".join(f"bloomcrawl nodes add {url}" for url in urls)
            + ", then `make deploy`")
        return 0

    def _start_node(self, cluster: Cluster, index: int, redis_url: str, address: str,
                    public_port: int, tls: bool, insecure: bool) -> None:
        name = "scrapyd-%d" % index
        node_dir = self.dir / name
        env = dict(os.environ)
        env.update(REDIS_URL=redis_url, PYTHONUNBUFFERED="1", HOME=str(node_dir))
        if insecure:
            env[INSECURE_ENV] = "1"
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        self.paths.project_packages.mkdir(parents=True, exist_ok=True)
        env["PYTHONPATH"] = str(self.paths.project_packages)
        # behind TLS, scrapyd listens on loopback alone; else on the address itself
        port = free_port() if tls else public_port
        process = start_scrapyd(
            node_dir, port=port, username=cluster.username, password=cluster.password,
            env=env, log=self.dir / f"{name}.log", name=name,
            bind="127.0.0.1" if tls else address, settings={
                "max_proc": int(self.env.get("SCRAPYD_MAX_PROC") or 2),
                "poll_interval": 1.0, "eggs_dir": node_dir / "eggs",
                "logs_dir": node_dir / "logs", "dbs_dir": node_dir / "dbs", "items_dir": "",
            })
        cluster.processes.append(process.record)
        save_cluster(self.paths, cluster)
        if not tls:
            return
        certs = self.paths.certs_dir
        proxy = spawn(f"tls-proxy-{index}", [
            sys.executable, "-m", "bloomcrawl.ops.tls_proxy",
            "--listen", f"{address}:{public_port}", "--to", f"127.0.0.1:{port}",
            "--cert", str(certs / (SERVER_CERT + ".crt")),
            "--key", str(certs / (SERVER_CERT + ".key"))],
            log=self.dir / f"tls-proxy-{index}.log", cwd=self.dir, port=public_port)
        node = scrapyd.Node(f"https://{address}:{public_port}", cluster.username,
                            cluster.password, ca_pem=(certs / CA_FILE).read_text()
                            if (certs / CA_FILE).is_file() else "")
        proxy.wait_ready(lambda: node.request("daemonstatus.json", timeout=2), PROXY_TIMEOUT,
                         what=f"the TLS proxy on {address}:{public_port}")
        cluster.processes.append(proxy.record)
        save_cluster(self.paths, cluster)
