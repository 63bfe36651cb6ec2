"""``bench/crawl.py --profile DIR``: each worker's CPU by function, under cProfile.

Worker side, :class:`Profiler` (a Scrapy extension, enabled by the
``BENCH_PROFILE_PREFIX`` setting): the reactor thread is profiled from its
first response to ``spider_closed`` (start-up and shut-down left out, as the
probe's CPU time leaves them out); every thread started after the crawler
was built (bloomcrawl's Redis I/O thread, the reactor's thread pool) is
profiled for its whole life under a profiler of its own (cProfile sees one
thread). When the process exits (every thread joined) each thread's
profile goes to ``<prefix>.<thread>.pstats``.

The timer is cProfile's own (wall clock, about 50 ns a call here: a CPU
clock costs 15 times that and would swamp what it measures). So the time a
thread spends *waiting* (the reactor in ``epoll.poll``, the I/O thread on
its queue's lock or on Redis's reply) shows up as the own time of those few
built-ins: :data:`WAITS` names them, and the report counts them apart.

Bench side, :func:`report`: for each contender run, every worker's threads
added up, per page: own time by package (bloomcrawl, Scrapy, Twisted,
redis-py, the rest), then the functions with the most own time, the
bloomcrawl and Scrapy functions with the most cumulative time, and the
functions where bloomcrawl spends more than the in-memory scheduler's run.
Profiling slows the workers down (about 1.5-2x): compare the profiles'
shares, not their absolute figures with the unprofiled rows.
"""

from __future__ import annotations

import atexit
import cProfile
import json
import pstats
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

SETTING = "BENCH_PROFILE_PREFIX"
EXTENSION = "crawlbench.profile.Profiler"
#: the EXTENSIONS of crawlbench.settings, for contenders that do not set their own
DEFAULT_EXTENSIONS = {"crawlbench.probe.Probe": 0}
#: built-ins whose own time is a thread waiting, not working (cProfile's clock is wall time)
WAITS = frozenset({
    "<method 'poll' of 'select.epoll' objects>",
    "<method 'poll' of 'select.poll' objects>",
    "<built-in method select.select>",
    "<method 'acquire' of '_thread.lock' objects>",
    "<method 'acquire' of '_thread.RLock' objects>",
    "<method 'recv_into' of '_socket.socket' objects>",
    "<method 'recv' of '_socket.socket' objects>",
    "<built-in method time.sleep>",
})
PACKAGES = (("bloomcrawl", "/bloomcrawl/"), ("crawlbench", "/crawlbench/"),
            ("scrapy-redis", "/scrapy_redis"), ("scrapy", "/scrapy/"),
            ("twisted", "/twisted/"), ("redis-py", "/redis/"))
TOP = 15
#: the packages whose functions the cumulative top lists
CUMULATIVE_OF = frozenset({"bloomcrawl", "scrapy"})


# -- worker side -----------------------------------------------------------------------------


class Profiler:
    """cProfile over the reactor thread's crawl and every thread started after it was built."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.main = cProfile.Profile()
        self.main_on = False
        self.main_done = False
        self.threads: list[tuple[str, cProfile.Profile]] = []
        self._lock = threading.Lock()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Profiler:
        prefix = crawler.settings.get(SETTING)
        if not prefix:
            raise NotConfigured("%s is not set" % SETTING)
        profiler = cls(prefix)
        profiler.profile_new_threads()
        crawler.signals.connect(profiler.response_received, signal=signals.response_received)
        crawler.signals.connect(profiler.spider_closed, signal=signals.spider_closed)
        atexit.register(profiler.dump)
        return profiler

    def profile_new_threads(self) -> None:
        run = threading.Thread.run
        threads = self.threads
        lock = self._lock

        def profiled_run(thread: threading.Thread) -> None:
            profile = cProfile.Profile()
            profile.enable()
            try:
                run(thread)
            finally:
                profile.disable()
                with lock:
                    threads.append((thread.name, profile))

        threading.Thread.run = profiled_run  # type: ignore[method-assign]

    def response_received(self, **kwargs: Any) -> None:
        if not self.main_on and not self.main_done:
            self.main.enable()
            self.main_on = True

    def spider_closed(self, **kwargs: Any) -> None:
        if self.main_on:
            self.main.disable()
            self.main_on = False
        self.main_done = True

    def dump(self) -> None:
        """Each thread's profile to a file; threads of one name (a pool's) added up."""
        if self.main_on:
            self.main.disable()
        by_name: dict[str, list[cProfile.Profile]] = defaultdict(list)
        by_name["main"].append(self.main)
        with self._lock:
            for name, profile in self.threads:
                by_name[thread_label(name)].append(profile)
        for label, profiles in by_name.items():
            try:
                stats = pstats.Stats(profiles[0])
            except TypeError:  # nothing was recorded
                continue
            for profile in profiles[1:]:
                try:
                    stats.add(profile)
                except TypeError:
                    pass
            stats.dump_stats("%s.%s.pstats" % (self.prefix, label))


def thread_label(name: str) -> str:
    """A file-name-safe label for a thread; a pool's threads share one."""
    name = re.sub(r"[-_ ]?\d+$", "", name)
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "thread"


# -- bench side ------------------------------------------------------------------------------


def worker_settings(contender_settings: dict[str, str], settings: dict[str, str],
                    directory: Path) -> dict[str, str]:
    """``settings`` plus what makes each worker of this contender write its profiles.

    The profiler joins the contender's own EXTENSIONS (or crawlbench's), which
    a plain ``-s EXTENSIONS=`` would replace.
    """
    extensions = json.loads(contender_settings.get("EXTENSIONS")
                            or settings.get("EXTENSIONS")
                            or json.dumps(DEFAULT_EXTENSIONS))
    extensions[EXTENSION] = 0
    return {**settings, "EXTENSIONS": json.dumps(extensions),
            SETTING: str(directory.resolve() / "{worker}")}


