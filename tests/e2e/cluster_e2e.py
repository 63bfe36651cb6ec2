"""The cluster end to end, in real containers: what `make e2e` runs (via run.sh).

1. ``make up WORKERS=3``; every container healthy; ``make deploy`` reaches the
   three workers, and a deploy including an unreachable node fails.
2. ``make demo``: the 2,000-page demo site is crawled, every page exactly once
   (the site counts its hits), and each of the three workers did some of it.
3. A second crawl from scratch; one worker container is killed mid-crawl: still
   every page crawled (its leases expire and go back to the queue).
4. ``make scale WORKERS=4`` then ``make deploy`` reaches the new worker too.
5. Prometheus has scraped the exporter's metrics.
6. ``make down`` leaves no container, network or volume of the project.

Then the same cluster on a Redis Cluster (``make up REDIS=cluster``: six
nodes, 3 masters with 1 replica each, docker-compose.cluster.yml):

7. ``make up WORKERS=3 REDIS=cluster``: every container healthy, 3 masters
   with a replica each, the workers and the exporter on a redis+cluster:// URL.
8. ``make deploy``; ``make demo``: every page exactly once, every worker
   worked; ``make status`` on the host reads the cluster.
9. The exporter's /metrics: the spider's metrics, and one series per master
   of each per-master family (``bloomcrawl_redis_node_*``, ``_filter_node_*``).
10. ``make down KEEP_DATA=1`` then ``make up REDIS=cluster``: the cluster
    comes back (on new container addresses) with the crawl's data.
11. ``make down`` leaves no container, network or volume of the project.

Then the stack on a Docker Swarm of three simulated hosts (``swarm``): three
network namespaces, each with its own dockerd, joined into one swarm
(scripts/swarm-hosts.sh; nothing of them is in the root namespace):

12. ``make up WORKERS=3`` on the manager (found by ``docker info``): the images
    built there and loaded on the two other nodes, the stack running with a
    worker on each node, Redis on the labelled node, nothing published.
13. ``make deploy`` reaches the three replicas; ``make status`` lists each
    replica with its node; ``make logs`` shows the workers of every node.
14. ``make demo``: every page exactly once, pages crawled on all three nodes.
15. A second crawl; one worker node dies mid-crawl (its link down, its dockerd,
    containerd and containers killed): its task moves to a live node, every page
    is still crawled, and ``make deploy`` reaches the rescheduled replica at its
    new address.
16. The node comes back; ``make scale WORKERS=4``, then ``make deploy`` reaches 4.
17. Prometheus, on the manager, has the exporter's metrics.
18. ``make down`` leaves no container, network or volume on any node; then the
    engines, namespaces and their files are gone.

Then a worker host on another machine (``remote``, tests/e2e/remote_e2e.py): two
network namespaces, the central host with its own dockerd, the worker host
without one (scripts/swarm-hosts.sh, no swarm):

19. ``make certs`` for both; ``make up WORKERS=2 REDIS_BIND=<central>`` on the
    central host: Redis TLS published on that address alone, a plain client
    from the worker host gets no answer, plain text answers on loopback alone.
20. ``make worker-host`` on the worker host joins over ``rediss://`` as
    ``bloomcrawl-worker`` (``redis://`` refused); ``bloomcrawl nodes add
    https://...`` with the CA (``http://`` and ``redis://`` refused unless
    ``--insecure``, and then unanswered); ``make deploy`` reaches it.
21. A 1,000-page crawl: every page exactly once, the central workers and the
    remote node each did some; the exporter container reports the node up, and
    the timer container fires a recurring crawl on it too.
22. ``make down`` on both hosts; the engine, namespaces, mounts and their files
    are gone, and no new file is left outside .run.

E2E_CASES (``single,cluster,swarm,remote`` by default) picks the cases to run. Each case
runs as its own compose project with its own .env, state directory and free
ports, so a developer's cluster is left alone. Prints one line per check and
ends with "N passed, M failed", then one line per failed check: its name and
why, so that the last lines of a CI log say what failed.

Every host port the cluster publishes comes from one block of free ports below
the kernel's ephemeral range (``free_block``): a port picked there stays free
until docker binds it, whereas a port of the ephemeral range can meanwhile
become any connection's local port (and stays unbindable for a minute in
TIME_WAIT), which fails ``make up``. Should ``make up`` fail on a taken port
all the same, the case starts again on another block, once, and says so.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "crawler"))

from common import labelled_resources  # noqa: E402

from bloomcrawl.ops import scrapyd  # noqa: E402
from bloomcrawl.ops.cli.jobs import clear_spider, seed  # noqa: E402
from bloomcrawl.ops.cli.target import Target, resolve_target  # noqa: E402
from bloomcrawl.ops.cluster.compose import Compose  # noqa: E402
from bloomcrawl.ops.cluster.envfile import read_env_file  # noqa: E402
from bloomcrawl.ops.cluster.processes import free_port, port_is_free  # noqa: E402
from bloomcrawl.ops.cluster.state import Paths  # noqa: E402
from bloomcrawl.ops.runs import RunStore  # noqa: E402
from bloomcrawl.ops.schedules import ScheduleStore  # noqa: E402

#: the case running: its compose project and where its .env and state are (see use())
PROJECT = "bloomcrawl-e2e"
WORK = ROOT / ".run" / "e2e"
ENV_FILE = WORK / ".env"
STATE_DIR = WORK / "state"
PAGES = 2000
WORKERS = 3
BUDGET = 30 * 60  # the whole test, every case, cold, on 2 cores
CASES = ("single", "cluster", "swarm", "remote")
#: what every make and bloomcrawl command of the case running gets in its environment too
EXTRA_ENV: dict[str, str] = {}
#: what every make and bloomcrawl command of the case running is started under (the remote
#: case: ``nsenter --net=...``, on its central host)
COMMAND_PREFIX: list[str] = []
#: the Redis Cluster's nodes (docker-compose.cluster.yml)
CLUSTER_NODES = ("redis", "redis-2", "redis-3", "redis-4", "redis-5", "redis-6")
#: per-master metric families: one series per master (per spider)
PER_MASTER_PREFIXES = ("bloomcrawl_redis_node_", "bloomcrawl_filter_node_")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
STARTED = time.monotonic()

results: list[tuple[str, bool, str]] = []
#: what happened that did not fail a check but should be read (a retried make up)
notes: list[str] = []
#: make's output saying a host port was taken: docker-proxy's bind, docker's allocator
PORT_TAKEN = re.compile(r"address already in use|port is already allocated", re.I)
#: a line of make's output that tells why it failed
ERROR_LINE = re.compile(r"error|fail|cannot|can't|unable|denied|refused|in use|"
                        r"already allocated|not found|no such|unhealthy|exited|timed out|"
                        r"killed|no space", re.I)
#: a line of make's output that says what failed, before any other (docker-compose, dockerd)
STRONG_ERROR_LINE = re.compile(r"^ERROR\b|^Error\b|Error response from daemon|bind: ")
#: lines that say something failed but not what
GENERIC_ERROR = re.compile(r"^make(\[\d+\])?: \*\*\*|Encountered errors while bringing up")


def log(message: str) -> None:
    sys.stdout.write("[e2e %4.0fs] %s\n" % (time.monotonic() - STARTED, message))
    sys.stdout.flush()


def check(name: str, func: Callable[[], str | None]) -> bool:
    """Run one check; record and print its outcome."""
    started = time.monotonic()
    try:
        detail = func() or ""
        ok = True
    except Exception as exc:  # a failed check, whatever raised
        detail = "%s: %s" % (type(exc).__name__, exc)
        if not isinstance(exc, AssertionError):
            detail += "\n" + traceback.format_exc(limit=3)
        ok = False
    took = time.monotonic() - started
    results.append((name, ok, detail))
    log("%s %s (%.0fs)%s" % ("PASS" if ok else "FAIL", name, took,
                             ": " + detail if detail else ""))
    return ok


def one_line(text: str, limit: int = 400) -> str:
    """``text`` as one line of at most ``limit`` characters (docker's 64-digit ids cut to 12)."""
    line = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{20,}\b", r"\1", " ".join(text.split()))
    return line if len(line) <= limit else line[:limit - 3] + "..."


class MakeFailed(AssertionError):
    """A make target failed; ``output`` is everything it printed, ``reason`` why, in one line."""

    def __init__(self, message: str, output: str, reason: str) -> None:
        super().__init__(message)
        self.output = output
        self.reason = reason


def failure_reason(lines: list[str]) -> str:
    """Why a make target failed, from its output: the error it ended with
    (``bloomcrawl <command>: ...``) and the line before it that says what went
    wrong (docker-compose's ``ERROR: for redis ...``, a script's message)."""
    text = [line.strip() for line in lines if line.strip()]
    text = [line for line in text if not GENERIC_ERROR.search(line)]
    if not text:
        return "no output"
    last = len(text) - 1
    for i in range(len(text) - 1, max(-1, len(text) - 15), -1):
        if text[i].startswith("bloomcrawl "):
            last = i
            break
    final = text[last]
    before = [line for line in text[max(0, last - 20):last]
              if line != final and not line.startswith("bloomcrawl ")]
    # docker-compose's "ERROR: for redis  Cannot start service ...", the engine's answer;
    # else the last line naming a failure; else the line just before the end
    cause = (next((line for line in before if STRONG_ERROR_LINE.search(line)), "")
             or next((line for line in reversed(before) if ERROR_LINE.search(line)), "")
             or (before[-1] if before else ""))
    return one_line(cause, 300) + " | " + one_line(final, 300) if cause else one_line(final)


def skip(name: str, reason: str) -> None:
    results.append((name, False, "not run: " + reason))
    log("FAIL %s: not run: %s" % (name, reason))


def use(project: str, work: Path) -> None:
    """Run the next checks against compose project ``project``, its files under ``work``."""
    global PROJECT, WORK, ENV_FILE, STATE_DIR
    PROJECT, WORK = project, work
    ENV_FILE, STATE_DIR = work / ".env", work / "state"


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        BLOOMCRAWL_ENV_FILE=str(ENV_FILE),
        BLOOMCRAWL_STATE_DIR=str(STATE_DIR),
        BLOOMCRAWL_ROOT=str(ROOT),
    )
    env.update(EXTRA_ENV)
    return env


