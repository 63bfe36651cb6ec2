"""The ``remote`` case of the end-to-end test (cluster_e2e.py runs it): a worker host on
another machine joins the compose cluster over TLS (docs/deploy.md "Remote worker hosts").

Two simulated hosts, network namespaces made by scripts/swarm-hosts.sh (no swarm):
h1, the central host, at 198.18.78.11 with a dockerd of its own (data, exec root,
socket and pid files under .run/remote-hosts/h1; docker0 198.19.40.1/24, its
networks from 198.19.64.0/20), and h2, the worker host, at 198.18.78.12 without an
engine. A bridge in a third namespace joins them; nothing of them is in the root
namespace, so no traffic leaves these namespaces and their loopbacks.

The images are built into h1's engine from the root namespace (they need the
Debian mirror and PyPI); every other command runs inside a host's namespace
(``nsenter --net``): on h1 ``make certs``, ``make up WORKERS=2 REDIS_BIND=
198.18.78.11`` (the compose cluster with docker-compose.remote.yml), ``bloomcrawl
nodes add``, ``make deploy``, the crawl and ``make down``, all reaching the
containers through their ports published on h1's 127.0.0.1, as an operator on
that host would; on h2 ``make worker-host`` and ``make down``. The demo site runs
as a process on h1's LAN address, where the containers and h2 both reach it.

The checks use the helpers of cluster_e2e (``e2e``) and the simulated hosts of
common.py: one line each, "N passed, M failed" at the end.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from common import HTTP, SimulatedHosts, alive, labelled_resources

from bloomcrawl.ops.cluster.envfile import ensure_env_file

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
HOSTS_DIR = ROOT / ".run" / "remote-hosts"
PREFIX = "bcrm"
NET = "198.18.78"
CENTRAL = NET + ".11"  # h1
REMOTE = NET + ".12"  # h2
PROJECT = "bloomcrawl-e2e-remote"
#: the worker host's .env and state directory (its own checkout's, on another machine)
WORKER_DIR = ROOT / ".run" / "e2e-remote-worker"
NODE_URL = "https://%s:6800" % REMOTE
CENTRAL_WORKERS = 2
PAGES = 1000
#: each page waits this long: the crawl lasts long enough for every node's job to start
SITE_DELAY_MS = 20
SITE_URL = "http://%s:8000/" % CENTRAL
#: scripts/swarm-hosts.sh: two hosts, an engine on h1 alone, no swarm, networks apart from
#: the swarm case's (which may run beside this one)
HOSTS_ENV = {
    "SWARM_HOSTS_DIR": str(HOSTS_DIR), "SWARM_HOSTS_PREFIX": PREFIX, "SWARM_HOSTS_NET": NET,
    "SWARM_HOSTS": "2", "SWARM_HOSTS_ENGINES": "h1", "SWARM_HOSTS_SWARM": "0",
    "SWARM_HOSTS_BIP_BASE": "39", "SWARM_HOSTS_POOL_BASE": "48",
}
PLAIN_TEXT_REFUSED = "is plain text to %s, which is not a loopback address"

e2e: ModuleType
sim_hosts = SimulatedHosts(HOSTS_DIR, PREFIX, lambda: e2e.environment(), HOSTS_ENV)
#: docker on h1's engine
docker = sim_hosts.docker
#: the demo site process on h1 (started by this case, stopped by its pid)
site: subprocess.Popen[bytes] | None = None
#: ``git status --ignored`` outside .run before the case: what it may not add to
files_before: set[str] = set()


def netns(host: str) -> list[str]:
    # nsenter --net, not `ip netns exec`: that remounts /sys
    return ["nsenter", "--net=/run/netns/%s-%s" % (PREFIX, host)]


def worker_env(**extra: str) -> dict[str, str]:
    """The worker host's environment: its own .env and state, no Docker."""
    env = e2e.environment()
    env.pop("DOCKER_HOST", None)
    env.update(BLOOMCRAWL_ENV_FILE=str(WORKER_DIR / ".env"),
               BLOOMCRAWL_STATE_DIR=str(WORKER_DIR / "state"), **extra)
    return env


