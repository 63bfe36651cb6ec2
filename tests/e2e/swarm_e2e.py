"""The ``swarm`` case of the end-to-end test (cluster_e2e.py runs it): the stack on a
Docker Swarm of three simulated hosts.

scripts/swarm-hosts.sh makes the hosts: network namespaces with a dockerd each
(own data root, exec root, socket and pid files under .run/hosts), on
198.18.77.0/24 behind a bridge in a namespace of its own, so nothing reaches
the root namespace or beyond. h1 is the manager; ``make`` runs with
DOCKER_HOST on h1's socket, as an operator on the manager would, and finds
the other engines through SWARM_ENGINES in the case's .env.

The checks use the helpers of cluster_e2e (``e2e``) and the simulated hosts of
common.py: one line each, "N passed, M failed" at the end. Everything the case
reads of the stack (the demo site's counts, Redis, Prometheus) it reads from
inside the stack's network or its containers: the stack publishes nothing.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from pathlib import Path
from types import ModuleType
from typing import Any

from common import HTTP, SimulatedHosts, alive, labelled_resources

ROOT = Path(__file__).resolve().parents[2]
HOSTS_DIR = ROOT / ".run" / "hosts"
HOSTS = ("h1", "h2", "h3")
PREFIX = "bcsw"
STACK = "bloomcrawl-e2e-swarm"
#: the worker node that dies mid-crawl (h1 is the manager and holds Redis)
VICTIM = "h3"

e2e: ModuleType
sim_hosts = SimulatedHosts(HOSTS_DIR, PREFIX, lambda: e2e.environment())
#: docker on a host's engine (h1's unless ``host=`` says otherwise)
docker = sim_hosts.docker


def worker_tasks() -> list[dict[str, str]]:
    """The worker service's tasks that should run: name, node, current state."""
    out = docker("service", "ps", "%s_worker" % STACK, "--filter", "desired-state=running",
                 "--format", "{{json .}}").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def running_workers() -> dict[str, str]:
    """{task name: node} of the worker tasks running now."""
    return {t["Name"]: t["Node"] for t in worker_tasks()
            if t["CurrentState"].startswith("Running")}


def worker_addresses() -> dict[str, str]:
    """{task name: its address on the stack's network} of the worker tasks running now."""
    ids = docker("service", "ps", "%s_worker" % STACK, "--filter", "desired-state=running",
                 "-q", "--no-trunc").stdout.split()
    found = {}
    for task in json.loads(docker("inspect", "--type", "task", *ids).stdout) if ids else []:
        if task["Status"]["State"] != "running":
            continue
        for attachment in task.get("NetworksAttachments") or []:
            if attachment["Network"]["Spec"]["Name"] == "%s_default" % STACK:
                found["%s_worker.%d" % (STACK, task["Slot"])] = (
                    attachment["Addresses"][0].split("/")[0])
    return found


def in_stack(code: str, *args: str, timeout: float = 60) -> str:
    """Python ``code`` in a container on the stack's network (on the manager): its stdout."""
    result = docker("run", "--rm", "--network", "%s_default" % STACK, "bloomcrawl/worker:latest",
                    "python", "-c", code, *args, check=False, timeout=timeout)
    assert result.returncode == 0, "in the stack: %s" % result.stderr[-800:]
    return result.stdout


def demo_stats() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(in_stack(HTTP, "http://demo:8000/__stats"))
    return data


def redis_cli(*args: str) -> str:
    """redis-cli in the Redis container (on h1: the labelled node)."""
    ids = docker("ps", "-q", "--filter", "label=com.docker.swarm.service.name=%s_redis"
                 % STACK).stdout.split()
    assert ids, "no Redis container on h1"
    return docker("exec", ids[0], "redis-cli", "--no-auth-warning", *args).stdout.strip()


def stack_resources(host: str) -> list[str]:
    return labelled_resources("com.docker.stack.namespace=%s" % STACK,
                              sim_hosts.docker_command(host), check=False)


# --- the checks -------------------------------------------------------------------


