"""``up``, ``down``, ``scale``, ``logs``, ``nodes``: the cluster's lifecycle.

``up`` starts the cluster with docker-compose when a Docker engine answers,
as a Docker Swarm stack when that engine is a swarm manager
(:class:`~bloomcrawl.ops.cluster.swarm.Swarm`), and otherwise as local
processes on 127.0.0.1 (:class:`~bloomcrawl.ops.cluster.local.LocalCluster`);
either way it records the cluster in the state directory, where the other
commands find it. With ``--redis cluster`` (compose only) the cluster runs on
a six-node Redis Cluster (``docker-compose.cluster.yml``).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import shutil
import time
from pathlib import Path

from bloomcrawl.core.connection import insecure_allowed
from bloomcrawl.ops import acl, remote_nodes, scrapyd
from bloomcrawl.ops.cli.status import report_nodes
from bloomcrawl.ops.cli.target import TargetOptions, no_cluster, resolve_target
from bloomcrawl.ops.cluster.compose import (
    COMPOSE_SERVICE,
    REDIS_CLUSTER_SERVICES,
    REDIS_TLS_DIR,
    REDIS_USERS_FILE,
    Compose,
    docker_reachable,
)
from bloomcrawl.ops.cluster.envfile import (
    ensure_env_file,
    ensure_role_passwords,
    read_env_file,
)
from bloomcrawl.ops.cluster.local import LocalCluster, remote_workers_hint
from bloomcrawl.ops.cluster.processes import (
    CA_FILE,
    CLIENT_CERT,
    SERVER_CERT,
    ProcessRecord,
    missing_certs,
    run,
)
from bloomcrawl.ops.cluster.state import (
    REDIS_CLUSTER,
    REDIS_SINGLE,
    Cluster,
    Paths,
    cluster_redis_url,
    load_cluster,
    save_cluster,
)
from bloomcrawl.ops.cluster.swarm import WORKER_SERVICE, Swarm, swarm_manager
from bloomcrawl.ops.console import OpsError, say

DEFAULT_WORKERS = 3
#: profiles ``down`` and ``logs`` include, so that they reach every service
ALL_PROFILES = ("demo", "grafana")


def up(paths: Paths, workers: int, *, mode: str | None = None, demo: bool = False,
       build: bool = False, redis: str | None = None, redis_bind: str = "") -> int:
    """Start the cluster: ``mode`` ``docker`` (compose), ``swarm``, ``local``, or ``None``:
    swarm when the engine is a swarm manager, docker when an engine answers, else local.

    ``redis``: ``single`` (one redis-server), ``cluster`` (a six-node Redis
    Cluster; compose only), or ``None``: ``single``. A cluster already up keeps
    its mode and its Redis, and gets ``workers`` workers.

    ``redis_bind``: Redis is also published on that address, for worker hosts
    (``make worker-host``): with TLS (``make certs``; plain text only with
    ``--insecure``) and an ACL user per role, their passwords in ``.env``.
    """
    if workers < 1:
        raise OpsError("--workers must be at least 1")
    existing = load_cluster(paths)
    if existing is not None and existing.mode == "worker-host":
        raise OpsError("this host runs worker nodes for another cluster (make worker-host):"
                       " `make down` first")
    if existing is not None and redis_bind and redis_bind != existing.redis_bind:
        raise OpsError(f"the cluster up here publishes Redis on"
                       f" {existing.redis_bind or '127.0.0.1 alone'}: `make down` first")
    if redis_bind and (redis or (existing.redis if existing else "")) == REDIS_CLUSTER:
        raise OpsError("REDIS_BIND publishes one Redis: a Redis Cluster's nodes each need"
                       " their own address (see docs/scale.md), not done by `make up`")
    tls = bool(redis_bind) and not insecure_allowed()
    if redis_bind:
        check_redis_bind(paths, redis_bind, tls)
    if existing is not None:
        if mode and mode != existing.mode:
            raise OpsError(f"a {existing.mode} cluster is already up; `make down` first")
        if redis and redis != existing.redis:
            raise OpsError(f"a cluster on {describe_redis_kind(existing.redis)} is already up;"
                           " `make down` first")
        mode = existing.mode
        redis = existing.redis
    redis = redis or REDIS_SINGLE
    if redis == REDIS_CLUSTER and mode == "local":
        raise OpsError("a Redis Cluster runs in containers only (docker-compose): start"
                       " a Docker engine, or run without REDIS=cluster")
    if redis == REDIS_CLUSTER and mode == "swarm":
        raise OpsError("the Swarm stack runs one Redis: run without REDIS=cluster, or"
                       " with SWARM=0 for the compose Redis Cluster")
    if mode is None:
        if docker_reachable():
            mode = "swarm" if redis != REDIS_CLUSTER and swarm_manager() else "docker"
        elif redis == REDIS_CLUSTER:
            raise OpsError("no Docker engine is reachable, and a Redis Cluster runs in"
                           " containers only (is dockerd running?)")
        else:
            say("no Docker engine is reachable: running the cluster as local processes"
                " on 127.0.0.1 (`make down` stops them)")
            mode = "local"
    elif mode in ("docker", "swarm") and not docker_reachable():
        raise OpsError("no Docker engine is reachable (is dockerd running?)")
    elif mode == "swarm" and not swarm_manager():
        raise OpsError("SWARM=1, but this Docker engine is not a swarm manager"
                       " (`docker swarm init`, or run this on a manager)")
    env = ensure_env_file(paths.env_file)
    if mode == "swarm":
        if redis_bind:
            raise OpsError("REDIS_BIND publishes the compose or local Redis for worker hosts;"
                           " on a Swarm stack, workers join as swarm nodes (docs/deploy.md)")
        return swarm_up(paths, workers, demo, build)
    if redis_bind:
        env = ensure_role_passwords(paths.env_file,
                                    [acl.password_variable(role) for role in acl.ROLES])
    if mode == "docker":
        return docker_up(paths, workers, demo, build, redis, redis_bind)
    return LocalCluster(paths, env).up(workers, demo=demo, redis_bind=redis_bind, tls=tls)


def check_redis_bind(paths: Paths, address: str, tls: bool) -> None:
    """:class:`OpsError` unless ``address`` is an IP address and, for TLS, ``make certs``
    made the certificates."""
    try:
        ipaddress.ip_address(address)
    except ValueError as exc:
        raise OpsError(f"REDIS_BIND {address!r}: not an IP address of this host") from exc
    if not tls:
        say(f"REDIS_BIND {address}: Redis in PLAIN TEXT there (--insecure)")
        return
    missing = missing_certs(paths.certs_dir, SERVER_CERT, CLIENT_CERT)
    if missing:
        raise OpsError(f"REDIS_BIND {address}: Redis serves TLS there with the certificates of"
                       f" `make certs HOSTS='{address}'`, missing: {', '.join(missing)}"
                       " (or --insecure for plain text)")


def describe_redis_kind(kind: str) -> str:
    return "a Redis Cluster (REDIS=cluster)" if kind == REDIS_CLUSTER else "a single Redis"


def docker_up(paths: Paths, workers: int, demo: bool, build: bool,
              redis: str = REDIS_SINGLE, redis_bind: str = "") -> int:
    started = time.monotonic()
    if redis_bind:
        if insecure_allowed():
            raise OpsError("REDIS_BIND in containers serves TLS only: drop --insecure")
        write_redis_tls_dir(paths)
        os.environ["REDIS_BIND"] = redis_bind
    if build or not Compose(paths, redis).containers(COMPOSE_SERVICE):
        run([str(paths.root / "scripts" / "build-images.sh"), str(paths.env_file)],
            cwd=paths.root)
    save_cluster(paths, Cluster("docker", "", "", "", project_name=Compose(paths).project,
                                redis=redis, redis_bind=redis_bind, tls=bool(redis_bind)))
    compose = Compose(paths, redis)
    profiles = (["grafana"] if compose.grafana else []) + (["demo"] if demo else [])
    compose.up_workers(workers, profiles)
    compose.wait_healthy()
    urls = compose.worker_urls()
    say("cluster up in %.0fs: %d worker(s): %s" % (time.monotonic() - started, len(urls),
                                                  " ".join(urls)))
    env = read_env_file(paths.env_file)
    redis_at = "127.0.0.1:%s" % env.get("REDIS_PORT", "6379")
    if compose.redis_cluster:
        ports = compose.redis_node_ports()
        redis_at = "%s (Redis Cluster, %d nodes; inside the network %s)" % (
            cluster_redis_url([ports[s] for s in REDIS_CLUSTER_SERVICES if s in ports]),
            len(ports), ",".join("%s:6379" % s for s in REDIS_CLUSTER_SERVICES))
    say("redis: {}   prometheus: http://127.0.0.1:{}   exporter: http://127.0.0.1:{}"
        "/metrics".format(redis_at, env.get("PROMETHEUS_PORT", "9090"),
                          env.get("EXPORTER_PORT", "9410")))
    if redis_bind:
        say(remote_workers_hint(redis_bind, int(env.get("REDIS_TLS_PORT") or 6380), True,
                                paths))
    if compose.grafana:
        say("grafana: http://127.0.0.1:%s (admin / GRAFANA_ADMIN_PASSWORD in %s)"
            % (env.get("GRAFANA_PORT", "3000"), paths.env_file))
    else:
        say("grafana: not started (its image needs a container registry; see README.md)")
    return 0


def write_redis_tls_dir(paths: Paths) -> None:
    """What docker-compose.remote.yml mounts into the redis container: the CA, the server's
    certificate and key, and the role users (password digests, never the passwords).

    The container's redis user is not the host's owner of ``make certs``' files: the copies
    are readable by all, in the state directory that only its owner may enter (0700).
    """
    env = read_env_file(paths.env_file)
    paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths.state_dir.chmod(0o700)
    target = paths.state_dir / REDIS_TLS_DIR
    target.mkdir(mode=0o755, exist_ok=True)
    for name in (CA_FILE, SERVER_CERT + ".crt", SERVER_CERT + ".key"):
        shutil.copyfile(paths.certs_dir / name, target / name)
        (target / name).chmod(0o644)
    users = target / REDIS_USERS_FILE
    users.write_text("".join(line + "\n" for line in acl.config_lines(env)))
    users.chmod(0o644)


def swarm_up(paths: Paths, workers: int, demo: bool, build: bool) -> int:
    """The stack on this swarm manager: images built here and loaded on every node,
    Redis's node labelled, ``docker stack deploy``, until every replica runs."""
    started = time.monotonic()
    swarm = Swarm(paths)
    have_image = run(["docker", "image", "inspect", swarm.worker_image()], capture=True,
                     check=False, timeout=60).returncode == 0
    if build or not have_image:
        run([str(paths.root / "scripts" / "build-images.sh"), str(paths.env_file)],
            cwd=paths.root)
        swarm = Swarm(paths)  # the images build-images.sh chose
    nodes = swarm.nodes()
    redis_node = swarm.label_redis_node(nodes)
    swarm.distribute_images(nodes)
    save_cluster(paths, Cluster("swarm", "", "", "", project_name=swarm.stack))
    swarm.deploy(workers, demo or swarm.demo_deployed())
    swarm.wait_ready()
    tasks = swarm.tasks(WORKER_SERVICE)
    say("stack %s up in %.0fs on %d node(s): %d worker(s): %s" % (
        swarm.stack, time.monotonic() - started, len(nodes), len(tasks),
        " ".join(f"{t.name}@{t.node}" for t in tasks)))
    say(f"redis on {redis_node}; nothing is published: the bloomcrawl commands reach the"
        f" stack from a container on its network {swarm.network}")
    return 0


