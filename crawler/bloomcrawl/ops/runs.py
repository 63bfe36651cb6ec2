"""Runs: each firing of a schedule, with its own counters and how it ended.

A run starts when a timer fires a schedule (or ``bloomcrawl schedules run-now``):
one scrapyd job per node, all under the run's id as the crawl id
(``FRONTIER_CRAWL_ID``), so every run fetches its start URLs once. The
spider's shared stats (``<spider>:stats``, exact across workers) are read at
the start and again at the end; the run's counters are the difference. A
schedule never starts a run while its previous run still has a job pending
or running (the firing is recorded as skipped), so two runs of one schedule
never share those counters.

A run ends when none of its jobs is pending or running, and every job's node
answered; its finish reason is what each job's log says
(``Spider closed (finished)``), one reason per job.

Keys (one hash tag):

``{bloomcrawl:runs}:recent``   list  run ids, newest first, at most :data:`KEEP_RUNS`
``{bloomcrawl:runs}:r:<id>``   hash  the run (:class:`Run`'s fields; dicts as JSON)
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.schedules import redis_time

TAG = "{bloomcrawl:runs}"
RECENT_KEY = TAG + ":recent"
#: runs kept; older ones are deleted as new ones start
KEEP_RUNS = 50
RUNNING, FINISHED = "running", "finished"
#: the counters a run reports: "new" and "revisited" split the requests the filter
#: queued (a revisit is a URL queued again after its revisit window), the others are
#: the spider's shared stats of the same name
COUNTERS = ("pages", "new", "revisited", "items", "errors", "filtered", "requeued")
CLOSED_RE = re.compile(r"Spider closed \(([^)]*)\)")
#: the fields of a :class:`Run` its hash holds as JSON
_DICT_FIELDS = ("jobs", "refused", "stats_start", "stats_end", "reasons", "unreachable")
#: how long a run waits for a job whose node does not answer (a node gone for good)
UNREACHABLE_GIVE_UP_S = 900.0


def run_key(run_id: str) -> str:
    return "%s:r:%s" % (TAG, run_id)


def run_id_for(schedule: str, slot: float, manual: bool = False) -> str:
    """``<schedule>-<slot in UTC>``, e.g. ``news-20261202T060000Z`` (``-now-`` when run by hand)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(slot))
    return "%s-%s%s" % (schedule, "now-" if manual else "", stamp)


@dataclass
class Run:
    id: str
    schedule: str
    spider: str
    project: str
    slot: float
    started: float
    status: str = RUNNING
    #: {node URL: job id} of the jobs started, {node URL: why} of the nodes that refused
    jobs: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    stats_start: dict[str, int] = field(default_factory=dict)
    stats_end: dict[str, int] = field(default_factory=dict)
    finished: float | None = None
    #: {job id: the reason its log gives (``finished``, ``shutdown``, ...) or ``unknown``}
    reasons: dict[str, str] = field(default_factory=dict)
    #: {job id: since when (Redis TIME) its node has not answered}
    unreachable: dict[str, float] = field(default_factory=dict)

    @property
    def counters(self) -> dict[str, int]:
        """What the run counted: the shared stats' growth from its start (to now, if running)."""
        end = self.stats_end

        def growth(name: str) -> int:
            return max(0, end.get(name, 0) - self.stats_start.get(name, 0))

        counts = {name: growth(name) for name in COUNTERS}
        counts["new"] = max(0, growth("queued") - counts["revisited"])
        return counts

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started

    @property
    def finish_reason(self) -> str:
        """The jobs' reason when they agree, else each distinct one (``finished,shutdown``)."""
        if self.status != FINISHED:
            return ""
        return ",".join(sorted(set(self.reasons.values()))) or "no jobs"

    def to_hash(self) -> dict[Any, str]:
        out: dict[Any, str] = {}
        for name, value in asdict(self).items():
            out[name] = (json.dumps(value, sort_keys=True) if isinstance(value, dict)
                         else "" if value is None else str(value))
        return out

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> Run:
        data = {k.decode(): v.decode() for k, v in raw.items()}
        kwargs: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            if name not in data:
                continue
            value = data[name]
            if name in _DICT_FIELDS:
                kwargs[name] = json.loads(value) if value else {}
            elif name in ("slot", "started"):
                kwargs[name] = float(value)
            elif name == "finished":
                kwargs[name] = float(value) if value else None
            else:
                kwargs[name] = value
        return cls(**kwargs)