def check_hosts() -> str:
    out = sim_hosts.script("start")
    nodes = docker("node", "ls", "--format", "{{.Hostname}} {{.Status}}").stdout.split("\n")
    ready = sorted(line.split()[0] for line in nodes if line.endswith(" Ready"))
    assert ready == list(HOSTS), "swarm nodes ready: %s" % nodes
    return "%s; nodes %s Ready" % (out.strip().splitlines()[-1], ", ".join(ready))


def log_swarm_state() -> None:
    """What the swarm holds, for a make up that did not get its tasks running: the nodes,
    every task of the stack with its state and error, and each engine's last log lines."""
    e2e.log("the swarm's nodes:\n" + docker("node", "ls", check=False).stdout)
    e2e.log("the stack's tasks:\n" + docker(
        "stack", "ps", STACK, "--no-trunc", "--format",
        "{{.Name}} {{.Node}} {{.DesiredState}} {{.CurrentState}} {{.Error}}",
        check=False).stdout)
    for host in HOSTS:
        log = HOSTS_DIR / host / "dockerd.log"
        if log.exists():
            e2e.log("%s's dockerd, last lines:\n%s" % (
                host, "\n".join(log.read_text(errors="replace").splitlines()[-15:])))


def check_up() -> str:
    """make up; when the stack's tasks never ran (seen once on a fresh machine: every
    service 0 of its replicas, no task error), the swarm's state is logged, the stack
    taken down and make up run once more, with a NOTE in the last lines naming why."""
    started = time.monotonic()
    try:
        e2e.make("up", "WORKERS=3", timeout=900)
    except e2e.MakeFailed as exc:
        log_swarm_state()
        if "not running after" not in exc.output:
            raise
        note = "swarm: make up's tasks did not run (%s); the stack down and up again" % (
            exc.reason[-400:])
        e2e.log("NOTE " + note)
        e2e.notes.append(note)
        e2e.make("down", timeout=300)
        try:
            e2e.make("up", "WORKERS=3", timeout=900)
        except AssertionError:
            log_swarm_state()
            raise
    took = time.monotonic() - started
    workers = running_workers()
    assert sorted(workers.values()) == list(HOSTS), "workers on %s" % workers
    placed = {}
    for service in ("redis", "exporter", "prometheus", "timer"):
        out = docker("service", "ps", "%s_%s" % (STACK, service), "--filter",
                     "desired-state=running", "--format", "{{.Node}} {{.CurrentState}}").stdout
        assert "Running" in out, "%s: %s" % (service, out)
        placed[service] = out.split()[0]
    assert set(placed.values()) == {"h1"}, "placed on %s" % placed
    published = docker("service", "ls", "--filter", "label=com.docker.stack.namespace=%s"
                       % STACK, "--format", "{{.Name}} {{.Ports}}").stdout.split("\n")
    assert all(len(line.split()) <= 1 for line in published), "published: %s" % published
    images = docker("images", "-q", "bloomcrawl/worker:latest", host=VICTIM).stdout.strip()
    assert images, "the worker image is not on %s" % VICTIM
    return "make up took %.0fs; workers on %s; redis, exporter, prometheus, timer on h1;" \
           " nothing published" % (took, ", ".join(sorted(workers.values())))


def check_deploy() -> str:
    out = e2e.make("deploy", timeout=180)
    assert "to 3 of 3 node(s)" in out, out[-500:]
    status = e2e.make("status", timeout=120)
    assert "cluster: swarm" in status and "nodes: 3 of 3 up" in status, status[-1500:]
    for name, node in running_workers().items():
        row = next((line for line in status.splitlines() if line.startswith(name + " ")), "")
        assert row.split()[1:2] == [node], "make status has no row %s on %s:\n%s" % (
            name, node, status[-1500:])
    logs = e2e.make("logs", "SERVICE=worker", timeout=120)
    # docker service logs names each line's task and node: <task>.<id>@<node>
    nodes = {h for h in HOSTS if "@%s " % h in logs or "@%s\t" % h in logs}
    assert nodes == set(HOSTS), "make logs SERVICE=worker shows nodes %s:\n%s" % (
        sorted(nodes), logs[-800:])
    return "deployed to all 3 replicas; make status lists each with its node; make logs" \
           " shows the workers of all 3 nodes"