def down(paths: Paths, *, keep_data: bool) -> int:
    cluster = load_cluster(paths)
    if cluster is not None and cluster.mode == "swarm":
        Swarm(paths).down(keep_data=keep_data)
        paths.cluster_file.unlink(missing_ok=True)
        say("stack down%s" % (" (volumes kept)" if keep_data else ""))
    elif cluster is not None and cluster.mode in ("local", "worker-host"):
        LocalCluster(paths, read_env_file(paths.env_file)).down(keep_data=keep_data)
    elif cluster is not None or (paths.env_file.is_file() and docker_reachable()):
        if not docker_reachable():
            raise OpsError("no Docker engine is reachable to stop the cluster with")
        cmd = ["down", "--remove-orphans", "--timeout", "10"]
        if not keep_data:
            cmd.append("--volumes")
        compose = Compose(paths)
        if not compose.redis_cluster and compose.has_redis_cluster():
            # a Redis Cluster's nodes or volumes, whatever was recorded (or not)
            compose = Compose(paths, REDIS_CLUSTER)
        compose.run(*cmd, profiles=ALL_PROFILES)
        paths.cluster_file.unlink(missing_ok=True)
        say("cluster down%s" % (" (volumes kept)" if keep_data else ""))
    else:
        # like docker-compose down: stopping what is not running is done, not an error
        say(str(no_cluster(paths, hint="nothing to stop")))
    return 0


