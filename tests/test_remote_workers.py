"""A worker host on another machine joins the cluster over TLS; plain text off the machine is
refused.

The other machine is a network namespace of its own (``ip netns``) joined to this one by
a veth pair on 198.18.20.0/24 (RFC 2544 test addresses; Docker takes 198.18.0.0/24 and
198.19.0.0/16): its addresses are not loopback, so the plain-text refusal applies for
real. On this side: redis-server with TLS alone (certificates of ``scripts/make-certs.sh``,
what ``make certs`` runs), the ACL users of :mod:`bloomcrawl.ops.acl`, published on the
veth address, and the demo site there. In the namespace: ``bloomcrawl worker-host``
(scrapyd on the namespace's loopback behind the TLS proxy, basic auth). The central
``bloomcrawl`` commands then add the node, deploy to it, crawl with it and see it in
``status``, the timer and the exporter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from bloomcrawl.core.connection import redis_from_url
from bloomcrawl.ops import acl, remote_nodes
from bloomcrawl.ops.cli.target import TargetOptions, resolve_target
from bloomcrawl.ops.cluster import envfile
from bloomcrawl.ops.cluster.processes import (
    ManagedProcess,
    ProcessRecord,
    free_port,
    group_alive,
    redis_url,
    start_redis,
    stop_process,
)
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.demo_site import serve_in_thread
from bloomcrawl.ops.exporter import ClusterCollector, ScrapydNodes, build_registry
from bloomcrawl.ops.noproxy import OPENER
from bloomcrawl.ops.runs import RunStore, check_run
from bloomcrawl.ops.timer import Timer

from kit import ROOT
from kit.checks import assert_crawled_once
from kit.cli import CliRun, cli_environment, environment, run_cli, run_cli_process
from kit.wait import wait_until

pytestmark = pytest.mark.slow

ADMIN_PASSWORD = "admin-pw-for-tests"
ROLE_PASSWORDS = {role: f"{role}-pw-for-tests" for role in acl.ROLES}
SCRAPYD_USER = "bloomcrawl"
SCRAPYD_PASSWORD = "scrapyd-pw-for-tests"
#: namespaces of this file: bcr-test-<slot>, slot k using 198.18.20.4k+1 and .4k+2 (/30)
SLOTS = 64
COMMAND_TIMEOUT = 120


@dataclass
class Hosts:
    """This host and the namespace's, joined by a veth pair."""

    namespace: str
    central: str  # this side's address
    remote: str  # the namespace's
    certs: Path  # the CA, this host's server certificate, the client certificate
    remote_certs: Path  # what the worker host is given: the CA, its own, the client's


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def make_certs(directory: Path, name: str, *hosts: str) -> None:
    subprocess.run([str(ROOT / "scripts" / "make-certs.sh"), str(directory), name, *hosts],
                   check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the remote-worker tests need root and iproute2 (ip netns): they simulate"
                    " a second host in a network namespace")
    # `ip netns add` fails when the name exists: the first free slot is this process's
    slot = next((k for k in range(SLOTS) if subprocess.run(
        ["ip", "netns", "add", f"bcr-test-{k}"], capture_output=True).returncode == 0), None)
    if slot is None:
        pytest.fail(f"no free network namespace slot among bcr-test-0..{SLOTS - 1}")
    namespace, host_link, ns_link = f"bcr-test-{slot}", f"bcrt{slot}h", f"bcrt{slot}n"
    central, remote = f"198.18.20.{4 * slot + 1}", f"198.18.20.{4 * slot + 2}"
    try:
        ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link)
        ip("link", "set", ns_link, "netns", namespace)
        ip("addr", "add", f"{central}/30", "dev", host_link)
        ip("link", "set", host_link, "up")
        ip("-n", namespace, "addr", "add", f"{remote}/30", "dev", ns_link)
        ip("-n", namespace, "link", "set", ns_link, "up")
        ip("-n", namespace, "link", "set", "lo", "up")
        base = tmp_path_factory.mktemp("remote-certs")
        certs, remote_certs = base / "central", base / "remote"
        make_certs(certs, "server", "127.0.0.1", central)  # and the client certificate
        make_certs(certs, "host2", remote)
        remote_certs.mkdir(mode=0o700)
        for name in ("ca.crt", "client.crt", "client.key"):
            shutil.copy(certs / name, remote_certs / name)
        shutil.copy(certs / "host2.crt", remote_certs / "server.crt")
        shutil.copy(certs / "host2.key", remote_certs / "server.key")
        yield Hosts(namespace, central, remote, certs, remote_certs)
    finally:
        subprocess.run(["ip", "link", "del", host_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


@pytest.fixture(scope="module")
def central_redis(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[ManagedProcess]:
    """redis-server as ``up --redis-bind`` starts it: TLS alone, on 127.0.0.1 and the veth
    address, the role users."""
    users = [acl.config_line(role, password) for role, password in ROLE_PASSWORDS.items()]
    process = start_redis(tmp_path_factory.mktemp("central-redis"), password=ADMIN_PASSWORD,
                          tls_dir=hosts.certs, bind=[hosts.central], users=users)
    yield process
    process.stop()


@pytest.fixture
def admin(central_redis: ManagedProcess, hosts: Hosts) -> Iterator[redis.Redis]:
    assert central_redis.port is not None
    client = redis_from_url(redis_url(central_redis.port, ADMIN_PASSWORD, tls_dir=hosts.certs))
    client.flushall()
    client.execute_command("ACL", "LOG", "RESET")
    yield client
    client.flushall()
    client.close()


def role_url(role: str, host: str, port: int, certs: Path | None = None) -> str:
    """The role's ``rediss://`` URL; with ``certs``, naming the CA and client certificate
    (without, the worker host adds its own)."""
    if certs is not None:
        return redis_url(port, ROLE_PASSWORDS[role], tls_dir=certs, host=host,
                         user=acl.user_name(role))
    return "rediss://%s:%s@%s:%d/0" % (acl.user_name(role), ROLE_PASSWORDS[role], host, port)


class WorkerHost:
    """``bloomcrawl worker-host`` in the namespace, in a state directory of its own;
    :meth:`down` stops what it recorded, by pid, whatever the command did."""

    def __init__(self, hosts: Hosts, workdir: Path) -> None:
        self.hosts = hosts
        self.state = workdir / "state"
        workdir.mkdir(parents=True, exist_ok=True)
        env_file = workdir / "worker.env"
        env_file.write_text(f"SCRAPYD_USERNAME={SCRAPYD_USER}\n"
                            f"SCRAPYD_PASSWORD={SCRAPYD_PASSWORD}\n")
        self.env = cli_environment(workdir)
        self.env.update(BLOOMCRAWL_STATE_DIR=str(self.state),
                        BLOOMCRAWL_ENV_FILE=str(env_file),
                        BLOOMCRAWL_CERTS_DIR=str(hosts.remote_certs))

    def run(self, redis: str, node_url: str, *options: str) -> CliRun:
        return self.command("worker-host", "--node-url", node_url, "--workers", "1", *options,
                            redis=redis)

    def command(self, *argv: str, redis: str = "") -> CliRun:
        """``bloomcrawl ARGV`` in the namespace, with the worker host's state."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.hosts.namespace, sys.executable, "-m",
             "bloomcrawl.ops.cli", *argv], env={**self.env, "REDIS_URL": redis}, cwd=ROOT,
            text=True, capture_output=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
        return CliRun(argv, done.returncode, done.stdout, done.stderr)

    def down(self) -> None:
        record = self.state / "cluster.json"
        if record.is_file():
            for entry in json.loads(record.read_text()).get("processes", []):
                stop_process(ProcessRecord(**entry))
            record.unlink()


@pytest.fixture
def worker_host(hosts: Hosts, tmp_path: Path) -> Iterator[WorkerHost]:
    host = WorkerHost(hosts, tmp_path / "worker-host")
    yield host
    host.down()


@pytest.fixture
def central_env(tmp_path: Path, central_redis: ManagedProcess, hosts: Hosts) -> dict[str, str]:
    """The central host's ``bloomcrawl``: the operator's URL, the cluster's scrapyd
    credentials."""
    assert central_redis.port is not None
    env = cli_environment(tmp_path)
    env.update(REDIS_URL=role_url("operator", "127.0.0.1", central_redis.port, hosts.certs),
               SCRAPYD_USERNAME=SCRAPYD_USER, SCRAPYD_PASSWORD=SCRAPYD_PASSWORD)
    return env


@pytest.mark.long
def test_a_worker_host_joins_over_tls_and_crawls_with_the_central_frontier(
        hosts: Hosts, central_redis: ManagedProcess, admin: redis.Redis,
        worker_host: WorkerHost, central_env: dict[str, str], tmp_path: Path) -> None:
    assert central_redis.port is not None
    node_url = f"https://{hosts.remote}:{free_port()}"
    started = worker_host.run(role_url("worker", hosts.central, central_redis.port), node_url)
    assert started.code == 0, started.output
    assert f"bloomcrawl nodes add {node_url}" in started.stdout

    ca = ["--ca-file", str(hosts.certs / "ca.crt")]
    # another CA, and wrong credentials: refused, saying which
    make_certs(tmp_path / "other-ca", "server")
    untrusted = run_cli("nodes", "add", node_url, "--ca-file", str(tmp_path / "other-ca" /
                                                                  "ca.crt"), env=central_env)
    untrusted.assert_failed_with(
        f"bloomcrawl nodes: not added: {node_url}/daemonstatus.json: its TLS certificate is"
        " not trusted (unable to get local issuer certificate): give the CA that signed it"
        " (bloomcrawl nodes add --ca-file)")
    wrong = run_cli("nodes", "add", node_url, *ca,
                    env={**central_env, "SCRAPYD_PASSWORD": "not-the-password"})
    wrong.assert_failed_with(
        f"bloomcrawl nodes: not added: {node_url}/daemonstatus.json: HTTP 401: the node"
        " refused the credentials (check SCRAPYD_USERNAME and SCRAPYD_PASSWORD)")
    assert admin.hlen(remote_nodes.KEY) == 0

    run_cli("nodes", "add", node_url, *ca, env=central_env).assert_ok()
    listed = run_cli("nodes", env=central_env).assert_ok()
    assert listed.stdout.split() == [node_url]
    deployed = run_cli("deploy", env=central_env).assert_ok()
    assert f"ok   {node_url}: bloomcrawl " in deployed.stdout, deployed.output

    with serve_in_thread(pages=200, host=hosts.central) as site:
        crawled = run_cli("crawl", "--max-idle", "2", "--wait", "--timeout", "120", site.url,
                          env=central_env).assert_ok()
        assert "site running on 1 node(s)" in crawled.stdout, crawled.output
        # every page once, by the remote node's job, through the central frontier
        assert_crawled_once(site, admin)

        # the timer, as its own user, fires a recurring crawl into the remote node too
        run_cli("schedule", "--name", "hourly", "--every", "1h", "--max-idle", "1",
                site.url, env=central_env).assert_ok()
        timer_client = redis_from_url(role_url("timer", "127.0.0.1", central_redis.port,
                                               hosts.certs))
        try:
            with environment(central_env):
                paths = Paths.from_environment()
                timer = Timer(timer_client, lambda: resolve_target(
                    paths, TargetOptions(), need_nodes=True, need_redis=True))
                assert timer.tick() == ["hourly"]
                runs = RunStore(timer_client)
                [run] = runs.recent()
                assert list(run.jobs) == [node_url], run
                nodes = timer.target().nodes
                wait_until(lambda: check_run(timer_client, runs, run, nodes), 60,
                           interval=0.2, what="the timer's run to end")
        finally:
            timer_client.close()

    shown = run_cli("status", env=central_env).assert_ok()
    assert "nodes: 1 of 1 up" in shown.stdout, shown.output
    assert "%s  yes" % node_url.removeprefix("https://") in shown.stdout, shown.output
    # the exporter, as its read-only user, finds the node in Redis and reaches it
    exporter = redis_from_url(role_url("exporter", "127.0.0.1", central_redis.port,
                                       hosts.certs))
    try:
        registry = build_registry(ClusterCollector(exporter, scrapyd=ScrapydNodes(
            username=SCRAPYD_USER, password=SCRAPYD_PASSWORD)))
        label = {"node": node_url.removeprefix("https://")}
        assert registry.get_sample_value("bloomcrawl_scrapyd_node_up", label) == 1
        assert registry.get_sample_value("bloomcrawl_scrapyd_jobs",
                                         {**label, "state": "finished"}) == 2  # crawl, timer
    finally:
        exporter.close()
    # the worker, exporter and operator stayed within their ACL rules
    assert admin.execute_command("ACL", "LOG") == []

    run_cli("nodes", "remove", node_url, env=central_env).assert_ok()
    assert admin.hlen(remote_nodes.KEY) == 0
    run_cli("nodes", "remove", node_url, env=central_env).assert_failed_with(
        f"bloomcrawl nodes: {node_url} is not a listed remote node")

    # `make down` on the worker host stops its scrapyd and its TLS proxy
    pids = [entry["pid"] for entry in json.loads(
        (worker_host.state / "cluster.json").read_text())["processes"]]
    assert len(pids) == 2
    down = worker_host.command("down").assert_ok()
    assert "local cluster down" in down.stdout, down.output
    wait_until(lambda: not any(group_alive(pid) for pid in pids), 10, interval=0.1,
               what=lambda: "left running: %s" % [p for p in pids if group_alive(p)])


def test_the_worker_host_says_why_redis_refused_it(
        hosts: Hosts, central_redis: ManagedProcess, worker_host: WorkerHost,
        tmp_path: Path) -> None:
    assert central_redis.port is not None
    node_url = f"https://{hosts.remote}:{free_port()}"
    worker = role_url("worker", hosts.central, central_redis.port)
    wrong = worker_host.run(worker.replace(ROLE_PASSWORDS["worker"], "wrong"), node_url)
    assert wrong.code == 1 and "Traceback" not in wrong.output, wrong.output
    assert (f"bloomcrawl worker-host: Redis at rediss://{hosts.central}:{central_redis.port}/0"
            " refused the credentials") in wrong.stderr, wrong.stderr
    # a CA that did not sign the central host's certificate
    make_certs(tmp_path / "other-ca", "server")
    other = f"{worker}?ssl_ca_certs={tmp_path / 'other-ca' / 'ca.crt'}"
    untrusted = worker_host.run(other, node_url)
    assert untrusted.code == 1 and "Traceback" not in untrusted.output, untrusted.output
    assert "certificate verify failed" in untrusted.stderr, untrusted.stderr
    assert not (worker_host.state / "cluster.json").exists()  # nothing started


def test_plain_text_off_the_machine_is_refused_unless_insecure(
        hosts: Hosts, worker_host: WorkerHost, central_env: dict[str, str],
        tmp_path: Path) -> None:
    plain = start_redis(tmp_path / "plain-redis", password=ADMIN_PASSWORD,
                        bind=[hosts.central])
    try:
        assert plain.port is not None
        redis_plain = redis_url(plain.port, ADMIN_PASSWORD, host=hosts.central)
        http_node = f"http://{hosts.remote}:{free_port()}"
        https_node = f"https://{hosts.remote}:{free_port()}"

        refused = worker_host.run(redis_plain, http_node)
        refused.assert_failed_with(
            f"bloomcrawl worker-host: scrapyd node {http_node} is plain text to {hosts.remote},"
            " which is not a loopback address: passwords and data would cross the network"
            " unencrypted. Use https:// (make certs; see docs/deploy.md), or allow it with"
            " --insecure (BLOOMCRAWL_INSECURE=1)")
        refused = worker_host.run(redis_plain, https_node)
        refused.assert_failed_with(
            f"bloomcrawl worker-host: REDIS_URL redis://{hosts.central}:{plain.port}/0 is plain"
            f" text to {hosts.central}, which is not a loopback address: passwords and data"
            " would cross the network unencrypted. Use rediss:// (make certs; see"
            " docs/deploy.md), or allow it with --insecure (BLOOMCRAWL_INSECURE=1)")
        assert not (worker_host.state / "cluster.json").exists()

        started = worker_host.run(redis_plain, http_node, "--insecure")
        assert started.code == 0, started.output

        env = {**central_env, "REDIS_URL": redis_plain}
        run_cli("status", env=env).assert_failed_with(
            f"bloomcrawl status: REDIS_URL redis://{hosts.central}:{plain.port}/0 is plain"
            f" text to {hosts.central}, which is not a loopback address: passwords and data"
            " would cross the network unencrypted. Use rediss:// (make certs; see"
            " docs/deploy.md), or allow it with --insecure (BLOOMCRAWL_INSECURE=1)")
        run_cli("nodes", "add", http_node, "--insecure", env=env).assert_ok()
        refused_node = run_cli("deploy", "--nodes", http_node, env=env)
        assert refused_node.code == 1 and "is plain text to" in refused_node.stderr
        listed = run_cli("--insecure", "nodes", env=env).assert_ok()
        assert listed.stdout.split() == [http_node]
    finally:
        plain.stop()


def test_the_local_cluster_publishes_redis_for_worker_hosts_with_tls_and_role_users(
        hosts: Hosts, tmp_path: Path) -> None:
    """``make up REDIS_BIND=addr`` without Docker: TLS alone, the role users, and the
    cluster's own processes still reach it (over TLS on 127.0.0.1)."""
    env = cli_environment(tmp_path)
    env_file = tmp_path / ".env"
    # free ports rather than the defaults, which a developer's cluster may hold
    env_file.write_text("".join("%s=%d\n" % (name, free_port()) for name in (
        "REDIS_PORT", "EXPORTER_PORT", "PROMETHEUS_PORT", "DEMO_PORT")))
    env.update(BLOOMCRAWL_ENV_FILE=str(env_file), BLOOMCRAWL_CERTS_DIR=str(tmp_path / "none"))
    up = ("up", "--local", "--workers", "1", "--redis-bind", hosts.central)
    refused = run_cli_process(*up, env=env)
    refused.assert_failed_with(
        f"bloomcrawl up: REDIS_BIND {hosts.central}: Redis serves TLS there with the"
        f" certificates of `make certs HOSTS='{hosts.central}'`, missing: {tmp_path}/none/ca.crt,"
        f" {tmp_path}/none/server.crt, {tmp_path}/none/server.key,"
        f" {tmp_path}/none/client.crt, {tmp_path}/none/client.key (or --insecure for plain"
        " text)")

    env["BLOOMCRAWL_CERTS_DIR"] = str(hosts.certs)
    state = tmp_path / "run" / "cluster.json"
    started = run_cli_process(*up, env=env)
    try:
        assert started.code == 0, started.output
        port = json.loads(state.read_text())["ports"]["redis"]
        assert (f"redis for worker hosts: rediss://bloomcrawl-worker:<REDIS_WORKER_PASSWORD in"
                f" {env_file}>@{hosts.central}:{port}/0") in started.stdout, started.stdout
        passwords = envfile.read_env_file(env_file)
        # the cluster's own exporter reads it over TLS on 127.0.0.1
        exporter_port = json.loads(state.read_text())["ports"]["exporter"]
        with OPENER.open("http://127.0.0.1:%d/metrics" % exporter_port, timeout=10) as answer:
            assert "\nbloomcrawl_up 1.0\n" in answer.read().decode()
        assert "nodes: 1 of 1 up" in run_cli("status", env=env).assert_ok().stdout
        # a worker host's user, over TLS on the published address
        worker = redis_from_url(redis_url(port, passwords["REDIS_WORKER_PASSWORD"],
                                          tls_dir=hosts.certs, host=hosts.central,
                                          user="bloomcrawl-worker"))
        try:
            assert worker.ping()
            with pytest.raises(redis.exceptions.NoPermissionError):
                worker.keys("*")  # the role's rules, not the default user's
        finally:
            worker.close()
        # no plain text anywhere: the one port speaks TLS
        plain = redis_from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=2,
                               socket_timeout=2, retry_on_timeout=False)
        try:
            with pytest.raises(redis.ConnectionError):
                plain.ping()
        finally:
            plain.close()
        # the role passwords are in .env alone, never on a command line
        record = json.loads(state.read_text())
        for entry in record["processes"]:
            cmdline = Path("/proc/%d/cmdline" % entry["pid"]).read_bytes()
            assert not [role for role in acl.ROLES
                        if passwords[acl.password_variable(role)].encode() in cmdline]
    finally:
        run_cli("down", env=env).assert_ok()
    assert not state.exists()