def shared_stats(client: redis.Redis, spider: str) -> dict[str, int]:
    raw: dict[bytes, bytes] = client.hgetall(  # type: ignore[assignment]
        keys.spider_key(defaults.STATS_KEY, spider))
    out = {}
    for name, value in raw.items():
        try:
            out[name.decode()] = int(value)
        except ValueError:
            continue
    return out


class RunStore:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def start(self, run: Run) -> None:
        """Record a new run; the oldest beyond :data:`KEEP_RUNS` are deleted."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(run_key(run.id), mapping=run.to_hash())
        pipe.lrem(RECENT_KEY, 0, run.id)
        pipe.lpush(RECENT_KEY, run.id)
        pipe.lrange(RECENT_KEY, KEEP_RUNS, -1)
        pipe.ltrim(RECENT_KEY, 0, KEEP_RUNS - 1)
        *_, dropped, _ = pipe.execute()
        if dropped:
            self.client.delete(*(run_key(r.decode()) for r in dropped))

    def save(self, run: Run) -> None:
        if self.client.exists(run_key(run.id)):  # not re-created once trimmed away
            self.client.hset(run_key(run.id), mapping=run.to_hash())

    def get(self, run_id: str) -> Run | None:
        raw: dict[bytes, bytes] = self.client.hgetall(run_key(run_id))  # type: ignore[assignment]
        return Run.from_hash(raw) if raw else None

    def recent(self, limit: int = KEEP_RUNS, *, schedule: str | None = None) -> list[Run]:
        """The newest runs first (of ``schedule`` only, if given)."""
        ids = [r.decode() for r in self.client.lrange(RECENT_KEY, 0, KEEP_RUNS - 1)]  # type: ignore[union-attr]
        pipe = self.client.pipeline(transaction=False)
        for run_id in ids:
            pipe.hgetall(run_key(run_id))
        runs = [Run.from_hash(raw) for raw in pipe.execute() if raw]
        if schedule is not None:
            runs = [r for r in runs if r.schedule == schedule]
        return runs[:limit]

    def latest(self, schedule: str) -> Run | None:
        found = self.recent(1, schedule=schedule)
        return found[0] if found else None


def finish_reason(node: scrapyd.Node, log_url: str | None) -> str:
    """The reason in a job's ``Spider closed (...)`` log line, or ``unknown``."""
    if not log_url:
        return "unknown"
    try:
        tail = node.log_tail(log_url)
    except scrapyd.ScrapydError:
        return "unknown"
    found = CLOSED_RE.findall(tail)
    return found[-1] if found else "unknown"


def check_run(client: redis.Redis, store: RunStore, run: Run,
              nodes: Sequence[scrapyd.Node], give_up_s: float = UNREACHABLE_GIVE_UP_S) -> bool:
    """Whether ``run`` is over; if it is, it is finished and saved. Else its counters so far
    are saved. A job whose node has not answered for ``give_up_s`` (Redis's clock) ends
    the run's wait for it, with the reason ``unreachable``."""
    found = scrapyd.job_entries(nodes, run.project, run.jobs)
    run.stats_end = shared_stats(client, run.spider)
    now = redis_time(client)
    for job, (state, _) in found.items():
        if state == "unreachable":
            run.unreachable.setdefault(job, now)
        else:
            run.unreachable.pop(job, None)
    # a node that does not answer may come back: its job is waited for, up to give_up_s
    if any(state in ("pending", "running")
           or (state == "unreachable" and now - run.unreachable[job] < give_up_s)
           for job, (state, _) in found.items()):
        store.save(run)
        return False
    by_url = {node.url: node for node in nodes}
    for url, job in run.jobs.items():
        state, entry = found[job]
        run.reasons[job] = (finish_reason(by_url[url], entry.get("log_url"))
                            if state == "finished" else state if state == "unreachable"
                            else "lost")
    run.finished = now
    run.status = FINISHED
    store.save(run)
    return True