def make(*targets: str, timeout: float) -> str:
    """A make target, its output echoed as it comes; raises when it fails or times out."""
    remaining = BUDGET - (time.monotonic() - STARTED)
    timeout = max(30.0, min(timeout, remaining))
    log("$ make %s" % " ".join(targets))
    proc = subprocess.Popen([*COMMAND_PREFIX, "make", "--no-print-directory", *targets],
                            cwd=ROOT, env=environment(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "DEPRECATED: The legacy builder" in line or "buildx" in line or not line.strip():
                continue
            sys.stdout.write("    " + line)
            sys.stdout.flush()
        code = proc.wait()
    finally:
        killer.cancel()
    if code != 0:
        reason = failure_reason(lines)
        raise MakeFailed("make %s exited %d%s: %s" % (
            " ".join(targets), code, " (killed after %.0fs)" % timeout if code < 0 else "",
            reason), "".join(lines), reason)
    return "".join(lines)


def bloomcrawl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND_PREFIX, str(ROOT / ".venv" / "bin" / "bloomcrawl"), *args],
                          cwd=ROOT, env=environment(), text=True, capture_output=True,
                          timeout=timeout)


def free_block(size: int) -> int:
    """The first port of ``size`` consecutive free ports below the ephemeral range.

    No connection gets a local port there unless it binds one, so a port free
    now is still free when docker binds it minutes later (``make demo`` binds
    DEMO_PORT after the crawl's ``up`` and ``deploy``), and docker's own picks
    for ``127.0.0.1::6379`` (from the ephemeral range) never meet ours. The
    blocks are tried in a random order: two runs at once rarely want the same.
    """
    bases = list(range(16800, 30000 - size, 100))
    random.shuffle(bases)
    for base in bases:
        if all(port_is_free(base + i) for i in range(size)):
            return base
    raise RuntimeError("no %d consecutive free ports in 16800-30000" % size)


