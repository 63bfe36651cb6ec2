"""``demo``: bring the cluster up, deploy, crawl the demo site, print progress, then a summary.

The demo site counts its hits, so the summary says whether every page was
fetched exactly once. Locally it runs as one more process of the local
cluster; with Docker, as the compose service ``demo``; on a Swarm stack, as
its service ``demo`` on the manager, and the crawl itself is run from a
container on the stack's network (``demo --site``, where the site and every
worker are reached by name).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import urllib.parse
from typing import Any

from bloomcrawl.ops import noproxy, scrapyd
from bloomcrawl.ops.cli.cluster import up
from bloomcrawl.ops.cli.jobs import DEFAULT_SPIDER, clear_spider, deploy_project, seed
from bloomcrawl.ops.cli.status import frontier_line, percent, watch
from bloomcrawl.ops.cli.target import resolve_target
from bloomcrawl.ops.cluster.compose import Compose
from bloomcrawl.ops.cluster.envfile import read_env_file
from bloomcrawl.ops.cluster.local import LocalCluster
from bloomcrawl.ops.cluster.state import Paths, load_cluster
from bloomcrawl.ops.cluster.swarm import DEMO_URL, Swarm
from bloomcrawl.ops.console import say

#: a filter sized for the demo, so that its fill shows in status and Grafana
DEMO_FILTER_CAPACITY = 100_000
#: the demo shows every page crawled exactly once: at this rate no false positive is
#: expected among its pages (at the default 0.001, one new URL in about 1,000 may be taken
#: as seen, since the filter's memory follows the URLs it holds)
DEMO_ERROR_RATE = 1e-6
#: the demo site inside the compose network
COMPOSE_DEMO_URL = "http://demo:8000/"


def site_stats(url: str) -> dict[str, Any]:
    """The demo site's hit counters (``GET /__stats``)."""
    data: dict[str, Any] = noproxy.get_json(url.rstrip("/") + "/__stats")
    return data


def start_site(paths: Paths, *, workers: int, mode: str | None, pages: int | None,
               delay_ms: float | None, redis: str | None = None) -> tuple[str, str, str]:
    """Bring the cluster up if needed and start the demo site: (URL to crawl, URL of its
    stats, the cluster's mode)."""
    cluster = load_cluster(paths)
    if cluster is None or (redis and redis != cluster.redis):
        up(paths, workers, mode=mode, redis=redis)
        cluster = load_cluster(paths)
        assert cluster is not None
    env = read_env_file(paths.env_file)
    if cluster.mode == "swarm":
        Swarm(paths).start_demo()
        return DEMO_URL, DEMO_URL, cluster.mode
    if cluster.mode == "docker":
        compose = Compose(paths)
        compose.run("up", "-d", "demo", profiles=["demo"])
        compose.wait_healthy(services=["demo"])
        return (COMPOSE_DEMO_URL, "http://127.0.0.1:%s/" % (env.get("DEMO_PORT") or 8000),
                cluster.mode)
    url = LocalCluster(paths, env).start_demo(cluster, pages, delay_ms)
    return url, url, cluster.mode


#: the demo site is ours: its cluster-wide concurrency is each worker's CONCURRENT_REQUESTS
DEMO_HOST_CONCURRENCY_PER_WORKER = 16


def demo(paths: Paths, *, workers: int, mode: str | None, project: str, pages: int | None,
         delay_ms: float | None, max_idle: float, timeout: float,
         redis: str | None = None, site: str | None = None) -> int:
    """The whole demo; 1 when the deploy failed or the crawl did not end in ``timeout``.

    ``mode``: as :func:`~bloomcrawl.ops.cli.cluster.up` takes it. ``site``: the demo
    site's URL when it runs already; nothing is started then.
    """
    if site is not None:
        crawl_url = stats_url = site.rstrip("/") + "/"
    else:
        crawl_url, stats_url, running = start_site(paths, workers=workers, mode=mode,
                                                   pages=pages, delay_ms=delay_ms, redis=redis)
        if running == "swarm":
            return Swarm(paths).run_inside([
                "demo", "--site", crawl_url, "--project", project, "--max-idle", repr(max_idle),
                "--timeout", repr(timeout)])
    target = resolve_target(paths, need_nodes=True)
    if deploy_project(paths, target, project) != 0:
        return 1
    client = target.redis()
    clear_spider(client, DEFAULT_SPIDER)
    with contextlib.suppress(OSError):
        noproxy.post(stats_url + "__reset")
    started = time.monotonic()
    host = urllib.parse.urlsplit(crawl_url).hostname or ""
    jobs = scrapyd.schedule(target.nodes, project, DEFAULT_SPIDER,
                            [("MAX_IDLE_TIME_BEFORE_CLOSE", str(max_idle)),
                             ("BLOOMFILTER_CAPACITY", str(DEMO_FILTER_CAPACITY)),
                             ("BLOOMFILTER_ERROR_RATE", repr(DEMO_ERROR_RATE)),
                             # one host for the whole cluster: a budget every worker can use
                             ("CONCURRENT_REQUESTS_PER_DOMAIN",
                              str(DEMO_HOST_CONCURRENCY_PER_WORKER * len(target.nodes)))],
                            [("allowed_domains", host)])
    seed(client, DEFAULT_SPIDER, [crawl_url])
    say("crawling %s on %d node(s)" % (crawl_url, len(jobs)))
    code = watch(target, DEFAULT_SPIDER, project, jobs, timeout, max_idle=max_idle)
    elapsed = time.monotonic() - started
    stats = site_stats(stats_url)
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


def cmd_demo(args: argparse.Namespace, paths: Paths) -> int:
    mode = ("local" if args.local else "docker" if args.docker else "swarm" if args.swarm
            else None)
    return demo(paths, workers=args.workers, mode=mode, project=args.project,
                pages=args.pages, delay_ms=args.delay_ms, max_idle=args.max_idle,
                timeout=args.timeout, redis=args.redis, site=args.site)