def check_demo() -> str:
    e2e.make("demo", "WORKERS=3", timeout=600)
    stats = demo_stats()
    assert stats["pages"] == e2e.PAGES and stats["missing"] == 0, stats
    assert stats["duplicates"] == 0, "%d fetched twice" % stats["duplicates"]
    by_node = dict(zip(*[iter(redis_cli("hgetall", "{site:stats}:pages_by_node").split())] * 2,
                       strict=True))
    per_host = {h: sum(int(v) for k, v in by_node.items() if k.startswith(h + "-"))
                for h in HOSTS}
    assert all(per_host.values()), "a node crawled nothing: %s" % by_node
    return "all %d pages exactly once; pages per node %s" % (e2e.PAGES, per_host)


def bloomcrawl_ok(*args: str) -> str:
    result = e2e.bloomcrawl(*args)
    assert result.returncode == 0, "bloomcrawl %s: %s" % (args[0], (result.stdout
                                                                   + result.stderr)[-800:])
    return result.stdout


def check_node_loss() -> str:
    bloomcrawl_ok("clear", "--spider", "site", "--yes")
    in_stack(HTTP, "http://demo:8000/__reset", "")
    before = running_workers()
    bloomcrawl_ok("crawl", "--allowed-domains", "demo", "--max-idle", "10",
                  "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=64", "-s", "BLOOMFILTER_ERROR_RATE=1e-06",
                  "http://demo:8000/")
    deadline = time.monotonic() + 120
    pages = 0
    while pages < e2e.PAGES * 2 // 5:
        assert time.monotonic() < deadline, "the crawl did not get going (%d pages)" % pages
        time.sleep(0.2)
        pages = int(redis_cli("hget", "site:stats", "pages") or 0)
    sim_hosts.script("kill", VICTIM)
    killed_at = time.monotonic()
    e2e.log("%s died at %d pages" % (VICTIM, pages))
    deadline = time.monotonic() + 300
    while True:
        # the dead worker's leases come back when they expire (SCHEDULER_LEASE_TIMEOUT)
        stats = demo_stats()
        requeued = int(redis_cli("hget", "site:stats", "requeued") or 0)
        if stats["missing"] == 0 and requeued > 0:
            break
        assert time.monotonic() < deadline, "after 300s: %d pages missing, %d requeued" % (
            stats["missing"], requeued)
        time.sleep(3)
    crawled_in = time.monotonic() - killed_at
    deadline = time.monotonic() + 180
    while True:
        after = running_workers()
        if len(after) == 3 and VICTIM not in after.values():
            break
        assert time.monotonic() < deadline, "tasks after 180s: %s" % worker_tasks()
        time.sleep(2)
    moved = sorted(name for name, node in after.items() if before.get(name) != node)
    assert moved, "no task moved: %s -> %s" % (before, after)
    out = e2e.make("deploy", timeout=180)
    assert "to 3 of 3 node(s)" in out, out[-500:]
    addresses = worker_addresses()
    for name in moved:
        assert "ok   http://%s:6800:" % addresses[name] in out, (
            "make deploy did not reach %s at %s:\n%s" % (name, addresses[name], out[-800:]))
    return ("every page crawled %.0fs after the loss; %d fetched twice (in flight on %s), %d"
            " leases requeued; %s moved to %s; make deploy reached all 3" % (
                crawled_in, stats["duplicates"], VICTIM, requeued, ", ".join(moved),
                ", ".join(after[m] for m in moved)))


def check_scale() -> str:
    sim_hosts.script("revive", VICTIM)
    deadline = time.monotonic() + 120
    while True:
        status = docker("node", "ls", "--format", "{{.Hostname}} {{.Status}}").stdout
        if "%s Ready" % VICTIM in status:
            break
        assert time.monotonic() < deadline, "%s not Ready again: %s" % (VICTIM, status)
        time.sleep(2)
    e2e.make("scale", "WORKERS=4", timeout=300)
    workers = running_workers()
    assert len(workers) == 4, workers
    out = e2e.make("deploy", timeout=180)
    assert "to 4 of 4 node(s)" in out, out[-500:]
    return "%s back; 4 workers on %s; make deploy reached all 4" % (
        VICTIM, ", ".join(sorted(workers.values())))