def prepare(directory: Path) -> None:
    """An empty profile directory: no profile of an earlier run is added to this one's."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.glob("*.pstats"):
        path.unlink()


FuncKey = tuple[str, int, str]


@dataclass
class RunProfile:
    """Every worker thread's profile of one run, added up."""

    label: str
    pages: int
    stats: pstats.Stats
    #: thread label -> own time of everything but the waits (s)
    threads: dict[str, float]

    @property
    def entries(self) -> dict[FuncKey, tuple[int, int, float, float, Any]]:
        return self.stats.stats  # type: ignore[attr-defined, no-any-return]

    def per_page_us(self, seconds: float) -> float:
        return seconds / self.pages * 1e6 if self.pages else float("nan")


def load(directory: Path, worker_prefix: str, label: str, pages: int) -> RunProfile | None:
    """The profiles the workers named ``<worker_prefix>*`` wrote, or None."""
    files = sorted(directory.glob("%s*.pstats" % worker_prefix))
    if not files:
        return None
    stats = pstats.Stats(str(files[0]))
    for path in files[1:]:
        stats.add(str(path))
    threads: dict[str, float] = defaultdict(float)
    for path in files:
        thread = path.name[:-len(".pstats")].rsplit(".", 1)[-1]
        one = pstats.Stats(str(path))
        threads[thread] += sum(tt for key, (_, _, tt, _, _) in one.stats.items()  # type: ignore[attr-defined]
                               if not is_wait(key))
    return RunProfile(label, pages, stats, dict(threads))


def is_wait(key: FuncKey) -> bool:
    return key[0] == "~" and key[2] in WAITS


def package(key: FuncKey) -> str:
    filename = key[0]
    if filename == "~":
        return "built-ins"
    for name, marker in PACKAGES:
        if marker in filename:
            return name
    return "stdlib+other"


def describe(key: FuncKey) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    path = filename
    for marker in ("/bloomcrawl/", "/scrapy/", "/twisted/", "/redis/", "/scrapy_redis/",
                   "/lib/python3"):
        at = filename.rfind(marker)
        if at >= 0:
            path = filename[at + 1:]
            break
    return "%s:%d(%s)" % (path, line, name)


def own_by_package(run: RunProfile) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for key, (_, _, tt, _, _) in run.entries.items():
        totals["waiting" if is_wait(key) else package(key)] += tt
    return dict(totals)


def top(run: RunProfile, column: int, keep: Callable[[FuncKey], bool],
        count: int = TOP) -> list[tuple[FuncKey, int, float]]:
    """(function, calls, seconds) with the most of ``column`` (2: own, 3: cumulative)."""
    rows = [(key, entry[1], entry[column]) for key, entry in run.entries.items()
            if keep(key) and not is_wait(key)]
    rows.sort(key=lambda row: -row[2])
    return rows[:count]


def report(runs: Iterable[RunProfile], baseline: RunProfile | None) -> None:
    """Print each run's profile, and where bloomcrawl spends more than ``baseline``."""
    runs = list(runs)
    if not runs:
        print("no profile was written (did the workers get a response?)")
        return
    print("worker CPU profile (cProfile, wall clock per thread; %s: waits, counted apart);"
          " us per page" % ", ".join(sorted(w.split("'")[1] if "'" in w else w for w in WAITS)))
    names = ["bloomcrawl", "scrapy", "twisted", "redis-py", "built-ins", "stdlib+other",
             "crawlbench", "scrapy-redis"]
    print("  %-34s %8s %8s  %s" % ("run", "pages", "work", "  ".join(
        "%12s" % n for n in names)))
    for run in runs:
        totals = own_by_package(run)
        work = sum(v for k, v in totals.items() if k != "waiting")
        print("  %-34s %8d %8.0f  %s" % (run.label, run.pages, run.per_page_us(work), "  ".join(
            "%12.0f" % run.per_page_us(totals.get(n, 0.0)) for n in names)))
        print("  %-34s %8s %8s  threads: %s" % ("", "", "", ", ".join(
            "%s %.0f" % (t, run.per_page_us(s)) for t, s in sorted(run.threads.items()))))
    for run in runs:
        print()
        print("  %s: own time, top %d (us/page, calls/page)" % (run.label, TOP))
        for key, calls, seconds in top(run, 2, lambda _: True):
            print("    %8.1f %8.2f  %s" % (run.per_page_us(seconds), calls / run.pages,
                                          describe(key)))
        print("  %s: cumulative, bloomcrawl's and Scrapy's functions, top %d" % (
            run.label, TOP))
        for key, calls, seconds in top(run, 3, lambda k: package(k) in CUMULATIVE_OF):
            print("    %8.1f %8.2f  %s" % (run.per_page_us(seconds), calls / run.pages,
                                          describe(key)))
    if baseline is None:
        return
    for run in runs:
        if run is baseline:
            continue
        print()
        print("  %s over %s: own time per page, the %d largest differences (us/page)" % (
            run.label, baseline.label, TOP))
        diffs = []
        base = baseline.entries
        for key, entry in run.entries.items():
            if is_wait(key):
                continue
            other = base.get(key)
            mine_us = run.per_page_us(entry[2])
            base_us = baseline.per_page_us(other[2]) if other else 0.0
            diffs.append((mine_us - base_us, mine_us, base_us, key))
        diffs.sort(key=lambda row: -row[0])
        for diff, mine_us, base_us, key in diffs[:TOP]:
            print("    %+8.1f  (%7.1f vs %7.1f)  %s" % (diff, mine_us, base_us, describe(key)))