def env_values() -> dict[str, str]:
    return read_env_file(ENV_FILE)


def project_resources() -> list[str]:
    return labelled_resources("com.docker.compose.project=%s" % PROJECT)


def compose_down_leftovers() -> None:
    """A previous run that died may have left its cluster: remove it first."""
    if ENV_FILE.exists() and project_resources():
        log("removing the cluster a previous run left")
        make("down", timeout=180)


def write_env_file() -> None:
    """A new .env (no secrets: ``make up`` adds them) with every port from one free block."""
    WORK.mkdir(parents=True, exist_ok=True)
    base = free_block(25)
    values = {
        "COMPOSE_PROJECT_NAME": PROJECT,
        "REDIS_PORT": str(base + 20),
        "EXPORTER_PORT": str(base + 21),
        "PROMETHEUS_PORT": str(base + 22),
        "GRAFANA_PORT": str(base + 23),
        "DEMO_PORT": str(base + 24),
        "WORKER_PORTS": "%d-%d" % (base, base + 19),
        "DEMO_PAGES": str(PAGES),
    }
    log("host ports %d-%d (workers %s, redis %s, exporter %s, prometheus %s, demo %s)" % (
        base, base + 24, values["WORKER_PORTS"], values["REDIS_PORT"], values["EXPORTER_PORT"],
        values["PROMETHEUS_PORT"], values["DEMO_PORT"]))
    ENV_FILE.write_text("# the e2e test's cluster (tests/e2e/cluster_e2e.py)\n" + "".join(
        "%s=%s\n" % item for item in values.items()))


