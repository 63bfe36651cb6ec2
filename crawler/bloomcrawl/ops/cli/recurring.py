"""``schedule --every/--cron``, ``schedules``, ``runs``, ``timer``: recurring crawls.

``bloomcrawl schedule --name news --every 6h URL...`` stores a schedule in
Redis (:mod:`bloomcrawl.ops.schedules`); the cluster's timer
(:mod:`bloomcrawl.ops.timer`) fires it. ``schedules`` lists them and pauses,
resumes, removes or runs one now; ``runs`` shows the last runs.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from bloomcrawl.ops.cli.jobs import (
    CrawlOptions,
    check_spider,
    check_start_urls,
    resolve_project_checked,
)
from bloomcrawl.ops.cli.target import TargetOptions, resolve_target
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.console import OpsError, say
from bloomcrawl.ops.runs import RUNNING, RunStore, shared_stats
from bloomcrawl.ops.schedules import Schedule, ScheduleStore, redis_time, spec_from_options

ACTIONS = ("list", "pause", "resume", "remove", "run-now")


def when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + "Z"


def add_schedule(args: argparse.Namespace, paths: Paths) -> int:
    if not args.name:
        raise OpsError("a recurring schedule needs a name: --name NAME")
    check_start_urls(args.urls)
    options = CrawlOptions.from_args(args)
    options.scrapy_settings()  # NAME=VALUE checked now, not at the first firing
    options.spider_arguments(args.urls)
    spec = spec_from_options(args.name, spider=args.spider, project=options.project,
                             every=args.every, cron=args.cron, settings=args.setting or [],
                             arguments=args.arg or [], urls=args.urls,
                             allowed_domains=args.allowed_domains, depth_limit=args.depth_limit,
                             max_idle=args.max_idle)
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False,
                            need_redis=True)
    # the deployed project that has the spider, asked now; no node known: the default
    try:
        nodes = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True,
                               quiet=True).nodes
    except OpsError:
        nodes = []
    checked = False
    if args.project is None:
        spec.project, checked = resolve_project_checked(nodes, args.spider, None)
    # a spider the project does not have is refused now, not by every node at each firing
    if not checked:
        check_spider(nodes, args.spider, spec.project)
    client = target.redis()
    schedule = ScheduleStore(client).add(spec, replace=args.replace)
    now = redis_time(client)
    first = schedule.due_slot(now)
    say("schedule %s: %s on every node, %s; next fire %s" % (
        spec.name, spec.spider, spec.when(),
        when(first) + " (now)" if first is not None else when(schedule.next_slot(now))))
    say("the cluster's timer fires it (`make up` starts one; else run `bloomcrawl timer`)")
    return 0


def describe(schedule: Schedule, now: float) -> str:
    spec = schedule.spec
    outcome = schedule.outcome or {}
    why = "; ".join(([outcome["reason"]] if outcome.get("reason") else []) + refusals(outcome))
    last = "never" if schedule.last_slot is None else "%s %s%s" % (
        when(schedule.last_slot), outcome.get("result", "claimed, no outcome yet"),
        " (%s)" % why if why else "")
    due = schedule.due_slot(now)
    if schedule.paused:
        state = "paused"
    elif due is not None and (schedule.last_slot is None or due > schedule.last_slot):
        state = "next %s (due now: a timer fires it)" % when(due)  # not claimed yet
    else:
        state = "next %s" % when(schedule.next_slot(now))
    return "%s: %s %s, %s; last %s; %s; fired %d" % (
        spec.name, spec.spider, spec.project, spec.when(), last, state, schedule.fired)


def cmd_schedules(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args),
                            need_nodes=args.action == "run-now", need_redis=True)
    client = target.redis()
    store = ScheduleStore(client)
    if args.action == "list":
        if args.name:
            raise OpsError("schedules list takes no name")
        now = redis_time(client)
        found = store.all()
        for schedule in found:
            say(describe(schedule, now))
        if not found:
            say("no schedules (bloomcrawl schedule --name NAME --every 6h URL... makes one)")
        return 0
    if not args.name:
        raise OpsError("schedules %s needs the schedule's name" % args.action)
    if args.action in ("pause", "resume"):
        store.set_paused(args.name, args.action == "pause")
        say("%sd %s" % (args.action, args.name))
    elif args.action == "remove":
        store.remove(args.name)
        say("removed %s (its runs stay in `bloomcrawl runs`)" % args.name)
    else:
        schedule = store.get(args.name)
        from bloomcrawl.ops.timer import fire  # the timer builds on the cli's job options

        outcome = fire(client, target, schedule, redis_time(client), manual=True)
        outcome["timer"] = "run-now"
        store.record(args.name, outcome)
        say(outcome_line(args.name, outcome))
        return 0 if outcome["run"] else 1
    return 0


def refusals(outcome: dict[str, Any]) -> list[str]:
    """What each node that refused a firing's job said, as recorded in its outcome."""
    return ["refused by %s: %s" % (node, why)
            for node, why in sorted(outcome.get("refused", {}).items())]


