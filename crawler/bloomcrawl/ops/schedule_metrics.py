"""What one scrape reports of the recurring crawls: each schedule and its last runs.

:func:`read` takes the schedules (:class:`~bloomcrawl.ops.schedules.ScheduleStore`)
and the recent runs (:class:`~bloomcrawl.ops.runs.RunStore`) out of Redis;
:func:`families` turns them, and now by Redis's clock (``TIME``, the clock the
timers fire by), into fresh metric families. The exporter calls both inside its
Redis read, so Redis down is ``bloomcrawl_up 0`` for these as for the rest. All
their keys share one hash tag each: on Redis Cluster each read is one slot.

Labels stay bounded: ``schedule`` (a name of at most 64 characters, one per
schedule), ``spider``, ``result`` (:data:`RESULTS`), ``ago`` (``0`` for a
schedule's latest run .. ``4``, :data:`RUNS_PER_SCHEDULE`) and ``reason``
(:data:`FINISH_REASONS`, anything else as ``other``). A run id is never a label:
it is the schedule and its slot, so every firing would make new series.

``bloomcrawl_schedule_overdue_seconds`` is the missed-firing signal: how long
ago the first slot after the last one claimed came, while the schedule is not
paused (0 until it comes). A timer
claims a due slot within its interval (1 s), so a slot that waits minutes means
no timer is running, or every timer fails (their logs say why).
``bloomcrawl_schedule_last_outcome{result="under_way"}`` is a slot claimed whose
outcome was not recorded yet: for seconds while its jobs start, for good when the
timer died in between (a slot is fired at most once, never twice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.runs import RECENT_KEY, RUNNING, Run, RunStore
from bloomcrawl.ops.schedules import NAMES_KEY, Schedule, ScheduleStore

#: a schedule's last firing: what its outcome's ``result`` says, or ``under_way``
RESULTS = ("started", "partly_started", "skipped", "failed", "under_way")
#: runs reported per schedule, the newest first (``ago`` 0..4)
RUNS_PER_SCHEDULE = 5
#: the finish reasons a run's jobs are counted by; any other is ``other``. Scrapy's own
#: (its CloseSpider extension's included), the frontier's, and those of
#: :func:`bloomcrawl.ops.runs.check_run` (``unknown``: no log line; ``lost``: the node
#: forgot the job; ``unreachable``: the node did not answer for the run's give-up time)
FINISH_REASONS = ("finished", "shutdown", "cancelled", "closespider_timeout",
                  "closespider_timeout_no_item", "closespider_itemcount",
                  "closespider_pagecount", "closespider_pagecount_no_item",
                  "closespider_errorcount", "bloomfilter_full", "unknown", "lost",
                  "unreachable", "other")
#: a read problem as the exporter logs it: key -> the line
Problems = dict[str, str]
_DATA_ERRORS = (ValueError, KeyError, TypeError, AttributeError)


@dataclass
class Recurring:
    """The schedules and recent runs one scrape read, and now by Redis's clock."""

    now: float
    schedules: list[Schedule] = field(default_factory=list)
    #: the newest first, as :meth:`RunStore.recent` gives them
    runs: list[Run] = field(default_factory=list)
    #: schedules and runs whose hash could not be read (left out): key -> why
    problems: Problems = field(default_factory=dict)


def read(client: redis.Redis, now: float) -> Recurring:
    """Every schedule and the recent runs; ``now``: Redis ``TIME`` in seconds.

    Raises what Redis raised. A malformed hash is left out and named in
    ``problems``; the others are still read.
    """
    out = Recurring(now)
    schedules = ScheduleStore(client)
    try:
        out.schedules = schedules.all()
    except _DATA_ERRORS:  # one at a time, to know which
        for name in sorted(n.decode() for n in client.smembers(NAMES_KEY)):  # type: ignore[union-attr]
            try:
                out.schedules.append(schedules.get(name))
            except OpsError:  # removed meanwhile
                continue
            except _DATA_ERRORS as exc:
                out.problems["schedule %s" % name] = (
                    "schedule %s: its hash cannot be read (%s: %s); left out of the"
                    " bloomcrawl_schedule_* metrics" % (name, type(exc).__name__, exc))
    runs = RunStore(client)
    try:
        out.runs = runs.recent()
    except _DATA_ERRORS:
        for run_id in (r.decode() for r in client.lrange(RECENT_KEY, 0, -1)):  # type: ignore[union-attr]
            try:
                run = runs.get(run_id)
            except _DATA_ERRORS as exc:
                out.problems["run %s" % run_id] = (
                    "run %s: its hash cannot be read (%s: %s); left out of the"
                    " bloomcrawl_run_* metrics" % (run_id, type(exc).__name__, exc))
            else:
                if run is not None:
                    out.runs.append(run)
    return out