def in_host(host: str, *cmd: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*netns(host), *cmd], cwd=ROOT, text=True, capture_output=True,
                          env=env if env is not None else e2e.environment(), timeout=timeout)


def ok_in(host: str, *cmd: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> str:
    result = in_host(host, *cmd, env=env, timeout=timeout)
    assert result.returncode == 0, "%s on %s exited %d: %s" % (
        " ".join(cmd[:3]), host, result.returncode, (result.stdout + result.stderr)[-1200:])
    return result.stdout


def python_in(host: str, code: str, *args: str, env: dict[str, str] | None = None) -> str:
    return ok_in(host, str(VENV_BIN / "python"), "-c", code, *args, env=env)


def worker_redis_url() -> str:
    return "rediss://bloomcrawl-worker:%s@%s:6380/0" % (
        e2e.env_values()["REDIS_WORKER_PASSWORD"], CENTRAL)


#: argv: host port [password [ca certfile keyfile username]]: PING's outcome, one line
REDIS_PING = """
import sys, redis
host, port, *rest = sys.argv[1:]
kwargs = {"socket_connect_timeout": 5, "socket_timeout": 5}
if rest:
    kwargs["password"] = rest[0]
if len(rest) > 1:
    kwargs.update(ssl=True, ssl_ca_certs=rest[1], ssl_certfile=rest[2], ssl_keyfile=rest[3],
                  username=rest[4])
try:
    print("PONG" if redis.Redis(host=host, port=int(port), **kwargs).ping() else "no")
except Exception as exc:
    print("%s: %s" % (type(exc).__name__, exc))
"""


def demo_stats() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(python_in("h1", HTTP, SITE_URL + "__stats"))
    return data


def project_containers() -> list[dict[str, Any]]:
    ids = docker("ps", "-aq", "--filter", "label=com.docker.compose.project=%s"
                 % PROJECT).stdout.split()
    found: list[dict[str, Any]] = json.loads(docker("inspect", *ids).stdout) if ids else []
    return found


def project_resources() -> list[str]:
    return labelled_resources("com.docker.compose.project=%s" % PROJECT,
                              sim_hosts.docker_command(), check=False)


def files_outside_run() -> set[str]:
    """New files and directories (untracked or ignored) outside .run and the build's caches
    (the venv, the wheelhouse and .cache, which outlive every case by design)."""
    out = subprocess.run(["git", "status", "--porcelain", "-z", "--ignored"], cwd=ROOT,
                         text=True, capture_output=True, check=True, timeout=60).stdout
    return {entry[3:] for entry in out.split("\0") if entry[:2] in ("??", "!!")
            and not entry[3:].startswith((".run/", ".venv", "deploy/wheels/", ".cache/"))
            and "__pycache__" not in entry and not entry[3:].startswith((
                ".mypy_cache/", ".ruff_cache/", ".pytest_cache/"))}


def recorded_pids(state_dir: Path) -> list[int]:
    cluster_file = state_dir / "cluster.json"
    if not cluster_file.is_file():
        return []
    return [int(p["pid"]) for p in json.loads(cluster_file.read_text()).get("processes", [])]


# --- the checks -------------------------------------------------------------------


def check_hosts() -> str:
    out = sim_hosts.script("start")
    ours = sorted(sim_hosts.namespaces())
    assert ours == ["bcrm-h1", "bcrm-h2", "bcrm-lan"], ours
    docker("info")
    return "%s; namespaces %s" % (out.strip().splitlines()[-1], ", ".join(ours))


def check_images() -> str:
    started = time.monotonic()
    ensure_env_file(e2e.ENV_FILE)  # what `make up` writes first: the compose file needs it
    # in the root namespace: debootstrap and the wheelhouse need the Debian mirror and PyPI
    result = subprocess.run([str(ROOT / "scripts" / "build-images.sh"), str(e2e.ENV_FILE)],
                            cwd=ROOT, text=True, capture_output=True, timeout=900,
                            env=e2e.environment())
    assert result.returncode == 0, "build-images.sh: %s" % (result.stdout
                                                            + result.stderr)[-1500:]
    images = docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    assert "bloomcrawl/worker:latest" in images, images
    return "built into h1's engine in %.0fs" % (time.monotonic() - started)


def check_certs() -> str:
    certs = e2e.STATE_DIR / "certs"
    e2e.make("certs", "CERTS_DIR=%s" % certs, "HOSTS=127.0.0.1 %s" % CENTRAL, timeout=120)
    e2e.make("certs", "CERTS_DIR=%s" % certs, "NAME=worker-host", "HOSTS=%s" % REMOTE,
             timeout=120)
    # what the worker host is given (docs/deploy.md, step 1)
    remote = WORKER_DIR / "state" / "certs"
    remote.mkdir(mode=0o700, parents=True, exist_ok=True)
    for source, name in (("ca.crt", "ca.crt"), ("client.crt", "client.crt"),
                         ("client.key", "client.key"), ("worker-host.crt", "server.crt"),
                         ("worker-host.key", "server.key")):
        shutil.copyfile(certs / source, remote / name)
    return "CA, %s's and %s's certificates, the client's" % (CENTRAL, REMOTE)


def check_up() -> str:
    started = time.monotonic()
    e2e.make("up", "WORKERS=%d" % CENTRAL_WORKERS, "REDIS_BIND=%s" % CENTRAL, timeout=600)
    took = time.monotonic() - started
    containers = project_containers()
    workers = 0
    for c in containers:
        name = c["Name"].lstrip("/")
        health = (c["State"].get("Health") or {}).get("Status")
        assert c["State"]["Running"] and health in (None, "healthy"), "%s is %s" % (
            name, health or c["State"]["Status"])
        workers += c["Config"]["Labels"].get("com.docker.compose.service") == "worker"
        for port, bindings in (c["NetworkSettings"].get("Ports") or {}).items():
            for b in bindings or []:
                expected = CENTRAL if port == "6380/tcp" else "127.0.0.1"
                assert b["HostIp"] == expected, "%s publishes %s on %s" % (name, port, b)
    assert workers == CENTRAL_WORKERS, "%d workers" % workers
    password = e2e.env_values()["REDIS_PASSWORD"]
    # the plain port answers on h1's loopback alone; REDIS_BIND has TLS alone
    local = python_in("h1", REDIS_PING, "127.0.0.1", "6379", password).strip()
    assert local == "PONG", "plain 127.0.0.1:6379 on h1: %s" % local
    for port in ("6379", "6380"):
        plain = python_in("h2", REDIS_PING, CENTRAL, port, password).strip()
        assert plain != "PONG" and "ConnectionError" in plain, (
            "plain text to %s:%s from h2: %s" % (CENTRAL, port, plain))
    return ("make up took %.0fs; %d workers healthy; TLS 6380 on %s alone, every other port"
            " on 127.0.0.1; plain redis:// from h2 to %s:6379 and :6380 fails, plain"
            " 127.0.0.1:6379 on h1 answers" % (took, workers, CENTRAL, CENTRAL))


def check_worker_host() -> str:
    central = e2e.env_values()
    WORKER_DIR.mkdir(parents=True, exist_ok=True)
    (WORKER_DIR / ".env").write_text(
        "# the e2e test's worker host (tests/e2e/remote_e2e.py)\nSCRAPYD_USERNAME=%s\n"
        "SCRAPYD_PASSWORD=%s\n" % (central["SCRAPYD_USERNAME"], central["SCRAPYD_PASSWORD"]))
    certs = WORKER_DIR / "state" / "certs"
    whoami = python_in("h2", REDIS_PING, CENTRAL, "6380", central["REDIS_WORKER_PASSWORD"],
                       str(certs / "ca.crt"), str(certs / "client.crt"),
                       str(certs / "client.key"), "bloomcrawl-worker").strip()
    assert whoami == "PONG", "rediss:// as bloomcrawl-worker from h2: %s" % whoami
    plain_url = worker_redis_url().replace("rediss://", "redis://")
    refused = in_host("h2", str(VENV_BIN / "bloomcrawl"), "worker-host", "--node-url",
                      NODE_URL, "--workers", "1", env=worker_env(REDIS_URL=plain_url))
    assert refused.returncode != 0 and PLAIN_TEXT_REFUSED % CENTRAL in refused.stderr, (
        "worker-host on redis://: %d %s" % (refused.returncode, refused.stderr[-600:]))
    assert not recorded_pids(WORKER_DIR / "state"), "the refused worker host started processes"
    out = ok_in("h2", "make", "--no-print-directory", "worker-host", "NODE_URL=%s" % NODE_URL,
                "WORKERS=1", env=worker_env(REDIS_URL=worker_redis_url()), timeout=180)
    assert "worker host up" in out, out[-800:]
    pids = recorded_pids(WORKER_DIR / "state")
    assert len(pids) == 2 and all(alive(p) for p in pids), "recorded %s" % pids
    return ("rediss:// as bloomcrawl-worker answers from h2; redis:// refused; make"
            " worker-host: scrapyd and its TLS proxy at %s (pids %s)" % (
                NODE_URL, " ".join(map(str, pids))))


def check_nodes_add() -> str:
    plain_node = NODE_URL.replace("https://", "http://")
    refused = e2e.bloomcrawl("nodes", "add", plain_node)
    assert refused.returncode != 0 and PLAIN_TEXT_REFUSED % REMOTE in refused.stderr, (
        "nodes add %s: %d %s" % (plain_node, refused.returncode, refused.stderr[-600:]))
    # allowed, plain text still gets nowhere: the node speaks TLS alone
    insecure = e2e.bloomcrawl("--insecure", "nodes", "add", plain_node)
    assert insecure.returncode != 0 and "not added" in insecure.stderr, (
        "nodes add --insecure %s: %d %s" % (plain_node, insecure.returncode,
                                            insecure.stderr[-600:]))
    plain_redis = "redis://:%s@%s:6380/0" % (e2e.env_values()["REDIS_PASSWORD"], CENTRAL)
    env = {**e2e.environment(), "REDIS_URL": plain_redis}
    status = in_host("h1", str(VENV_BIN / "bloomcrawl"), "status", env=env)
    assert status.returncode != 0 and PLAIN_TEXT_REFUSED % CENTRAL in status.stderr, (
        "status on %s: %d %s" % (plain_redis.split("@")[1], status.returncode,
                                 status.stderr[-600:]))
    status = in_host("h1", str(VENV_BIN / "bloomcrawl"), "--insecure", "status", env=env)
    assert status.returncode != 0 and PLAIN_TEXT_REFUSED % CENTRAL not in status.stderr, (
        "status --insecure on plain text to the TLS port: %d %s" % (status.returncode,
                                                                    status.stderr[-600:]))
    added = e2e.bloomcrawl("nodes", "add", NODE_URL)
    assert added.returncode == 0 and "added %s" % NODE_URL in added.stdout, (
        added.stdout + added.stderr)[-600:]
    listed = e2e.bloomcrawl("nodes")
    assert listed.returncode == 0 and NODE_URL in listed.stdout.split(), (
        listed.stdout + listed.stderr)[-600:]
    return ("http:// refused (with --insecure: not added, the node speaks TLS alone); redis://"
            " to %s refused (with --insecure: no answer in plain text); nodes add %s with the"
            " CA; nodes lists %d" % (CENTRAL, NODE_URL, len(listed.stdout.split())))


def check_deploy() -> str:
    out = e2e.make("deploy", timeout=240)
    nodes = CENTRAL_WORKERS + 1
    assert "to %d of %d node(s)" % (nodes, nodes) in out, out[-800:]
    assert "ok   %s: bloomcrawl " % NODE_URL in out, out[-800:]
    status = e2e.make("status", timeout=120)
    assert "nodes: %d of %d up" % (nodes, nodes) in status, status[-1500:]
    assert "%s  yes" % NODE_URL.removeprefix("https://") in status, status[-1500:]
    return "deployed to %d of %d nodes, %s among them; make status: %d of %d up" % (
        nodes, nodes, NODE_URL, nodes, nodes)


def start_site() -> None:
    global site
    log = (e2e.WORK / "demo-site.log").open("wb")
    site = subprocess.Popen([*netns("h1"), str(VENV_BIN / "bloomcrawl-demo-site"), "--host",
                             CENTRAL, "--port", "8000", "--pages", str(PAGES), "--delay-ms",
                             str(SITE_DELAY_MS)], cwd=ROOT, stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 30
    while True:
        try:
            if demo_stats()["pages"] == PAGES:
                return
        except AssertionError:
            pass
        assert site.poll() is None, "the demo site exited %s" % site.returncode
        assert time.monotonic() < deadline, "the demo site did not answer within 30s"
        time.sleep(0.5)


def stop_site() -> None:
    # nsenter execs the site: the pid is its own
    if site is not None and site.poll() is None:
        site.send_signal(signal.SIGTERM)
        try:
            site.wait(timeout=20)
        except subprocess.TimeoutExpired:
            site.kill()
            site.wait(timeout=20)


def pages_by_node() -> dict[str, int]:
    redis_ids = docker("ps", "-q", "--filter", "label=com.docker.compose.project=%s" % PROJECT,
                       "--filter", "label=com.docker.compose.service=redis").stdout.split()
    assert redis_ids, "no redis container"
    out = docker("exec", redis_ids[0], "redis-cli", "--no-auth-warning", "hgetall",
                 "{site:stats}:pages_by_node").stdout.split()
    return {k: int(v) for k, v in zip(out[::2], out[1::2], strict=True)}


def check_crawl() -> str:
    start_site()
    started = time.monotonic()
    # the politeness budget is per host across the cluster (8 by default): one the nodes
    # share, else whichever starts first takes it all (`make demo` gives 16 per node too)
    result = e2e.bloomcrawl("crawl", "--max-idle", "5", "--wait", "--timeout", "300",
                            "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=%d" % (
                                16 * (CENTRAL_WORKERS + 1)), SITE_URL, timeout=360)
    took = time.monotonic() - started
    assert result.returncode == 0, "crawl: %s" % (result.stdout + result.stderr)[-1000:]
    assert "site running on %d node(s)" % (CENTRAL_WORKERS + 1) in result.stdout, (
        result.stdout[-800:])
    stats = demo_stats()
    assert stats["pages"] == PAGES and stats["missing"] == 0, (
        "%d of %d pages never crawled" % (stats["missing"], PAGES))
    assert stats["duplicates"] == 0, "%d fetched twice" % stats["duplicates"]
    central_names = {c["Config"]["Hostname"] for c in project_containers()
                     if c["Config"]["Labels"].get("com.docker.compose.service") == "worker"}
    by_node = pages_by_node()
    central = {k: v for k, v in by_node.items() if k in central_names}
    remote = {k: v for k, v in by_node.items() if k not in central_names}
    assert sum(by_node.values()) == PAGES, by_node
    assert len(central) == CENTRAL_WORKERS and all(central.values()), (
        "central workers %s: %s" % (sorted(central_names), by_node))
    assert len(remote) == 1 and all(remote.values()), "the remote node crawled nothing: %s" % (
        by_node)
    return "all %d pages exactly once in %.0fs; pages by node: central %s, remote %s" % (
        PAGES, took, sorted(central.values()), list(remote.values()))


def check_exporter() -> str:
    port = e2e.env_values().get("EXPORTER_PORT", "9410")
    text = python_in("h1", HTTP, "http://127.0.0.1:%s/metrics" % port)
    label = 'node="%s"' % NODE_URL.removeprefix("https://")
    up = [line for line in text.splitlines()
          if line.startswith("bloomcrawl_scrapyd_node_up{") and label in line]
    assert up and up[0].split()[-1] in ("1", "1.0"), "node_up for %s: %s" % (label, up)
    return "the exporter container reaches %s over TLS: %s" % (NODE_URL, up[0])


#: argv: schedule name; REDIS_PORT and REDIS_PASSWORD in the environment: the schedule's
#: last outcome and its run's state, as JSON
SCHEDULE_STATE = """
import json, os, sys, redis
from bloomcrawl.ops.runs import RunStore
from bloomcrawl.ops.schedules import ScheduleStore
client = redis.Redis(host="127.0.0.1", port=int(os.environ["REDIS_PORT"]),
                     password=os.environ["REDIS_PASSWORD"])
outcome = ScheduleStore(client).get(sys.argv[1]).outcome
run = RunStore(client).get(outcome["run"]) if outcome and outcome.get("run") else None
print(json.dumps({"outcome": outcome, "status": run.status if run else None,
                  "finish_reason": run.finish_reason if run else None}))
"""


def check_timer() -> str:
    """The timer container fires a recurring crawl into the remote node too: it reads the
    node and its CA from Redis, as the exporter does."""
    made = e2e.bloomcrawl("schedule", "--name", "e2e-remote", "--every", "1h", "--max-idle",
                          "2", SITE_URL)
    assert made.returncode == 0, "schedule: %s" % (made.stdout + made.stderr)[-500:]
    values = e2e.env_values()
    env = {**e2e.environment(), "REDIS_PORT": values.get("REDIS_PORT", "6379"),
           "REDIS_PASSWORD": values["REDIS_PASSWORD"]}
    deadline = time.monotonic() + 180
    while True:
        state = json.loads(python_in("h1", SCHEDULE_STATE, "e2e-remote", env=env))
        if state["status"] == "finished":
            break
        assert time.monotonic() < deadline, "after 180s: %s" % state
        time.sleep(2)
    outcome = state["outcome"]
    started = sorted(outcome["started"])
    assert outcome["result"] == "started" and NODE_URL in started, outcome
    assert len(started) == CENTRAL_WORKERS + 1, outcome
    assert state["finish_reason"] == "finished", state
    removed = e2e.bloomcrawl("schedules", "remove", "e2e-remote")
    assert removed.returncode == 0, (removed.stdout + removed.stderr)[-500:]
    return "fired on %d nodes, %s among them; the run ended %s" % (
        len(started), NODE_URL, state["finish_reason"])


def check_down() -> str:
    pids = recorded_pids(WORKER_DIR / "state")
    ok_in("h2", "make", "--no-print-directory", "down", env=worker_env(), timeout=120)
    left = [p for p in pids if alive(p)]
    assert not left, "worker host processes left: %s" % left
    e2e.make("down", timeout=240)
    stop_site()
    resources = project_resources()
    assert not resources, "left behind on h1: %s" % resources
    return "worker host's %d processes stopped; no container, network or volume of %s;" \
           " demo site stopped" % (len(pids), PROJECT)


def check_hosts_gone() -> str:
    pids = sim_hosts.engine_pids()
    sim_hosts.script("stop")
    alive_pids = [p for p in pids if p and alive(int(p))]
    ours = sim_hosts.namespaces()
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(HOSTS_DIR))]
    new_files = sorted(files_outside_run() - files_before)
    assert not alive_pids and not ours and not HOSTS_DIR.exists() and not mounts, (
        "left: pids %s, namespaces %s, mounts %s, %s exists: %s" % (
            alive_pids, ours, mounts, HOSTS_DIR, HOSTS_DIR.exists()))
    assert not new_files, "files left outside .run: %s" % new_files
    return "engine %s stopped; namespaces, mounts and %s removed; no new file outside .run" % (
        " ".join(pids), HOSTS_DIR)