def outcome_line(name: str, outcome: dict[str, Any]) -> str:
    line = "%s: %s" % (name, outcome["result"])
    if outcome.get("run"):
        line += " run %s, jobs on %d node(s)" % (outcome["run"], len(outcome["started"]))
    for refusal in refusals(outcome):
        line += "; " + refusal
    if outcome.get("reason"):
        line += " (%s)" % outcome["reason"]
    return line


def cmd_runs(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False,
                            need_redis=True)
    client = target.redis()
    runs = RunStore(client).recent(args.limit, schedule=args.schedule)
    if args.json:
        say(json.dumps([{**run.to_hash(), "counters": run.counters,
                         "finish_reason": run.finish_reason, "duration": run.duration}
                        for run in runs], indent=2))
        return 0
    now = redis_time(client)
    for run in runs:
        if run.status == RUNNING:
            # so far: the spider's shared stats now
            run.stats_end = shared_stats(client, run.spider)
        counters = ", ".join("%s %d" % item for item in run.counters.items())
        took = run.duration if run.duration is not None else now - run.started
        say("%s  %s  %s  %s  %.0f s  %s  jobs %d%s" % (
            run.id, run.spider, when(run.started), run.status if run.status == RUNNING
            else run.finish_reason, took, counters, len(run.jobs),
            ", refused %d" % len(run.refused) if run.refused else ""))
    if not runs:
        say("no runs yet")
    return 0


def cmd_timer(args: argparse.Namespace, paths: Paths) -> int:
    options = TargetOptions.from_args(args)
    # the nodes are asked for at each firing: a scaled cluster has others
    redis_target = resolve_target(paths, options, need_nodes=False, need_redis=True)
    from bloomcrawl.ops.timer import run_timer

    return run_timer(redis_target.redis(),
                     lambda: resolve_target(paths, options, need_nodes=True, need_redis=True),
                     args.interval)


def add_parsers(sub: Any, add_nodes: Any, add_redis: Any) -> None:
    p = sub.add_parser("schedules", help="list schedules; pause, resume, remove or run one now")
    add_nodes(p)
    add_redis(p)
    p.add_argument("action", nargs="?", choices=ACTIONS, default="list")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("runs", help="the last runs of schedules: counters, duration, reason")
    add_redis(p)
    p.add_argument("--schedule", help="only this schedule's runs")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("timer", help="fire due schedules until stopped (a cluster runs one)")
    add_nodes(p)
    add_redis(p)
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between two looks at the schedules")
    p.set_defaults(func=cmd_timer)


def add_schedule_options(p: argparse.ArgumentParser) -> None:
    """What turns ``schedule`` into a recurring one."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--every", help="a recurring crawl: every 90s, 15m, 6h, 7d, ...")
    group.add_argument("--cron", help='a recurring crawl: a cron expression in UTC ("0 */6 * * *")')
    p.add_argument("--name", help="the recurring schedule's name")
    p.add_argument("--replace", action="store_true", help="replace a schedule of that name")
    p.add_argument("urls", nargs="*", help="start URLs seeded at every firing")