def check_prometheus() -> str:
    url = "http://prometheus:9090/api/v1/query?" + urllib.parse.urlencode(
        {"query": 'bloomcrawl_pages_total{spider="site"}'})
    deadline = time.monotonic() + 120
    while True:
        answer = json.loads(in_stack(HTTP, url))
        result = answer["data"]["result"]
        if result and float(result[0]["value"][1]) >= e2e.PAGES:
            return "bloomcrawl_pages_total %s" % result[0]["value"][1]
        assert time.monotonic() < deadline, "after 120s Prometheus has %s" % result
        time.sleep(3)


def check_down() -> str:
    # A node back from a loss can keep a container of the stack that swarm no longer
    # manages: plant one on the victim, as that node would, and make down must remove it.
    stray = docker("create", "--label", "com.docker.stack.namespace=%s" % STACK,
                   "bloomcrawl/worker:latest", "true", host=VICTIM).stdout.strip()
    assert stray, "could not create the stray container on %s" % VICTIM
    started = time.monotonic()
    e2e.make("down", timeout=300)
    took = time.monotonic() - started
    left = {h: stack_resources(h) for h in HOSTS}
    assert not any(left.values()), "left behind: %s" % left
    return "no container, network or volume of %s on %s; a stray container of the stack on" \
           " %s removed too; make down took %.0fs" % (STACK, ", ".join(HOSTS), VICTIM, took)


def check_hosts_gone() -> str:
    pids = sim_hosts.engine_pids()
    sim_hosts.script("stop")
    left = [p for p in pids if p and alive(int(p))]
    ours = sim_hosts.namespaces()
    assert not left and not ours and not HOSTS_DIR.exists(), (
        "left: pids %s, namespaces %s, %s exists: %s" % (left, ours, HOSTS_DIR,
                                                         HOSTS_DIR.exists()))
    return "engines %s stopped; namespaces and %s removed" % (" ".join(pids), HOSTS_DIR)


def run_swarm(module: ModuleType) -> None:
    global e2e
    e2e = module
    e2e.use(STACK, ROOT / ".run" / "e2e-swarm")
    e2e.log("Docker Swarm: stack %s on %s, state in %s" % (STACK, ", ".join(HOSTS), e2e.WORK))
    e2e.EXTRA_ENV.clear()
    e2e.EXTRA_ENV["DOCKER_HOST"] = sim_hosts.socket("h1")
    e2e.WORK.mkdir(parents=True, exist_ok=True)
    e2e.ENV_FILE.write_text(
        "# the e2e test's stack (tests/e2e/swarm_e2e.py)\nCOMPOSE_PROJECT_NAME=%s\n"
        "DEMO_PAGES=%d\nSWARM_ENGINES=%s\n" % (STACK, e2e.PAGES, ",".join(
            sim_hosts.socket(h) for h in HOSTS[1:])))
    (e2e.STATE_DIR / "cluster.json").unlink(missing_ok=True)
    try:
        steps = [
            ("swarm: three hosts, each its own dockerd, one swarm", check_hosts),
            ("swarm: make up WORKERS=3: a worker on every node, nothing published", check_up),
            ("swarm: make deploy reaches every replica; make status lists their nodes",
             check_deploy),
            ("swarm: 2,000-page crawl: every page exactly once, on all three nodes", check_demo),
            ("swarm: a node dies mid-crawl: its task moves, every page crawled, deploy"
             " reaches it", check_node_loss),
            ("swarm: the node back, make scale WORKERS=4, make deploy reaches 4", check_scale),
            ("swarm: Prometheus on the manager has the exporter's metrics", check_prometheus),
        ]
        failed = ""
        for i, (name, func) in enumerate(steps):
            if failed:
                e2e.skip(name, "failed before: " + failed)
            elif not e2e.check(name, func) and i < 4:  # hosts, up, deploy, crawl
                failed = name
        if not failed or failed != steps[0][0]:
            e2e.check("swarm: make down leaves nothing on any node", check_down)
    finally:
        e2e.check("swarm: the engines, namespaces and their files are gone", check_hosts_gone)
        e2e.EXTRA_ENV.clear()