def paths() -> Paths:
    return Paths(ROOT, ENV_FILE, STATE_DIR)


def target() -> Target:
    return resolve_target(paths(), need_nodes=True)


def demo_url(path: str) -> str:
    return "http://127.0.0.1:%s/%s" % (env_values()["DEMO_PORT"], path)


def demo_stats() -> dict[str, Any]:
    with OPENER.open(demo_url("__stats"), timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def latest_finished_jobs(t: Target) -> dict[str, dict[str, Any]]:
    """Each node's most recently finished job of the site spider."""
    latest = {}
    for node in t.nodes:
        jobs = node.request("listjobs.json?project=bloomcrawl")["finished"]
        jobs = [j for j in jobs if j.get("spider") == "site"]
        if jobs:
            latest[node.url] = max(jobs, key=lambda j: j.get("end_time") or "")
    return latest


def responses_in_log(node: scrapyd.Node, log_url: str) -> int:
    request = urllib.request.Request(node.url + log_url)
    token = base64.b64encode(("%s:%s" % (node.username, node.password)).encode()).decode()
    request.add_header("Authorization", "Basic " + token)
    with OPENER.open(request, timeout=30) as response:
        text = response.read().decode(errors="replace")
    counts = re.findall(r"'response_received_count': (\d+)", text)
    return int(counts[-1]) if counts else 0


# --- the checks -------------------------------------------------------------------


def make_up(*extra: str) -> str:
    """``make up``; when a host port was taken meanwhile, ``make down`` and once more
    on another block of ports (noted, and named in the last lines)."""
    try:
        return make("up", "WORKERS=%d" % WORKERS, *extra, timeout=900)
    except MakeFailed as exc:
        if not PORT_TAKEN.search(exc.output):
            raise
        note = "%s: make up found a host port taken (%s); again on other ports" % (
            PROJECT, exc.reason)
        log("NOTE " + note)
        notes.append(note)
    make("down", timeout=180)
    write_env_file()
    return make("up", "WORKERS=%d" % WORKERS, *extra, timeout=900)


def check_up(*extra: str) -> str:
    started = time.monotonic()
    make_up(*extra)
    took = time.monotonic() - started
    nodes = target().nodes
    assert len(nodes) == WORKERS, "expected %d workers, found %s" % (WORKERS, nodes)
    for c in Compose(paths()).containers():
        health = (c["State"].get("Health") or {}).get("Status")
        assert health in (None, "healthy"), "%s is %s" % (c["Name"], health)
        for binding in (c["NetworkSettings"].get("Ports") or {}).values():
            for b in binding or []:
                assert b["HostIp"] == "127.0.0.1", "%s publishes on %s" % (c["Name"], b)
    return "%d workers healthy, every port on 127.0.0.1; make up took %.0fs" % (len(nodes), took)


def check_deploy() -> str:
    make("deploy", timeout=180)
    t = target()
    for node in t.nodes:
        projects = node.request("listprojects.json")["projects"]
        assert "bloomcrawl" in projects, "%s has %s" % (node.url, projects)
        spiders = node.request("listspiders.json?project=bloomcrawl")["spiders"]
        assert "site" in spiders, "%s lists %s" % (node.url, spiders)
    nodes = ",".join([n.url for n in t.nodes] + ["http://127.0.0.1:%d" % free_port()])
    bad = bloomcrawl("deploy", "--nodes", nodes)
    assert bad.returncode == 1, "a deploy with an unreachable node exited %d" % bad.returncode
    return "project and spider on all %d workers; an unreachable node fails the deploy" % len(
        t.nodes)


def check_demo_crawl() -> str:
    make("demo", "WORKERS=%d" % WORKERS, timeout=600)
    stats = demo_stats()
    assert stats["pages"] == PAGES, stats["pages"]
    assert stats["missing"] == 0, "%d pages never crawled" % stats["missing"]
    assert stats["duplicates"] == 0, "%d extra fetches: %s" % (
        stats["duplicates"], {p: n for p, n in stats["hits"].items() if n > 1})
    t = target()
    jobs = latest_finished_jobs(t)
    per_node = {}
    for node in t.nodes:
        job = jobs.get(node.url)
        assert job, "%s finished no site job" % node.url
        per_node[node.url] = responses_in_log(node, job["log_url"])
    assert all(n > 0 for n in per_node.values()), "a worker did nothing: %s" % per_node
    return "all %d pages exactly once; responses per worker: %s" % (
        PAGES, ", ".join(str(n) for n in per_node.values()))


def check_killed_worker() -> str:
    t = target()
    client = t.redis()
    clear_spider(client, "site")
    OPENER.open(urllib.request.Request(demo_url("__reset"), data=b"", method="POST"),
                timeout=10).close()
    jobs = scrapyd.schedule(t.nodes, "bloomcrawl", "site",
                            [("MAX_IDLE_TIME_BEFORE_CLOSE", "10"),
                             ("CONCURRENT_REQUESTS_PER_DOMAIN", "64"),
                             # no false positive among the pages counted (see the demo's)
                             ("BLOOMFILTER_ERROR_RATE", "1e-06")],
                            [("allowed_domains", "demo")])
    seed(client, "site", ["http://demo:8000/"])
    compose = Compose(paths())
    victim = next(c for c in compose.containers("worker")
                  if c["Config"]["Labels"].get("com.docker.compose.container-number") == "2")
    port = victim["NetworkSettings"]["Ports"]["6800/tcp"][0]["HostPort"]
    victim_url = "http://127.0.0.1:%s" % port
    victim_node = next(n for n in t.nodes if n.url == victim_url)
    # a lease token begins with its worker's node name: the container's host name
    mark = (victim["Config"]["Hostname"][:24] + "-").encode()

    def victim_leases() -> int:
        return sum(1 for key in client.scan_iter(match="site:*:leases")
                   for token in client.hkeys(key) if token.startswith(mark))

    # kill it when it is surely crawling: its job running, a good part of the site done,
    # and leases held
    deadline = time.monotonic() + 120
    pages = 0
    while True:
        assert time.monotonic() < deadline, "the crawl did not get going (%d pages)" % pages
        pages = int(client.hget("site:stats", "pages") or 0)
        if pages >= PAGES * 2 // 5:
            running = victim_node.request("listjobs.json?project=bloomcrawl")["running"]
            if any(j["id"] == jobs[victim_url] for j in running) and victim_leases():
                break
        time.sleep(0.1)
    subprocess.run(["docker", "kill", victim["Id"]], check=True, capture_output=True,
                   timeout=60)
    # what it held when it died stays in Redis until its leases expire
    held = victim_leases()
    log("killed %s (%s) at %d pages, holding %d leases"
        % (victim["Name"].lstrip("/"), victim_url, pages, held))
    survivors = {url: job for url, job in jobs.items() if url != victim_url}
    assert len(survivors) == WORKERS - 1, (jobs, victim_url)
    alive = [n for n in t.nodes if n.url in survivors]
    deadline = time.monotonic() + 300
    while True:
        states = scrapyd.job_states(alive, "bloomcrawl", survivors)
        if all(s == "finished" for s in states.values()):
            break
        assert time.monotonic() < deadline, "jobs not finished after 300s: %s" % states
        time.sleep(2)
    stats = demo_stats()
    requeued = int(client.hget("site:stats", "requeued") or 0)
    assert stats["missing"] == 0, "%d pages never crawled after the kill" % stats["missing"]
    # (a worker whose last ack went out while the kill was on its way held none: nothing
    # to requeue, and every page crawled is all there is to check)
    assert requeued > 0 or not held, "the killed worker's %d leases were never requeued" % held
    return "every page crawled; %d fetched again (in flight on the killed worker), %d leases" \
           " requeued" % (stats["duplicates"], requeued)


def check_scale() -> str:
    make("scale", "WORKERS=%d" % (WORKERS + 1), timeout=300)
    out = make("deploy", timeout=180)
    expected = "to %d of %d node(s)" % (WORKERS + 1, WORKERS + 1)
    assert expected in out, "deploy after scaling: %r" % out[-300:]
    return "make deploy reached all %d workers after make scale" % (WORKERS + 1)


def check_timer() -> str:
    """A recurring crawl fired by the timer container, on every worker (scaled ones too)."""
    t = target()
    client = t.redis()
    made = bloomcrawl("schedule", "--name", "e2e", "--every", "1h", "--max-idle", "2",
                      "-a", "allowed_domains=demo", "http://demo:8000/")
    assert made.returncode == 0, "schedule: %s" % (made.stdout + made.stderr)[-500:]
    store, runs = ScheduleStore(client), RunStore(client)
    try:
        deadline = time.monotonic() + 120
        while True:
            outcome = store.get("e2e").outcome
            if outcome is not None:
                break
            assert time.monotonic() < deadline, "the timer did not fire the schedule in 120 s"
            time.sleep(0.5)
        assert outcome["result"] == "started", outcome
        # the timer reaches the workers by their compose-network addresses: count them
        assert len(outcome["started"]) == len(t.nodes), (outcome, [n.url for n in t.nodes])
        deadline = time.monotonic() + 180
        while True:
            run = runs.get(outcome["run"])
            assert run is not None, outcome
            if run.status == "finished":
                break
            assert time.monotonic() < deadline, "the run did not end in 180 s: %s" % run
            time.sleep(1)
        assert run.finish_reason == "finished", run
        assert run.counters["pages"] >= 1, run.counters
        return "the timer container fired it on all %d workers; run %s ended %s, %d pages" % (
            len(outcome["started"]), run.id, run.finish_reason, run.counters["pages"])
    finally:
        store.remove("e2e")


def prometheus_query(query: str) -> list[dict[str, Any]]:
    url = "http://127.0.0.1:%s/api/v1/query?%s" % (
        env_values()["PROMETHEUS_PORT"], urllib.parse.urlencode({"query": query}))
    with OPENER.open(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def check_prometheus() -> str:
    queries = {
        "up": 'up{job="bloomcrawl"}',
        "pages": 'bloomcrawl_pages_total{spider="site"}',
        "nodes": "bloomcrawl_scrapyd_nodes",
        "filter": 'bloomcrawl_filter_items{spider="site"}',
    }
    deadline = time.monotonic() + 120
    while True:
        values = {}
        for name, query in queries.items():
            result = prometheus_query(query)
            if result:
                values[name] = float(result[0]["value"][1])
        if (len(values) == len(queries) and values["up"] == 1
                and values["pages"] >= PAGES and values["filter"] >= PAGES):
            break
        assert time.monotonic() < deadline, "after 120s Prometheus has %s" % values
        time.sleep(3)
    return "exporter up; pages_total %d, filter items %d, scrapyd nodes %d" % (
        values["pages"], values["filter"], values["nodes"])


def cluster_view() -> list[tuple[str, str, str, str]]:
    """CLUSTER NODES as node 1 sees it: (announced host:port, role, id, master id) each."""
    redis_1 = Compose(paths()).containers("redis")
    assert redis_1, "no redis container"
    out = subprocess.run(["docker", "exec", redis_1[0]["Id"], "redis-cli", "--no-auth-warning",
                          "cluster", "nodes"], text=True, capture_output=True, check=True,
                         timeout=60).stdout
    view = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        address, _, hostname = fields[1].partition(",")
        port = address.split("@")[0].rpartition(":")[2]
        flags = set(fields[2].split(","))
        assert not flags & {"fail", "fail?", "handshake", "noaddr"}, line
        assert fields[7] == "connected", line
        role = "master" if "master" in flags else "replica"
        view.append(("%s:%s" % (hostname, port), role, fields[0], fields[3]))
    return view


def masters_with_replicas() -> list[str]:
    """The masters' announced addresses; asserts 6 nodes, 3 masters with 1 replica each."""
    view = cluster_view()
    assert sorted(v[0] for v in view) == sorted("%s:6379" % n for n in CLUSTER_NODES), (
        "nodes announce %s" % [v[0] for v in view])
    masters = {v[2]: v[0] for v in view if v[1] == "master"}
    replicas = [v[3] for v in view if v[1] == "replica"]
    assert len(masters) == 3, "masters: %s" % sorted(masters.values())
    assert sorted(replicas) == sorted(masters), "replicas of %s" % replicas
    return sorted(masters.values())


def check_cluster_up() -> str:
    detail = check_up("REDIS=cluster")
    masters = masters_with_replicas()
    compose = Compose(paths())
    for service in ("worker", "exporter", "timer"):
        for c in compose.containers(service):
            env = dict(e.partition("=")[::2] for e in c["Config"]["Env"])
            assert env.get("REDIS_URL", "").startswith("redis+cluster://"), (
                "%s has REDIS_URL %s" % (c["Name"], env.get("REDIS_URL", "").split("@")[-1]))
    init = compose.containers("redis-cluster-init")
    assert init and init[0]["State"]["Status"] == "exited" and init[0]["State"]["ExitCode"] == 0
    return "%s; masters %s, one replica each; workers, exporter, timer on redis+cluster://" % (
        detail, ", ".join(masters))


def check_cluster_status() -> str:
    out = make("status", timeout=120)
    rows = [line.split() for line in out.splitlines() if line.startswith("site ")]
    assert rows, "make status shows no site spider:\n%s" % out[-1500:]
    assert str(PAGES) in rows[0], "make status: %s" % " ".join(rows[0])
    client: Any = target().redis()  # a RedisCluster
    pages = int(client.hget("site:stats", "pages") or 0)
    assert pages == PAGES, "site:stats pages %d read from the host" % pages
    keys_per_master = {node.name: client.dbsize(target_nodes=node)
                       for node in client.get_primaries()}
    return "make status and the host's client read the cluster: keys per master %s" % (
        sorted(keys_per_master.values()))


def exporter_metrics() -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    url = "http://127.0.0.1:%s/metrics" % env_values()["EXPORTER_PORT"]
    with OPENER.open(url, timeout=30) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def check_cluster_metrics() -> str:
    masters = masters_with_replicas()
    samples = exporter_metrics()

    def value(name: str, **labels: str) -> float:
        found = [v for lbl, v in samples.get(name, []) if labels.items() <= lbl.items()]
        assert found, "/metrics has no %s%s" % (name, labels or "")
        return found[0]

    assert value("bloomcrawl_up") == 1
    assert value("bloomcrawl_pages_total", spider="site") == PAGES
    assert value("bloomcrawl_filter_items", spider="site") == PAGES
    per_master = sorted(n for n in samples if n.startswith(PER_MASTER_PREFIXES))
    for name in per_master:
        series = [lbl for lbl, _ in samples[name] if lbl.get("spider", "site") == "site"]
        nodes = sorted(lbl.get("node", "") for lbl in series)
        assert nodes == masters, "%s: series for %s, the masters are %s" % (name, nodes, masters)
    if not per_master:
        return "spider metrics present; the exporter has no per-master metrics"
    return "spider metrics present; %d per-master families, one series per master each (%s)" % (
        len(per_master), ", ".join(masters))


def check_cluster_reup() -> str:
    make("down", "KEEP_DATA=1", timeout=180)
    make("up", "WORKERS=%d" % WORKERS, "REDIS=cluster", timeout=600)
    masters = masters_with_replicas()
    init = Compose(paths()).containers("redis-cluster-init")
    logs = subprocess.run(["docker", "logs", init[0]["Id"]], text=True, capture_output=True,
                          timeout=60)
    assert "the cluster exists" in logs.stdout, "init did not find the cluster:\n" + logs.stdout
    pages = int(target().redis().hget("site:stats", "pages") or 0)
    assert pages == PAGES, "site:stats pages %d after the re-up" % pages
    return "the cluster came back with its data (%d pages in site:stats); masters %s" % (
        pages, ", ".join(masters))


def check_down() -> str:
    make("down", timeout=180)
    left = project_resources()
    assert not left, "left behind: %s" % left
    return "no container, network or volume of %s left" % PROJECT


def run_single() -> None:
    use("bloomcrawl-e2e", ROOT / ".run" / "e2e")
    log("single Redis: compose project %s, state in %s" % (PROJECT, WORK))
    compose_down_leftovers()
    write_env_file()
    up = False
    try:
        up = check("make up WORKERS=3: every container healthy", check_up)
        deployed = up and check("make deploy reaches every worker, fails on any failure",
                                check_deploy)
        if deployed:
            check("2,000-page crawl: every page exactly once, every worker worked",
                  check_demo_crawl)
            check("a worker killed mid-crawl: every page still crawled", check_killed_worker)
            check("make scale WORKERS=4, then make deploy reaches the new worker", check_scale)
            check("a recurring crawl: the timer container fires it on every worker",
                  check_timer)
        else:
            for name in ("2,000-page crawl", "a worker killed mid-crawl", "make scale",
                         "a recurring crawl"):
                skip(name, "no deployed cluster (make %s failed)" % ("deploy" if up else "up"))
        if up:
            check("Prometheus has the exporter's metrics", check_prometheus)
        else:
            skip("Prometheus has the exporter's metrics", "no cluster (make up failed)")
    finally:
        check("make down leaves no container, network or volume", check_down)


def run_cluster() -> None:
    use("bloomcrawl-e2e-cluster", ROOT / ".run" / "e2e-cluster")
    log("Redis Cluster: compose project %s, state in %s" % (PROJECT, WORK))
    compose_down_leftovers()
    write_env_file()
    try:
        steps: list[tuple[str, Callable[[], str | None]]] = [
            ("make up WORKERS=3 REDIS=cluster: healthy, 3 masters with a replica each",
             check_cluster_up),
            ("Redis Cluster: make deploy reaches every worker", check_deploy),
            ("Redis Cluster: 2,000-page crawl: every page exactly once, every worker worked",
             check_demo_crawl),
            ("Redis Cluster: make status on the host reads the cluster", check_cluster_status),
            ("Redis Cluster: /metrics has the spider's and per-master metrics",
             check_cluster_metrics),
            ("Redis Cluster: make down KEEP_DATA=1, make up: back with its data",
             check_cluster_reup),
        ]
        failed_step = ""
        for i, (name, func) in enumerate(steps):
            if failed_step:
                skip(name, "failed before: " + failed_step)
            elif not check(name, func) and i < 3:  # up, deploy, crawl: the rest needs them
                failed_step = name
    finally:
        check("Redis Cluster: make down leaves no container, network or volume", check_down)


def main() -> int:
    cases = [c.strip() for c in os.environ.get("E2E_CASES", ",".join(CASES)).split(",")
             if c.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        sys.stderr.write("E2E_CASES: unknown %s (cases: %s)\n" % (unknown, ", ".join(CASES)))
        return 2
    log("e2e: %s" % ", ".join(cases))
    from remote_e2e import run_remote
    from swarm_e2e import run_swarm

    def swarm() -> None:
        run_swarm(sys.modules[__name__])

    def remote() -> None:
        run_remote(sys.modules[__name__])

    for case, run in (("single", run_single), ("cluster", run_cluster), ("swarm", swarm),
                      ("remote", remote)):
        if case not in cases:
            continue
        try:
            run()
        except Exception as exc:  # outside any check (leftovers, .env): the case stops here
            detail = "%s: %s" % (type(exc).__name__, exc)
            results.append(("%s case: before its checks" % case, False, detail))
            log("FAIL %s case: %s\n%s" % (case, detail, traceback.format_exc(limit=3)))
    passed = sum(1 for _, ok, _ in results if ok)
    failed = len(results) - passed
    log("took %.0fs" % (time.monotonic() - STARTED))
    # the last lines: a CI log's tail says what failed and why
    sys.stdout.write("%d passed, %d failed\n" % (passed, failed))
    for name, ok, detail in results:
        if not ok:
            sys.stdout.write("FAILED %s: %s\n" % (name, one_line(detail.split("\n")[0])))
    for note in notes:
        sys.stdout.write("NOTE %s\n" % one_line(note))
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
