"""The timer: fires due schedules and follows their runs until they end.

``bloomcrawl timer`` (a compose service; a process of the local cluster)
looks at every schedule each ``--interval`` seconds. Any number of timers
may run against one Redis: a slot is fired by the one whose claim wins
(:meth:`~bloomcrawl.ops.schedules.ScheduleStore.claim`). Everything a timer
knows is in Redis, so a restarted timer (or a restarted Redis, with its
data) goes on where it stopped, and fires a slot it missed once.

A firing (:func:`fire`):

1. the schedule's previous run still has a job pending or running: the
   firing is recorded as skipped, naming that run;
2. else the start URLs are pushed and one job is started on every node, with
   the run's id as ``FRONTIER_CRAWL_ID``; the outcome records the jobs
   started per node and the nodes that refused, and the run is recorded
   (:mod:`bloomcrawl.ops.runs`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.errors import BloomcrawlError
from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.cli.jobs import CrawlOptions, check_start_urls
from bloomcrawl.ops.cli.target import Target
from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.runs import RUNNING, Run, RunStore, check_run, run_id_for, shared_stats
from bloomcrawl.ops.schedules import Schedule, ScheduleStore, redis_time

logger = logging.getLogger(__name__)

#: seconds between two looks at the schedules
DEFAULT_INTERVAL = 1.0
#: seconds between two looks at a running run's jobs
RUN_CHECK_INTERVAL = 5.0


def outcome_of(slot: float, fired_at: float, manual: bool, result: str, reason: str = "",
               run: Run | None = None) -> dict[str, Any]:
    """What a firing did, as the schedule records it."""
    return {"slot": slot, "fired_at": fired_at, "manual": manual, "result": result,
            "run": run.id if run is not None and run.jobs else None,
            "started": run.jobs if run is not None else {},
            "refused": run.refused if run is not None else {}, "reason": reason}


def fire(client: redis.Redis, target: Target, schedule: Schedule, slot: float, *,
         manual: bool = False) -> dict[str, Any]:
    """Start ``schedule``'s run for ``slot`` (or record why not); returns the outcome."""
    runs = RunStore(client)
    spec = schedule.spec
    fired_at = redis_time(client)
    previous = runs.latest(spec.name)
    if previous is not None and previous.status == RUNNING and not check_run(
            client, runs, previous, target.nodes):
        return outcome_of(slot, fired_at, manual, "skipped",
                          "run %s is still running" % previous.id)
    run_id = run_id_for(spec.name, slot, manual)
    options = CrawlOptions(spider=spec.spider, project=spec.project,
                           settings=[*spec.settings, "FRONTIER_CRAWL_ID=%s" % run_id],
                           arguments=spec.arguments, allowed_domains=spec.allowed_domains,
                           depth_limit=spec.depth_limit, max_idle=spec.max_idle)
    try:
        settings, arguments = options.scrapy_settings(), options.spider_arguments(spec.urls)
    except OpsError as exc:
        return outcome_of(slot, fired_at, manual, "failed", str(exc))
    run = Run(run_id, spec.name, spec.spider, spec.project, slot, fired_at,
              stats_start=shared_stats(client, spec.spider))
    if spec.urls:
        seed_run(client, spec.spider, spec.urls)
    for node, answer, error in scrapyd.schedule_each(target.nodes, spec.project, spec.spider,
                                                     settings, arguments):
        if answer is not None:
            run.jobs[node.url] = str(answer["jobid"])
        else:
            run.refused[node.url] = error or "no answer"
    run.stats_end = dict(run.stats_start)
    if run.jobs:
        runs.start(run)
    result = ("started" if not run.refused else "partly started" if run.jobs
              else "failed")
    reason = ("" if run.jobs else "no node started a job" if target.nodes
              else "no scrapyd node is known")
    return outcome_of(slot, fired_at, manual, result, reason, run)


def seed_run(client: redis.Redis, spider: str, urls: list[str]) -> None:
    """Push a run's start URLs: fetched again at every run (``dont_filter``), once per run
    whichever worker takes them (a start request goes through the filter under the run's
    crawl id)."""
    check_start_urls(urls)
    entries = [json.dumps({"url": url, "dont_filter": True, "meta": {"is_start_request": True}})
               for url in urls]
    client.rpush(keys.spider_key(defaults.START_URLS_KEY, spider), *entries)


class Timer:
    """Fires the schedules in one Redis; ``target()`` gives the nodes at each firing
    (a scaled cluster has others)."""

    def __init__(self, client: redis.Redis, target: Callable[[], Target], *,
                 timer_id: str | None = None, interval: float = DEFAULT_INTERVAL) -> None:
        self.client = client
        self.target = target
        self.timer_id = timer_id or "%s-%d-%s" % (socket.gethostname(), os.getpid(),
                                                   uuid.uuid4().hex[:6])
        self.interval = interval
        self.schedules = ScheduleStore(client)
        self.runs = RunStore(client)
        self.stopping = threading.Event()
        self._runs_checked = float("-inf")
        #: schedule -> the slot of its last claim sent without an answer
        self._unheard: dict[str, float] = {}

    def tick(self) -> list[str]:
        """One look at every schedule; the names of those this timer fired."""
        fired = []
        now = redis_time(self.client)
        for schedule in self.schedules.all():
            if schedule.paused:
                continue
            slot = schedule.due_slot(now)
            if slot is None:
                continue
            # a claim this timer sent without hearing back (its reply lost) is sent again:
            # Redis answers that the slot is this timer's until its firing is recorded. A
            # claim heard is never sent again, so a firing that failed midway (jobs
            # started, the outcome not recorded) is not repeated: at most once
            unheard = self._unheard.get(schedule.name) == slot
            if schedule.last_slot is not None and slot <= schedule.last_slot and not unheard:
                continue
            try:
                won = self.schedules.claim(schedule.name, slot, self.timer_id)
            except (redis.RedisError, BloomcrawlError):
                self._unheard[schedule.name] = slot
                raise
            self._unheard.pop(schedule.name, None)
            if not won:
                continue  # another timer fired it
            try:
                outcome = fire(self.client, self.target(), schedule, slot)
            except (OpsError, BloomcrawlError) as exc:
                outcome = outcome_of(slot, now, False, "failed", str(exc))
            outcome["timer"] = self.timer_id
            self.schedules.record(schedule.name, outcome)
            logger.info("schedule %s, slot %s: %s%s", schedule.name, slot, outcome["result"],
                        " (%s)" % outcome["reason"] if outcome.get("reason") else "")
            fired.append(schedule.name)
        if now - self._runs_checked >= RUN_CHECK_INTERVAL:
            self._runs_checked = now
            self.check_runs()
        return fired

    def check_runs(self) -> None:
        running = [run for run in self.runs.recent() if run.status == RUNNING]
        if not running:
            return
        nodes = self.target().nodes
        for run in running:
            if check_run(self.client, self.runs, run, nodes):
                logger.info("run %s ended: %s, %s", run.id, run.finish_reason, run.counters)

    def run_forever(self) -> None:
        logger.info("timer %s: firing schedules every %.3g s", self.timer_id, self.interval)
        while not self.stopping.is_set():
            try:
                self.tick()
            except (redis.RedisError, BloomcrawlError) as exc:
                logger.warning("timer %s: %s; trying again", self.timer_id, exc)
            self.stopping.wait(self.interval)


def run_timer(client: redis.Redis, target: Callable[[], Target], interval: float) -> int:
    """Fire schedules until SIGTERM or SIGINT."""
    timer = Timer(client, target, interval=interval)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: timer.stopping.set())
    timer.run_forever()
    return 0
