"""The ``bloomcrawl`` command line: each subcommand, its options and the function it runs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bloomcrawl import __version__
from bloomcrawl.core import defaults, keys
from bloomcrawl.core.connection import INSECURE_ENV
from bloomcrawl.ops.cli import cluster, demo, jobs, recurring, status, throttle, worker_host
from bloomcrawl.ops.cluster.state import REDIS_KINDS
from bloomcrawl.ops.console import OpsError


def spider_name(name: str) -> str:
    """A spider name its Redis keys can be made of (no hash-tag braces)."""
    try:
        keys.check_key(keys.spider_key(defaults.STATS_KEY, name))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return name


def whole_seconds(text: str) -> int:
    """``--max-idle``: whole seconds, 0 or more (scrapy-redis's spiders read
    MAX_IDLE_TIME_BEFORE_CLOSE with int(): 2.5 would stop their jobs at startup)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give whole seconds, 0 or more (scrapy-redis spiders read it as an"
            " integer)")
    return int(value)


def _add_nodes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", help="comma-separated scrapyd URLs (SCRAPYD_NODES);"
                   " default: the cluster `up` started")
    p.add_argument("--scrapyd-service", help="a DNS name whose every address is a node"
                   " (inside the compose network: worker)")
    p.add_argument("--username", help="scrapyd user (SCRAPYD_USERNAME; password:"
                   " SCRAPYD_PASSWORD)")


