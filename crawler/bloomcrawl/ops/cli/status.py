"""``status``, ``filter-info``, and the progress lines of a crawl (``crawl --wait``, ``demo``).

They read Redis through :mod:`bloomcrawl.ops.inspection` and the nodes
through :mod:`bloomcrawl.ops.scrapyd`; nothing here writes. On Redis Cluster
(``--redis-url redis+cluster://host:port,...``) ``status`` adds a line per
master: whether it answered, its memory and keys.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.connection import REDIS_ERRORS, describe_redis, is_cluster
from bloomcrawl.ops import inspection, runs, scrapyd
from bloomcrawl.ops.cli.target import Target, TargetOptions, resolve_target
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.cluster.swarm import IN_STACK_ENV
from bloomcrawl.ops.console import OpsError, say, warn
from bloomcrawl.ops.runs import CLOSED_RE

WATCH_INTERVAL = 2.0


def percent(value: float | None) -> str:
    return "-" if value is None else "%.2f%%" % (100 * value)


def table(rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def shared_stats(client: redis.Redis, spider: str) -> dict[str, int]:
    """:func:`bloomcrawl.ops.runs.shared_stats`, {} when Redis cannot be read: progress
    lines go on through an outage."""
    with contextlib.suppress(*REDIS_ERRORS):
        return runs.shared_stats(client, spider)
    return {}


#: what a read of Redis raises when it cannot answer
_READ_ERRORS: tuple[type[BaseException], ...] = (OpsError, *REDIS_ERRORS)


def frontier_line(client: redis.Redis, spider: str, since: dict[str, int] | None = None
                  ) -> tuple[str, inspection.SpiderState | None]:
    """One line of a spider's counters, and its state (``None`` before its filter exists).

    ``since``: shared stats taken earlier; the counts are then those since.
    """
    meta = keys.meta_key(keys.spider_key(defaults.FILTER_KEY, spider))
    try:
        state = inspection.spider_state(client, meta)
        stats = runs.shared_stats(client, spider) if state is None else state.stats
    except _READ_ERRORS as exc:
        # the workers wait for Redis and keep what they owe it: the counts come back with it
        return "Redis cannot be read (%s); the workers wait for it" % (
            str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__), None
    if since:
        stats = {name: value - since.get(name, 0) for name, value in stats.items()}
    if state is None:  # no filter yet: the stats alone
        return ("pages %d  items %d" % (stats.get("pages", 0), stats.get("items", 0)), None)
    return ("pages %d  items %d  queue %s  leased %s  filtered %d  requeued %d" % (
        stats.get("pages", 0), stats.get("items", 0), state.queue_length, state.leased,
        stats.get("filtered", 0), stats.get("requeued", 0)), state)


#: seconds of an empty frontier with jobs still running before ``crawl --wait`` says why
IDLE_HINT_S = 30.0


def watch(target: Target, spider: str, project: str, jobs: dict[str, str],
          timeout: float, seeds: tuple[str, Sequence[str]] | None = None,
          max_idle: float | None = None) -> int:
    """Print this crawl's progress every 2 s until every job finished; 1 on timeout, when
    a job ended without its spider closing (:func:`ended_badly`), or when no page was
    crawled and errors or refused start URLs were counted (:func:`crawl_errors`).

    ``seeds``: the start list and the entries this crawl pushed to it, taken back when
    every job failed (:func:`take_back`). ``max_idle``: the jobs' MAX_IDLE_TIME_BEFORE_CLOSE
    as the crawl gave it (None: not given), for the hint on an empty frontier."""
    client = target.redis()
    started = time.monotonic()
    deadline = started + timeout
    before = shared_stats(client, spider)
    idle_since: float | None = None
    hinted = False
    while True:
        found = scrapyd.job_entries(target.nodes, project, jobs)
        states = scrapyd.states_of(found)
        line, state = frontier_line(client, spider, before)
        counts = {s: sum(1 for v in states.values() if v == s)
                  for s in (*scrapyd.JOB_STATES, "unknown")}
        now = time.monotonic()
        say("[%4.0fs] %s  jobs: %d running, %d pending, %d finished" % (
            now - started, line, counts["running"], counts["pending"], counts["finished"]))
        if counts["finished"] + counts["unknown"] == len(states) and counts["finished"]:
            tails = finished_logs(target.nodes, jobs, found)
            bad = ended_badly(tails)
            if seeds is not None and len(bad) == len(jobs) and not any(
                    why.startswith("was stopped") for why in bad.values()):
                take_back(client, *seeds)
            after = shared_stats(client, spider)
            errors = crawl_errors(before, after)
            if after.get("errors", 0) > before.get("errors", 0):
                show_errors(tails)
            return 1 if bad or errors else 0
        if now > deadline:
            warn(f"jobs still running after {timeout:g}s: they go on; stop them with"
                 f" bloomcrawl cancel --project {project} --spider {spider}")
            return 1
        empty = (state is not None and not state.queue_length and not state.leased
                 and not state.start_urls and not state.start_urls_leased)
        if not empty or counts["running"] == 0:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= IDLE_HINT_S and not hinted:
            hinted = True
            if max_idle:
                warn(f"the frontier has been empty for {IDLE_HINT_S:g} s and the jobs still"
                     f" run: they close once it has been empty for {max_idle:g} s"
                     " (MAX_IDLE_TIME_BEFORE_CLOSE)")
            else:
                warn(f"the frontier has been empty for {IDLE_HINT_S:g} s and the jobs still"
                     " run: a job ends MAX_IDLE_TIME_BEFORE_CLOSE seconds after its frontier"
                     " emptied (0: never); give crawl --max-idle S")
        time.sleep(WATCH_INTERVAL)


def take_back(client: redis.Redis, key: str, entries: Sequence[str]) -> int:
    """Every job of a crawl failed: the start URLs it pushed that no worker read would
    start the next crawl of the spider, whatever URL that one is given. Take them back."""
    with contextlib.suppress(*REDIS_ERRORS):
        removed = sum(int(client.lrem(key, 1, entry)) for entry in entries)
        if removed:
            warn("every job failed: took back the %d start URL(s) this crawl pushed to %s;"
                 " crawl again once the cause is fixed" % (removed, key))
        return removed
    return 0


def crawl_errors(before: dict[str, int], after: dict[str, int]) -> bool:
    """Say what went wrong during a crawl; True when it crawled no page and errors or
    refused start URL entries were counted (a spider whose callbacks all failed, or whose
    start URLs had nowhere to go, must not pass the wait)."""
    def grew(name: str) -> int:
        return after.get(name, 0) - before.get(name, 0)

    errors, refused, pages = grew("errors"), grew("bad_start_urls"), grew("pages")
    if errors or refused:
        warn("this crawl counted %d error(s) (callbacks that raised, downloads that failed"
             " for good) and %d refused start URL entr%s: the job logs say which" % (
                 errors, refused, "y" if refused == 1 else "ies"))
    return pages == 0 and bool(errors or refused)


#: a log line Scrapy wrote at ERROR: its message
_ERROR_LOG_LINE = re.compile(r"^\S+ \S+ \[[^\]]+\] ERROR: (.+)$", re.M)
#: the error lines of a crawl the wait shows
SHOWN_ERRORS = 5


def error_lines(log: str) -> list[str]:
    """The messages of a job log's ERROR lines, each once, in order."""
    return list(dict.fromkeys(m.strip() for m in _ERROR_LOG_LINE.findall(log)))