def last_result(schedule: Schedule) -> str | None:
    """One of :data:`RESULTS` for the schedule's last firing; None: never fired.

    The claimed slot's firing is ``under_way`` until an outcome for it (or a later
    run by hand) is recorded.
    """
    outcome = schedule.outcome
    if schedule.last_slot is not None:
        recorded = outcome is not None and (
            float(outcome.get("fired_at") or 0) >= (schedule.claimed_at or 0)
            if outcome.get("manual") else float(outcome.get("slot") or 0) >= schedule.last_slot)
        if not recorded:
            return "under_way"
    if outcome is None:
        return None
    return str(outcome.get("result", "")).replace(" ", "_")


def first_unclaimed_slot(schedule: Schedule) -> float:
    """The first slot after the last one claimed (the schedule's first, before any)."""
    if schedule.last_slot is None:
        return schedule.next_slot(schedule.created - 1)
    # 1 ms on: (last - created) / every may round just below a whole number of slots
    return schedule.next_slot(schedule.last_slot + 1e-3)


def overdue_seconds(schedule: Schedule, now: float) -> float:
    """Since when a slot has waited unclaimed: ``now`` - the first slot after the last one
    claimed, once it has come; 0 when paused or none waits.

    From the first slot missed, not the latest one due: with no timer running, it grows
    whatever the interval. Just after a resume it counts the slots missed while paused,
    until a timer fires the latest (within its interval).
    """
    if schedule.paused:
        return 0.0
    return max(0.0, now - first_unclaimed_slot(schedule))


def next_fire(schedule: Schedule, now: float) -> float | None:
    """The slot a timer fires next: the latest slot due while it is unclaimed (then in the
    past: the firing is late), else the first slot after now; None when paused."""
    if schedule.paused:
        return None
    if overdue_seconds(schedule, now) > 0:
        return schedule.due_slot(now)
    return schedule.next_slot(now)


# name, help, value of a schedule (None: no sample); labelled by schedule and spider
_ScheduleValue = Callable[[Schedule, float], float | None]
_SCHEDULE_GAUGES: tuple[tuple[str, str, _ScheduleValue], ...] = (
    ("bloomcrawl_schedule_paused", "1 when the schedule is paused (no slot of it fires).",
     lambda s, now: 1 if s.paused else 0),
    ("bloomcrawl_schedule_interval_seconds",
     "Seconds between two slots of an --every schedule (a --cron schedule has none).",
     lambda s, now: s.spec.every),
    ("bloomcrawl_schedule_last_fire_timestamp_seconds",
     "When a timer claimed the schedule's last slot (Unix time, Redis clock); none before"
     " its first firing.", lambda s, now: s.claimed_at),
    ("bloomcrawl_schedule_last_slot_timestamp_seconds",
     "The schedule's last slot claimed (Unix time).", lambda s, now: s.last_slot),
    ("bloomcrawl_schedule_next_fire_timestamp_seconds",
     "The slot a timer fires next (Unix time): the first slot after now, or the due slot"
     " while it waits unclaimed (then in the past); none while the schedule is paused.",
     next_fire),
    ("bloomcrawl_schedule_overdue_seconds",
     "Seconds since the first slot after the last one claimed, once it has come, while the"
     " schedule is not paused; 0 when none waits. A timer claims a due slot within a"
     " second: minutes mean no timer runs, or every timer fails.", overdue_seconds),
)
# name, help, value of a run; labelled by schedule, spider and ago
_RunValue = Callable[[Run, float], float | None]
_RUN_GAUGES: tuple[tuple[str, str, _RunValue], ...] = (
    ("bloomcrawl_run_running", "1 while the run has a job pending or running, else 0.",
     lambda r, now: 1 if r.status == RUNNING else 0),
    ("bloomcrawl_run_start_timestamp_seconds",
     "When the run started (Unix time, Redis clock).", lambda r, now: r.started),
    ("bloomcrawl_run_slot_timestamp_seconds",
     "The schedule's slot the run was fired for (Unix time; the time it was started by"
     " hand, for `bloomcrawl schedules run-now`).", lambda r, now: r.slot),
    ("bloomcrawl_run_end_timestamp_seconds",
     "When the timer saw the run's last job end (Unix time); none while it runs.",
     lambda r, now: r.finished),
    ("bloomcrawl_run_duration_seconds",
     "Seconds from the run's start to its end, or to now while it runs.",
     lambda r, now: r.duration if r.duration is not None else max(0.0, now - r.started)),
    ("bloomcrawl_run_jobs", "scrapyd jobs the run started (one per node that accepted).",
     lambda r, now: len(r.jobs)),
    ("bloomcrawl_run_refused_nodes", "scrapyd nodes that refused the run's job.",
     lambda r, now: len(r.refused)),
    ("bloomcrawl_run_pages",
     "Pages the run crawled: growth of the spider's shared stats since it started (as of"
     " the timer's last look at it while it runs).", lambda r, now: r.counters["pages"]),
    ("bloomcrawl_run_new_requests",
     "Requests the run queued that the filter did not hold: never queued, or forgotten"
     " more than a generation before.", lambda r, now: r.counters["new"]),
    ("bloomcrawl_run_revisited_requests",
     "Requests the run queued again after their revisit window.",
     lambda r, now: r.counters["revisited"]),
    ("bloomcrawl_run_items", "Items the run scraped.", lambda r, now: r.counters["items"]),
    ("bloomcrawl_run_errors", "Requests of the run that ended in an error.",
     lambda r, now: r.counters["errors"]),
    ("bloomcrawl_run_requests_filtered",
     "Requests the run's scheduler dropped as already seen.",
     lambda r, now: r.counters["filtered"]),
    ("bloomcrawl_run_leases_requeued",
     "Expired leases put back into the queue during the run.",
     lambda r, now: r.counters["requeued"]),
)