def scale(paths: Paths, workers: int) -> int:
    cluster = load_cluster(paths)
    if cluster is None:
        raise no_cluster(paths, hint="start one with `make up WORKERS=%d`" % workers)
    if cluster.mode == "local":
        return LocalCluster(paths, read_env_file(paths.env_file)).scale(workers)
    if cluster.mode == "swarm":
        swarm = Swarm(paths)
        running = len(swarm.tasks(WORKER_SERVICE))
        swarm.scale(workers)
        tasks = swarm.tasks(WORKER_SERVICE)
        say("%d worker(s): %s" % (len(tasks), " ".join(f"{t.name}@{t.node}" for t in tasks)))
        if len(tasks) > running:
            say("new workers have no project yet: `make deploy` reaches every worker")
        return 0
    compose = Compose(paths)
    profiles = ["grafana"] if compose.grafana else []
    before = set(compose.worker_urls())
    compose.up_workers(workers, profiles, only_workers=True)
    compose.wait_healthy(services=[COMPOSE_SERVICE])
    urls = compose.worker_urls()
    say("%d worker(s): %s" % (len(urls), " ".join(urls)))
    if set(urls) - before:
        say("new workers have no project yet: `make deploy` reaches every worker")
    return 0


def local_services(records: list[ProcessRecord], service: str | None) -> list[ProcessRecord]:
    """The processes of a local cluster that ``service`` names: all of them (None), the
    scrapyd nodes (``worker``, as compose calls them, or ``scrapyd``), or the one of that
    name; :class:`OpsError` naming the services there are for any other name."""
    nodes = [r for r in records if r.name.startswith("scrapyd")]
    if service is None:
        return records
    if service in (COMPOSE_SERVICE, "scrapyd"):
        return nodes
    named = [r for r in records if r.name == service]
    if not named:
        workers = f"{COMPOSE_SERVICE} (the scrapyd nodes: {', '.join(r.name for r in nodes)})"
        others = sorted(r.name for r in records if r not in nodes)
        raise OpsError(f"no service {service!r} in the local cluster; its services:"
                       f" {', '.join([workers, *others])}")
    return named