def leftovers() -> None:
    """A previous run that died may have left its hosts, its worker host or its state."""
    pids = [p for p in recorded_pids(WORKER_DIR / "state") if alive(p)]
    if pids or HOSTS_DIR.exists():
        e2e.log("removing what a previous run left")
        if pids:
            subprocess.run([str(VENV_BIN / "bloomcrawl"), "down"], cwd=ROOT,
                           env=worker_env(), capture_output=True, timeout=120)
        try:
            if docker("info", check=False).returncode == 0 and project_resources():
                e2e.make("down", timeout=240)
        finally:
            sim_hosts.script("stop")
    shutil.rmtree(WORKER_DIR, ignore_errors=True)
    shutil.rmtree(e2e.WORK, ignore_errors=True)


def run_remote(module: ModuleType) -> None:
    global e2e, files_before
    e2e = module
    e2e.use(PROJECT, ROOT / ".run" / "e2e-remote")
    e2e.log("remote worker host: compose project %s on h1 (%s), worker host h2 (%s), state"
            " in %s" % (PROJECT, CENTRAL, REMOTE, e2e.WORK))
    e2e.EXTRA_ENV.clear()
    e2e.EXTRA_ENV["DOCKER_HOST"] = sim_hosts.socket()
    leftovers()
    files_before = files_outside_run()
    e2e.WORK.mkdir(parents=True, exist_ok=True)
    # h1 has ports of its own: the defaults, and the TLS port on REDIS_BIND
    e2e.ENV_FILE.write_text("# the e2e test's cluster (tests/e2e/remote_e2e.py)\n"
                            "COMPOSE_PROJECT_NAME=%s\n" % PROJECT)
    try:
        e2e.check("remote: two hosts, h1 with its own dockerd, h2 without", check_hosts)
        hosts_up = e2e.results[-1][1]
        steps = [
            ("remote: the images built into h1's engine", check_images),
            ("remote: make certs for h1 and h2", check_certs),
            ("remote: make up WORKERS=2 REDIS_BIND=h1: TLS on REDIS_BIND alone, plain on"
             " loopback alone", check_up),
            ("remote: make worker-host on h2 joins over rediss:// as bloomcrawl-worker;"
             " redis:// refused", check_worker_host),
            ("remote: nodes add https:// with the CA; http:// and redis:// refused",
             check_nodes_add),
            ("remote: make deploy reaches the remote node; make status shows it up",
             check_deploy),
            ("remote: %d-page crawl: every page exactly once, the remote node did some"
             % PAGES, check_crawl),
            ("remote: the exporter container reaches the remote node", check_exporter),
            ("remote: the timer container fires a recurring crawl into the remote node too",
             check_timer),
        ]
        failed = "" if hosts_up else "the hosts"
        e2e.COMMAND_PREFIX[:] = netns("h1")
        for name, func in steps:
            if failed:
                e2e.skip(name, "failed before: " + failed)
            elif not e2e.check(name, func) and func not in (check_exporter, check_timer):
                failed = name
        if hosts_up:
            e2e.check("remote: make down on both hosts leaves nothing", check_down)
    finally:
        stop_site()
        e2e.COMMAND_PREFIX.clear()
        e2e.check("remote: the engine, namespaces, mounts and their files are gone",
                  check_hosts_gone)
        e2e.EXTRA_ENV.clear()