def _labels(schedule: Schedule) -> list[str]:
    return [schedule.name, schedule.spec.spider]


def schedule_families(schedules: list[Schedule], now: float) -> list[Metric]:
    """Each schedule's state, its last and next fire, its firings and its last outcome."""
    count = GaugeMetricFamily("bloomcrawl_schedules", "Recurring crawls (schedules) in Redis.",
                              value=len(schedules))
    out: list[Metric] = [count]
    for name, doc, schedule_value in _SCHEDULE_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["schedule", "spider"])
        for schedule in schedules:
            value = schedule_value(schedule, now)
            if value is not None:
                gauge.add_metric(_labels(schedule), value)
        out.append(gauge)
    firings = CounterMetricFamily(
        "bloomcrawl_schedule_firings_total",
        "Firings of the schedule whose outcome was recorded (by its timers, or run by hand).",
        labels=["schedule", "spider"])
    outcome = GaugeMetricFamily(
        "bloomcrawl_schedule_last_outcome",
        "1 for the result of the schedule's last firing, 0 for the others: started,"
        " partly_started (a node refused), skipped (its previous run still runs), failed,"
        " under_way (its slot claimed, no outcome yet; for good if its timer died); all 0"
        " before the first firing.", labels=["schedule", "spider", "result"])
    for schedule in schedules:
        firings.add_metric(_labels(schedule), schedule.fired)
        last = last_result(schedule)
        for result in RESULTS:
            outcome.add_metric([*_labels(schedule), result], 1 if result == last else 0)
    return [*out, firings, outcome]


def run_families(runs: list[Run], now: float) -> list[Metric]:
    """The :data:`RUNS_PER_SCHEDULE` newest runs of each schedule, by ``ago``."""
    latest: list[tuple[list[str], Run]] = []
    per_schedule: dict[str, int] = {}
    for run in runs:  # the newest first
        ago = per_schedule.get(run.schedule, 0)
        if ago < RUNS_PER_SCHEDULE:
            per_schedule[run.schedule] = ago + 1
            latest.append(([run.schedule, run.spider, str(ago)], run))
    out: list[Metric] = []
    for name, doc, run_value in _RUN_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["schedule", "spider", "ago"])
        for labels, run in latest:
            value = run_value(run, now)
            if value is not None:
                gauge.add_metric(labels, value)
        out.append(gauge)
    reasons = GaugeMetricFamily(
        "bloomcrawl_run_finished_jobs",
        "Jobs of the finished run by the reason their log gives (Spider closed (reason)):"
        " Scrapy's, unknown (no such line), lost (the node forgot the job), or other.",
        labels=["schedule", "spider", "ago", "reason"])
    for labels, run in latest:
        if run.status == RUNNING:
            continue
        counted = dict.fromkeys(FINISH_REASONS, 0)
        for reason in run.reasons.values():
            counted[reason if reason in counted else "other"] += 1
        for reason, jobs in counted.items():
            if jobs:
                reasons.add_metric([*labels, reason], jobs)
    return [*out, reasons]


def families(recurring: Recurring) -> list[Metric]:
    """Every ``bloomcrawl_schedule*`` and ``bloomcrawl_run_*`` family of one scrape."""
    errors = GaugeMetricFamily(
        "bloomcrawl_recurring_read_errors",
        "Schedules and runs whose Redis hash this scrape could not read (left out; the"
        " exporter's log names them); 0 when all were read.", value=len(recurring.problems))
    return [*schedule_families(recurring.schedules, recurring.now),
            *run_families(recurring.runs, recurring.now), errors]