def logs(paths: Paths, service: str | None, *, tail: int, follow: bool) -> int:
    """The last ``tail`` lines of each service's log (of ``service`` alone when given)."""
    cluster = load_cluster(paths)
    if cluster is None and not (paths.env_file.is_file() and docker_reachable()):
        raise no_cluster(paths, hint="no logs to show; start one with `make up` or `make demo`")
    if cluster is not None and cluster.mode == "local":
        for record in local_services(cluster.processes, service):
            say(f"==> {record.log} <==")
            with contextlib.suppress(OSError):
                lines = Path(record.log).read_text(errors="replace").splitlines()
                say("\n".join(lines[-tail:]))
        return 0
    if cluster is not None and cluster.mode == "swarm":
        Swarm(paths).logs(service, tail=tail, follow=follow)
        return 0
    cmd = ["logs", "--tail", str(tail)]
    if follow:
        cmd.append("--follow")
    if service:
        cmd.append(service)
    Compose(paths).run(*cmd, profiles=ALL_PROFILES)
    return 0


# --- the commands -----------------------------------------------------------------


def cmd_up(args: argparse.Namespace, paths: Paths) -> int:
    mode = "local" if args.local else "docker" if args.docker else "swarm" if args.swarm else None
    return up(paths, args.workers, mode=mode, demo=args.demo, build=args.build,
              redis=args.redis, redis_bind=args.redis_bind)


def cmd_down(args: argparse.Namespace, paths: Paths) -> int:
    return down(paths, keep_data=args.keep_data)


def cmd_scale(args: argparse.Namespace, paths: Paths) -> int:
    return scale(paths, args.workers)


def cmd_logs(args: argparse.Namespace, paths: Paths) -> int:
    return logs(paths, args.service, tail=args.tail, follow=args.follow)


def cmd_nodes(args: argparse.Namespace, paths: Paths) -> int:
    """Every node's URL on stdout; a line on stderr, and exit 1, for each that does not answer.

    ``nodes add URL`` / ``nodes remove URL``: a node of another host, listed in the
    cluster's Redis (:mod:`~bloomcrawl.ops.remote_nodes`), which the cluster's own
    commands, timer and exporter then reach too; ``add`` checks that it answers.
    """
    if args.action:
        return change_remote_nodes(paths, args)
    nodes = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True).nodes
    for node in nodes:
        say(node.url)
    return 1 if report_nodes(scrapyd.node_statuses(nodes), "nodes") else 0


def change_remote_nodes(paths: Paths, args: argparse.Namespace) -> int:
    if not args.url:
        raise OpsError(f"nodes {args.action}: give the node's URL (https://host:port)")
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False,
                            need_redis=True)
    client = target.redis()
    try:
        if args.action == "remove":
            if not remote_nodes.remove(client, args.url):
                raise OpsError(f"{scrapyd.normalise_node_url(args.url)} is not a listed"
                               " remote node")
            say(f"removed {scrapyd.normalise_node_url(args.url)}")
            return 0
        ca_file = args.ca_file
        if ca_file is None and (paths.certs_dir / CA_FILE).is_file():
            ca_file = paths.certs_dir / CA_FILE
        url = scrapyd.check_node_url(args.url)
        ca_pem = remote_nodes.read_ca(ca_file) if ca_file and url.startswith("https://") else ""
        # the node must answer, with the cluster's credentials, before it is listed
        probe = scrapyd.Node(url, target.username, target.password, ca_pem=ca_pem)
        status = probe.status(timeout=10)
        if not status.up:
            raise OpsError(f"not added: {status.failure}")
        node = remote_nodes.add(client, url, ca_pem)
    finally:
        client.close()
    say(f"added {node.url}" + (" (CA: %s)" % ca_file if ca_pem else "")
        + ": deploy, schedule, status, the timer and the exporter reach it")
    say("it has no project yet: `make deploy` reaches every node")
    return 0
