"""``deploy``, ``schedule``, ``seed``, ``crawl``, ``clear``: the project and its crawls.

``deploy`` builds the egg once (``scrapyd-deploy --build-egg``) and uploads it
to every node, failing when any node fails; ``schedule`` starts a job on every
node; ``seed`` pushes start URLs; ``crawl`` does both; ``clear`` deletes a
spider's frontier.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.cli.status import watch
from bloomcrawl.ops.cli.target import TargetOptions, resolve_target
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.console import OpsError, say

DEFAULT_PROJECT = "bloomcrawl"
DEFAULT_SPIDER = "site"


def deploy_project(paths: Paths, nodes: Sequence[scrapyd.Node], project: str,
                   version: str | None = None, egg: Path | None = None) -> int:
    """Upload ``egg`` (by default the project's, built now) to every node; 1 if any failed."""
    # like scrapyd-deploy: a timestamp, so scrapyd (which runs the highest) runs the newest
    version = version or str(int(time.time()))
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-egg-") as tmp:
        if egg is None:
            egg = Path(tmp) / f"{project}-{version}.egg"
            scrapyd.build_egg(paths.project_dir(), egg)
        content = egg.read_bytes()
    results = scrapyd.deploy(nodes, project, version, content)
    failed = 0
    for node, answer, error in results:
        if answer is None:
            failed += 1
            say(f"FAIL {node.url}: {error}")
        else:
            say("ok   {}: {} {}, spiders: {}".format(node.url, project, version,
                                                     answer.get("spiders")))
    say("deployed %s %s to %d of %d node(s)" % (project, version,
                                                len(results) - failed, len(results)))
    return 1 if failed else 0


def parse_pairs(pairs: Sequence[str], what: str) -> list[tuple[str, str]]:
    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise OpsError(f"{what} {pair!r}: expected NAME=VALUE")
        out.append((name, value))
    return out


@dataclass
class CrawlOptions:
    """A crawl's spider, project, Scrapy settings and spider arguments, as given."""

    spider: str = DEFAULT_SPIDER
    project: str = DEFAULT_PROJECT
    #: ``NAME=VALUE`` Scrapy settings (``-s``)
    settings: Sequence[str] = ()
    #: ``NAME=VALUE`` spider arguments (``-a``)
    arguments: Sequence[str] = ()
    allowed_domains: str | None = None
    depth_limit: int | None = None
    #: MAX_IDLE_TIME_BEFORE_CLOSE, unless a setting gives it
    max_idle: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CrawlOptions:
        return cls(spider=args.spider, project=args.project, settings=args.setting or (),
                   arguments=args.arg or (), allowed_domains=args.allowed_domains,
                   depth_limit=args.depth_limit, max_idle=args.max_idle)

    def scrapy_settings(self) -> list[tuple[str, str]]:
        settings = parse_pairs(self.settings, "setting")
        if self.max_idle is not None and "MAX_IDLE_TIME_BEFORE_CLOSE" not in dict(settings):
            settings.append(("MAX_IDLE_TIME_BEFORE_CLOSE", str(self.max_idle)))
        return settings

    def spider_arguments(self, urls: Sequence[str]) -> list[tuple[str, str]]:
        """The arguments; ``allowed_domains`` defaults to the hosts of ``urls``."""
        spider_args = parse_pairs(self.arguments, "spider argument")
        names = {name for name, _ in spider_args}
        if self.allowed_domains:
            spider_args.append(("allowed_domains", self.allowed_domains))
        elif urls and "allowed_domains" not in names:
            hosts = sorted({urllib.parse.urlsplit(u).hostname or "" for u in urls} - {""})
            spider_args.append(("allowed_domains", ",".join(hosts)))
        if self.depth_limit is not None:
            spider_args.append(("depth_limit", str(self.depth_limit)))
        return spider_args

    def schedule(self, nodes: Sequence[scrapyd.Node], urls: Sequence[str]) -> dict[str, str]:
        """One job on every node; {node url: job id}."""
        return scrapyd.schedule(nodes, self.project, self.spider, self.scrapy_settings(),
                                self.spider_arguments(urls))


def seed(client: redis.Redis, spider: str, urls: Sequence[str]) -> int:
    """Push ``urls`` to the spider's start URLs; every one must be an http(s) URL."""
    key = keys.spider_key(defaults.START_URLS_KEY, spider)
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise OpsError(f"not an http(s) URL: {url!r}")
    if urls:
        client.rpush(key, *urls)
    return len(urls)


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


# --- the commands -----------------------------------------------------------------


def cmd_deploy(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True)
    return deploy_project(paths, target.nodes, args.project, args.version,
                          Path(args.egg) if args.egg else None)


def cmd_schedule(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True)
    for url, job in CrawlOptions.from_args(args).schedule(target.nodes, []).items():
        say(f"{url} {job}")
    return 0


def cmd_seed(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False)
    count = seed(target.redis(), args.spider, args.urls)
    say("pushed %d start URL(s) to %s" % (count, keys.spider_key(
        defaults.START_URLS_KEY, args.spider)))
    return 0


def cmd_crawl(args: argparse.Namespace, paths: Paths) -> int:
    if not args.urls:
        raise OpsError("give at least one start URL (make crawl URL=https://...)")
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True)
    options = CrawlOptions.from_args(args)
    jobs = options.schedule(target.nodes, args.urls)
    count = seed(target.redis(), options.spider, args.urls)
    say("seeded %d URL(s); %s running on %d node(s)" % (count, options.spider, len(jobs)))
    if args.wait:
        return watch(target, options.spider, options.project, jobs, args.timeout)
    return 0


def cmd_clear(args: argparse.Namespace, paths: Paths) -> int:
    if not args.yes:
        raise OpsError(f"this deletes {args.spider}'s filter, queue and stats: add --yes")
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False)
    say("deleted %d key(s) of %s" % (clear_spider(target.redis(), args.spider), args.spider))
    return 0