def show_errors(tails: list[JobLog]) -> None:
    """The first ERROR lines of the finished jobs' logs (their tails), so that a crawl
    that counted errors says which."""
    shown = 0
    for log in tails:
        for line in error_lines(log.tail)[:SHOWN_ERRORS - shown]:
            warn(f"  {log.node_url}: {line}")
            shown += 1
        if shown >= SHOWN_ERRORS:
            return


#: how the exceptions bloomcrawl raises on purpose are named in a traceback
OWN_ERRORS = "bloomcrawl."
#: a log line naming an exception: ``ValueError: ...``, ``bloomcrawl.core.errors.X: ...``
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): .*$", re.M)


def job_failure(tail: str) -> str | None:
    """What a finished job's log (its tail) says went wrong: "failed: <bloomcrawl's error>",
    "was stopped ..." (its spider closed on a shutdown: cancelled), "ended without its
    spider closing: <the error>", or None (it closed its spider)."""
    why = job_error(tail)
    if why is not None and why.startswith(OWN_ERRORS):
        return "failed: " + why
    closed = CLOSED_RE.search(tail)
    if closed and closed.group(1) == "shutdown":
        return ("was stopped before its crawl ended (Spider closed (shutdown): cancelled, its"
                " node stopped%s); what it had not crawled stays queued for the next crawl"
                % (", or an error: " + why if why else ""))
    if closed:
        return None
    return "ended without its spider closing: " + (why or "no exception in the log's tail")


