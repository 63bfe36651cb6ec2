"""``throttle``: a host's cluster-wide delay and concurrency, read or changed while crawling.

``bloomcrawl throttle example.com --delay 2 --concurrency 1`` stores the
operator's override in the frontier (the host's partition's policy hash);
every worker's next lease of the host obeys it. ``--clear`` removes it (the
DOWNLOAD_SLOTS entry or the defaults apply again). Without options it prints
the host's budget and load. robots.txt's Crawl-delay and AutoThrottle may
still raise the delay; they never lower it below the override.
"""

from __future__ import annotations

import argparse
from typing import Any

import redis

from bloomcrawl.core import keys
from bloomcrawl.core.politeness import (
    DomainState,
    host_of,
    host_partition,
    host_states,
    recorded_politeness,
    set_policy,
)
from bloomcrawl.core.sizing import FilterParams
from bloomcrawl.ops import inspection
from bloomcrawl.ops.cli.jobs import DEFAULT_SPIDER
from bloomcrawl.ops.cli.target import TargetOptions, resolve_target
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.console import OpsError, say

#: longest delay an operator may set, in seconds (a day)
MAX_DELAY_S = 86400.0


def check_host(text: str) -> str:
    """A host name as the frontier keys it (Scrapy's download slot: the URL's hostname)."""
    raw = text.strip()
    host = host_of(raw if "://" in raw else "http://%s/" % raw)
    if not host or "/" in raw.split("://")[-1].rstrip("/") or host != host.strip("."):
        raise argparse.ArgumentTypeError("not a host name: %r (e.g. example.com)" % (text,))
    return host


def delay_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number of seconds: %r" % (text,)) from None
    if not 0 <= value <= MAX_DELAY_S:
        raise argparse.ArgumentTypeError("the delay must be in 0..%d s, got %r"
                                         % (MAX_DELAY_S, text))
    return value


def concurrency(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % (text,)) from None
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError("the concurrency must be in 1..10000, got %r" % (text,))
    return value


def other_spiders(client: redis.Redis) -> list[str]:
    """The spiders with a filter in this Redis (none when it cannot be asked: a user whose
    ACL has no SCAN)."""
    try:
        found = inspection.find_meta_keys(client)
    except (OpsError, redis.RedisError):
        return []
    return sorted({inspection.spider_from_filter_name(keys.filter_name_from_meta(k))
                   for k in found})


def spider_frontier(client: redis.Redis, spider: str) -> tuple[keys.FrontierKeys, FilterParams]:
    """The spider's frontier keys and filter parameters, from the filter's meta hash."""
    default = keys.FrontierKeys(spider)
    with inspection.reachable(client):
        raw: dict[bytes, bytes] = client.hgetall(default.meta)  # type: ignore[assignment]
    meta = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}
    if "params" not in meta:
        others = [name for name in other_spiders(client) if name != spider]
        hint = ("; this Redis has crawls of %s: give --spider NAME" % ", ".join(others)
                if others else "")
        raise OpsError(
            "no crawl of %s in this Redis yet (no %s): start the crawl first; its filter"
            " decides which partition keeps each host%s" % (spider, default.meta, hint))
    try:
        params = FilterParams.from_json(meta["params"])
        frontier = inspection.frontier_keys(keys.filter_name_from_meta(default.meta), meta,
                                            spider, params.partitions)
    except (ValueError, TypeError, KeyError) as exc:
        raise OpsError("the filter %s has unreadable metadata: %s" % (default.meta, exc)) from exc
    return frontier, params


def show(state: DomainState) -> str:
    ready = ("now" if state.ready_in == 0 else
             "in %.2f s" % state.ready_in if state.ready_in is not None else
             "when a slot frees" if state.queued else "-")
    return ("%s: delay %.3g s, concurrency %d; %d queued, %d in flight, next lease %s"
            % (state.host, state.delay, state.concurrency, state.queued, state.in_flight, ready))


def cmd_throttle(args: argparse.Namespace, paths: Paths) -> int:
    if args.clear and (args.delay is not None or args.concurrency is not None):
        raise OpsError("--clear removes the override: give it without --delay/--concurrency")
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False,
                            need_redis=True)
    client = target.redis()
    frontier, params = spider_frontier(client, args.spider)
    host: str = args.host
    politeness = recorded_politeness(client, frontier)
    # a filter partitioned by fingerprint spreads a host over every partition
    partitions = ([host_partition(host, params.partitions)] if params.partition_by == "host"
                  else list(range(params.partitions)))
    change: dict[str, Any] = {}
    if args.clear:
        change = {"clear": True}
    elif args.delay is not None or args.concurrency is not None:
        change = {"delay": args.delay, "concurrency": args.concurrency}
    with inspection.reachable(client):
        if change:
            for p in partitions:
                set_policy(client, frontier, politeness, p, host, **change)
        states = host_states(client, frontier, politeness, [host])
    if change:
        say("%s %s for %s (every worker, from its next lease)" % (
            "cleared the override of" if args.clear else "set", host, args.spider))
    for state in states:
        say(show(state))
    if params.partition_by != "host":
        say("note: this crawl's filter spreads a host over its %d partitions: each keeps the"
            " budget" % params.partitions)
    return 0


def add_parser(sub: Any, add_redis: Any, spider_type: Any) -> None:
    p = sub.add_parser(
        "throttle", help="read or set a host's delay and concurrency for the whole cluster,"
        " while it crawls")
    add_redis(p)
    p.add_argument("--spider", default=DEFAULT_SPIDER, type=spider_type)
    p.add_argument("host", type=check_host, help="the host, e.g. example.com")
    p.add_argument("--delay", type=delay_seconds, help="seconds between two requests to it")
    p.add_argument("--concurrency", type=concurrency, help="requests in flight at once")
    p.add_argument("--clear", action="store_true",
                   help="remove the override: DOWNLOAD_SLOTS or the defaults apply again")
    p.set_defaults(func=cmd_throttle)