def _add_redis(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis-url", help="(REDIS_URL) default: the cluster `up` started")


def _add_redis_kind(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis", choices=REDIS_KINDS, default=None,
                   help="one redis-server (single, the default) or a six-node Redis Cluster"
                   " (cluster: docker-compose.cluster.yml; containers only); a cluster"
                   " already up keeps its own")


def project_arg(value: str) -> str:
    """``--project``: a scrapyd project name, or the directory of a project's scrapy.cfg
    (what ``make deploy PROJECT=`` takes): its name, as ``deploy`` uploaded it."""
    path = Path(value).expanduser()
    if os.sep not in value and not path.is_dir():
        return value
    if not (path / "scrapy.cfg").is_file():
        raise argparse.ArgumentTypeError(
            f"{value}: neither a project name nor the directory of a scrapy.cfg")
    try:
        return jobs.project_name(path)
    except OpsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _add_crawl_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spider", default=jobs.DEFAULT_SPIDER, type=spider_name)
    p.add_argument("--project", type=project_arg,
                   help="the scrapyd project, by name or by the directory of its scrapy.cfg"
                   " (default: the deployed project that has SPIDER)")
    p.add_argument("--allowed-domains", help="comma list; default: the start URLs' hosts")
    p.add_argument("--depth-limit", type=int)
    p.add_argument("--max-idle", type=whole_seconds, default=None,
                   help="MAX_IDLE_TIME_BEFORE_CLOSE: whole seconds of empty frontier before"
                   " the jobs close")
    p.add_argument("-s", "--setting", action="append", metavar="NAME=VALUE")
    p.add_argument("-a", "--arg", action="append", metavar="NAME=VALUE",
                   help="spider argument")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bloomcrawl",
        description="Run a bloomcrawl cluster, deploy the project to it, crawl, watch.",
    )
    parser.add_argument("--version", action="version", version="%(prog)s " + __version__)
    sub = parser.add_subparsers(dest="command", required=True)

    # --- the cluster (cli/cluster.py)
    p = sub.add_parser("up", help="start the cluster (docker-compose, or local processes)")
    p.add_argument("--workers", type=int, default=cluster.DEFAULT_WORKERS)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--local", action="store_true", help="local processes even with Docker")
    group.add_argument("--docker", action="store_true", help="docker-compose (even on a swarm"
                       " manager); fail without a Docker engine")
    group.add_argument("--swarm", action="store_true", help="a Docker Swarm stack (the"
                       " default on a swarm manager); fail unless this engine is a manager")
    p.add_argument("--demo", action="store_true", help="start the demo site too")
    p.add_argument("--build", action="store_true", help="rebuild the worker image")
    _add_redis_kind(p)
    p.add_argument("--redis-bind", default="", metavar="ADDR", help="also publish Redis on"
                   " this address (REDIS_BIND), with TLS (make certs) and an ACL user per role,"
                   " for worker hosts (make worker-host)")
    p.set_defaults(func=cluster.cmd_up)

    p = sub.add_parser("down", help="stop the cluster; removes its data unless --keep-data")
    p.add_argument("--keep-data", action="store_true")
    p.set_defaults(func=cluster.cmd_down)

    p = sub.add_parser("scale", help="run N workers")
    p.add_argument("workers", type=int)
    p.set_defaults(func=cluster.cmd_scale)

    p = sub.add_parser("nodes", help="print every scrapyd node's URL; add or remove a node"
                       " of another host (make worker-host)")
    p.add_argument("action", nargs="?", choices=["add", "remove"])
    p.add_argument("url", nargs="?", help="https://host:port of the node to add or remove")
    p.add_argument("--ca-file", type=Path, help="the CA the node's certificate chains to"
                   " (default: .run/certs/ca.crt when it exists)")
    _add_nodes(p)
    _add_redis(p)
    p.set_defaults(func=cluster.cmd_nodes)

    # --- the project and its crawls (cli/jobs.py)
    p = sub.add_parser("deploy", help="build the egg and upload it to every node;"
                       " fails if any node fails or the spiders do not import on it")
    _add_nodes(p)
    p.add_argument("--project-dir", type=Path, help="your Scrapy project: the directory of"
                   " its scrapy.cfg (default: the bundled project, crawler/)")
    p.add_argument("--project", help="the scrapyd project name (default: `project` of"
                   " scrapy.cfg's [deploy] section, else the directory's name)")
    p.add_argument("--no-requirements", action="store_true", help="do not install the"
                   " project's requirements.txt for the workers")
    p.add_argument("--version", dest="version", help="default: the time, as scrapyd-deploy does")
    p.add_argument("--egg", help="upload this egg instead of building one")
    p.set_defaults(func=jobs.cmd_deploy)

    p = sub.add_parser("schedule", help="start a job of SPIDER on every node; with --every"
                       " or --cron, a recurring crawl the cluster's timer fires")
    _add_nodes(p)
    _add_redis(p)
    _add_crawl_options(p)
    recurring.add_schedule_options(p)
    p.set_defaults(func=jobs.cmd_schedule)

    p = sub.add_parser("seed", help="push start URLs (or JSON entries) to the spider's start list:"
                       " <spider>:start_urls, or the redis_key its workers recorded")
    _add_redis(p)
    p.add_argument("--spider", default=jobs.DEFAULT_SPIDER, type=spider_name)
    p.add_argument("urls", nargs="+")
    p.set_defaults(func=jobs.cmd_seed)

    p = sub.add_parser("crawl", help="schedule SPIDER on every node and seed URLS")
    _add_nodes(p)
    _add_redis(p)
    _add_crawl_options(p)
    p.add_argument("--wait", action="store_true",
                   help="print this crawl's progress until the jobs end (give --max-idle)")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("urls", nargs="*",
                   help="start URLs to seed; none: the spider's own start requests")
    p.set_defaults(func=jobs.cmd_crawl)

    p = sub.add_parser("cancel", help="cancel every pending or running job of SPIDER on"
                       " every node (each closes its spider: its leases go back to the queue)")
    _add_nodes(p)
    p.add_argument("--spider", default=jobs.DEFAULT_SPIDER, type=spider_name)
    p.add_argument("--project", type=project_arg,
                   help="only this project's jobs (default: every project's)")
    p.set_defaults(func=jobs.cmd_cancel)

    p = sub.add_parser("clear", help="delete every key of a spider: filter, queue, leases,"
                       " start URLs, stats, items")
    _add_redis(p)
    p.add_argument("--spider", default=jobs.DEFAULT_SPIDER, type=spider_name)
    p.add_argument("--yes", action="store_true")
    p.set_defaults(func=jobs.cmd_clear)

    throttle.add_parser(sub, _add_redis, spider_name)
    recurring.add_parsers(sub, _add_nodes, _add_redis)

    # --- looking at it (cli/status.py)
    p = sub.add_parser("status", help="nodes, jobs, queue, leases, filter fill")
    _add_nodes(p)
    _add_redis(p)
    p.set_defaults(func=status.cmd_status)

    p = sub.add_parser("filter-info", help="a Bloom filter's size and fill, as JSON")
    _add_redis(p)
    p.add_argument("--spider", default=jobs.DEFAULT_SPIDER, type=spider_name)
    p.add_argument("--filter", help="filter name (default <spider>:bloomfilter)")
    p.set_defaults(func=status.cmd_filter_info)

    # --- the demo (cli/demo.py)
    p = sub.add_parser("demo", help="up, deploy, crawl the demo site, print progress, summary")
    p.add_argument("--workers", type=int, default=cluster.DEFAULT_WORKERS)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--local", action="store_true")
    group.add_argument("--docker", action="store_true", help="docker-compose, even on a swarm"
                       " manager")
    group.add_argument("--swarm", action="store_true", help="a Docker Swarm stack")
    p.add_argument("--site", help="crawl the demo site already running at this URL (its"
                   " /__stats counts the hits) and start nothing")
    p.add_argument("--project", default=jobs.DEFAULT_PROJECT)
    p.add_argument("--pages", type=int, help="local mode: pages of the demo site")
    p.add_argument("--delay-ms", type=float, help="local mode: response delay")
    p.add_argument("--max-idle", type=whole_seconds, default=10)
    p.add_argument("--timeout", type=float, default=1800.0)
    _add_redis_kind(p)
    p.set_defaults(func=demo.cmd_demo)

    # --- logs (cli/cluster.py)
    p = sub.add_parser("logs", help="recent logs of the cluster's services")
    p.add_argument("service", nargs="?")
    p.add_argument("--tail", type=int, default=100)
    p.add_argument("-f", "--follow", action="store_true")
    p.set_defaults(func=cluster.cmd_logs)

    # --- a host of workers for a cluster elsewhere (cli/worker_host.py)
    p = sub.add_parser("worker-host", help="run scrapyd nodes on this host, behind TLS and"
                       " basic auth, whose jobs crawl for the cluster at --redis-url")
    p.add_argument("--redis-url", help="the cluster's Redis (REDIS_URL), rediss:// with the"
                   " bloomcrawl-worker user")
    p.add_argument("--node-url", required=True, help="https://ADDR:PORT the central host"
                   " reaches the first node at (ADDR: this host's address; node i listens on"
                   " PORT+i-1)")
    p.add_argument("--workers", type=int, default=1, help="scrapyd nodes on this host")
    p.set_defaults(func=worker_host.cmd_worker_host)

    insecure_help = ("allow plain text (redis://, http://) to addresses off this machine"
                     f" ({INSECURE_ENV}=1)")
    parser.add_argument("--insecure", action="store_true", help=insecure_help)
    for command in sub.choices.values():
        # after the command too; SUPPRESS keeps a --insecure given before it
        command.add_argument("--insecure", action="store_true", default=argparse.SUPPRESS,
                             help=insecure_help)
    return parser