def job_error(log: str) -> str | None:
    """The exception a failed job's log names: bloomcrawl's own error when there is one
    (a setting it refused says what to fix), else the last, leaving out Scrapy's
    "Engine slot not assigned" that follows any failure to open the spider."""
    errors = [line.strip() for line in _ERROR_LINE.findall(log)]
    ours = [line for line in errors if line.startswith(OWN_ERRORS)]
    others = [line for line in errors if "Engine slot not assigned" not in line]
    found = ours or others or errors
    return found[-1] if found else None


@dataclass(frozen=True)
class JobLog:
    """A finished job and the tail of its log."""

    node_url: str
    job: str
    log_url: str
    tail: str


def finished_logs(nodes: Sequence[scrapyd.Node], jobs: dict[str, str],
                  found: dict[str, tuple[str, dict[str, Any]]]) -> list[JobLog]:
    """The log tails of the finished jobs (``found``:
    :func:`~bloomcrawl.ops.scrapyd.job_entries`), each read once; a log that cannot be read
    is warned about and left out."""
    by_url = {node.url: node for node in nodes}
    logs = []
    for url, job in jobs.items():
        state, entry = found.get(job, ("unknown", {}))
        node = by_url.get(url)
        log_url = entry.get("log_url")
        if state != "finished" or node is None or not log_url:
            continue
        try:
            logs.append(JobLog(url, job, log_url, node.log_tail(log_url)))
        except scrapyd.ScrapydError as exc:
            warn(f"{url}: job {job}: its log could not be read: {exc}")
    return logs


def ended_badly(logs: list[JobLog]) -> dict[str, str]:
    """The finished jobs (:func:`finished_logs`) whose spider never closed (it failed to
    start: a bad setting, an import error, an exception in its constructor), whose log
    ends on one of bloomcrawl's errors (a filter that does not match the settings fails
    the spider's opening, and Scrapy then still logs "Spider closed (shutdown)"), or that
    were stopped (cancelled), each warned about with what its log says and where the log
    is: job -> :func:`job_failure`."""
    bad: dict[str, str] = {}
    for log in logs:
        failure = job_failure(log.tail)
        if failure is None:
            continue
        warn(f"{log.node_url}: job {log.job} {failure} (log:"
             f" {urllib.parse.urljoin(log.node_url + '/', log.log_url)})")
        bad[log.job] = failure
    return bad


def report_nodes(nodes: Sequence[scrapyd.NodeStatus], command: str) -> int:
    """One line on stderr for each node that did not answer; how many did not."""
    down = [n for n in nodes if not n.up]
    for n in down:
        warn(f"bloomcrawl {command}: {n.failure or n.error}")
    return len(down)


def status(target: Target) -> int:
    """Print the nodes and every spider's frontier; 1 when a node or Redis is down.

    Redis out of reach raises (its line names the server) once the nodes are printed.
    """
    mode = (target.cluster.mode if target.cluster
            else "swarm (seen from a container on the stack's network)"
            if os.environ.get(IN_STACK_ENV)
            else "not recorded (using REDIS_URL / --nodes)")
    say(f"cluster: {mode}")
    nodes = scrapyd.node_statuses(target.nodes)
    up = sum(1 for n in nodes if n.up)
    say("nodes: %d of %d up" % (up, len(nodes)))
    if nodes:
        rows: list[list[object]] = [["node", "up", "pending", "running", "finished", "error"]]
        for n in nodes:
            rows.append([n.node, "yes" if n.up else "NO", n.pending, n.running, n.finished,
                         n.error or ""])
        say(table(rows))
    nodes_down = report_nodes(nodes, "status")
    client = target.redis()
    masters = inspection.redis_nodes(client)
    used = inspection.total_memory(masters).used_bytes
    if is_cluster(client):  # the masters first: which one is down, before the failure line
        say("redis: %s, %d masters, %.1f MiB used" % (describe_redis(client), len(masters),
                                                      used / 2**20))
        say(table(master_rows(masters)))
    snap = inspection.snapshot(client, masters)
    if not is_cluster(client):
        say("redis: %.1f MiB used" % (used / 2**20))
    if not snap.spiders:
        say("spiders: none yet")
    else:
        say(table(spider_rows(snap.spiders)))
    for s in snap.spiders:
        for problem in s.problems:
            say(f"{s.spider}: {problem}")
    return 1 if nodes_down else 0


def master_rows(nodes: Sequence[inspection.RedisNode]) -> list[list[object]]:
    """The header and one row per Redis master; ``-`` where it did not answer."""
    rows: list[list[object]] = [["master", "up", "memory", "maxmemory", "keys"]]
    for node in nodes:
        memory = node.memory
        rows.append([
            node.name, "yes" if node.up else "NO",
            "%.1f MiB" % (memory.used_bytes / 2**20) if memory else "-",
            ("%.1f MiB" % (memory.max_bytes / 2**20) if memory.max_bytes else "unlimited")
            if memory else "-",
            "-" if node.keys is None else node.keys,
        ])
    return rows


def spider_rows(spiders: Sequence[inspection.SpiderState]) -> list[list[object]]:
    """The header and one row per spider; ``-`` where a figure could not be read."""
    def shown(value: object) -> object:
        return "-" if value is None else value

    rows: list[list[object]] = [[
        "spider", "start urls", "start leased", "queue", "leased", "pages", "items",
        "filtered", "filter items", "fill", "est. FP rate", "slices", "memory"]]
    for s in spiders:
        info = s.filter
        rows.append([
            s.spider, shown(s.start_urls), shown(s.start_urls_leased), shown(s.queue_length),
            shown(s.leased), shown(s.stats.get("pages")), shown(s.stats.get("items")),
            shown(s.stats.get("filtered")),
            info.items if info else "-", percent(info.fill_ratio if info else None),
            f"{info.estimated_false_positive_rate:.2g}" if info else "-",
            info.slices if info else "-",
            "%.1f MiB" % (info.memory_bytes / 2**20) if info else "-",
        ])
    return rows


# --- the commands -----------------------------------------------------------------


def cmd_status(args: argparse.Namespace, paths: Paths) -> int:
    options = TargetOptions.from_args(args)
    target = resolve_target(paths, options, need_nodes=False, need_redis=True)
    if not target.nodes:
        # the recorded cluster's nodes, and those of other hosts listed in Redis
        with contextlib.suppress(OpsError):
            target = resolve_target(paths, options, need_nodes=True, quiet=True)
    return status(target)


def cmd_filter_info(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False,
                            need_redis=True)
    name = args.filter or keys.spider_key(defaults.FILTER_KEY, args.spider)
    state = inspection.spider_state(target.redis(), keys.meta_key(name))
    if state is None or state.filter is None:
        raise OpsError(f"no Bloom filter {name!r} in Redis")
    info = dict(state.filter.__dict__)
    info["name"] = name
    say(json.dumps(info, indent=2, sort_keys=True))
    return 0
