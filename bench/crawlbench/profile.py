"""``bench/crawl.py``: where a worker's CPU goes, per thread and (``--profile DIR``) per function.

Always, :class:`ThreadCpu` (a Scrapy extension, enabled by the
``BENCH_THREADS_FILE`` setting) splits each worker's CPU time between its
reactor thread and the others (bloomcrawl's Redis I/O thread) from
``/proc/self/task``, and counts the garbage collector's runs and their CPU
(:class:`GcClock`); and :func:`print_worker_cpu` prints bloomcrawl's worker
CPU per page beside the in-memory scheduler's with the floor of this design:
the in-memory scheduler's CPU, plus what the Redis I/O thread spent, plus the
request codec (each new request serialized, each leased one rebuilt),
measured here.

With ``--profile DIR``, cProfile per function, as follows.

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
import gc
import json
import os
import pstats
import re
import resource
import threading
import time
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
THREADS_SETTING = "BENCH_THREADS_FILE"
THREADS_EXTENSION = "crawlbench.profile.ThreadCpu"
#: ThreadCpu reads the threads' CPU times every this many responses
THREADS_EVERY = 20
#: issue 20: worker CPU per page at most this many times the in-memory scheduler's
WORKER_CPU_TARGET = 1.05
#: issue 20: pages/s per process at least this share of the in-memory ceiling
CEILING_TARGET = 0.95
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


def thread_cpu_times() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    times = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path("/proc/self/task/%s/stat" % tid).read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        times[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return times


class GcClock:
    """The cyclic garbage collector's runs in this process and the CPU they took (the
    collecting thread's, from ``gc.callbacks``)."""

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.collections += 1
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started

    def reading(self) -> tuple[int, float]:
        return self.collections, self.seconds


class ThreadCpu:
    """The reactor thread's and the other threads' CPU time, from the first response on,
    and the garbage collector's share of it (:class:`GcClock`).

    Read every :data:`THREADS_EVERY` responses; the last reading before the
    spider closed is written (JSON) to ``BENCH_THREADS_FILE``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.responses = 0
        self.first: dict[int, float] | None = None
        self.last: tuple[int, dict[int, float]] | None = None
        self.gc = GcClock()
        self.gc_first = self.gc_last = (0, 0.0)
        #: at every reading: responses, the process's CPU s, its voluntary and
        #: involuntary context switches, and its system CPU s (the middle of the crawl,
        #: apart from its ends)
        self.samples: list[tuple[int, float, int, int, float]] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ThreadCpu:
        path = crawler.settings.get(THREADS_SETTING)
        if not path:
            raise NotConfigured("%s is not set" % THREADS_SETTING)
        probe = cls(Path(path))
        crawler.signals.connect(probe.response_received, signal=signals.response_received)
        crawler.signals.connect(probe.spider_closed, signal=signals.spider_closed)
        return probe

    def response_received(self, **kwargs: Any) -> None:
        self.responses += 1
        if self.first is None:
            self.first = thread_cpu_times()
            self.gc_first = self.gc.reading()
        elif self.responses % THREADS_EVERY == 0:
            self.last = (self.responses, thread_cpu_times())
            self.gc_last = self.gc.reading()
        else:
            return
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.samples.append((self.responses, usage.ru_utime + usage.ru_stime, usage.ru_nvcsw,
                             usage.ru_nivcsw, usage.ru_stime))

    def spider_closed(self, **kwargs: Any) -> None:
        if self.first is None or self.last is None:
            return
        responses, last = self.last
        main = threading.main_thread().native_id
        spent = {tid: cpu - self.first.get(tid, 0.0) for tid, cpu in last.items()}
        self.path.write_text(json.dumps({
            "responses": responses - 1,  # the first reading was at the first response
            "main_s": spent.get(main, 0.0),
            "other_s": sum(cpu for tid, cpu in spent.items() if tid != main),
            "gc_collections": self.gc_last[0] - self.gc_first[0],
            "gc_s": self.gc_last[1] - self.gc_first[1],
            "samples": self.samples,
        }))


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
                    threads_dir: Path, profile_dir: Path | None = None) -> dict[str, str]:
    """``settings`` plus what makes each worker write its threads' CPU (and its profiles).

    The extensions join the contender's own EXTENSIONS (or crawlbench's),
    which a plain ``-s EXTENSIONS=`` would replace.
    """
    extensions = json.loads(contender_settings.get("EXTENSIONS")
                            or settings.get("EXTENSIONS")
                            or json.dumps(DEFAULT_EXTENSIONS))
    extensions[THREADS_EXTENSION] = 0
    threads_dir.mkdir(parents=True, exist_ok=True)
    extra = {THREADS_SETTING: str(threads_dir.resolve() / "{worker}.json")}
    if profile_dir is not None:
        extensions[EXTENSION] = 0
        extra[SETTING] = str(profile_dir.resolve() / "{worker}")
    return {**settings, **extra, "EXTENSIONS": json.dumps(extensions)}


#: no middle half of a crawl: too few readings
NO_MIDDLE = (0, 0.0, 0, 0, 0.0)


@dataclass(frozen=True)
class WorkerCpu:
    """One run's worker CPU, split between the reactor threads and the others."""

    #: the others' (the Redis I/O thread's) share of the workers' CPU
    other_share: float
    #: responses the readings span, and the garbage collections and their CPU in them
    responses: int = 0
    gc_collections: int = 0
    gc_s: float = 0.0
    #: the middle half of each worker's responses: how many, the workers' CPU s in
    #: it, their voluntary and involuntary context switches, and their system CPU s
    middle: tuple[int, float, int, int, float] = NO_MIDDLE

    def gc_line(self) -> str:
        """The garbage collector's runs and CPU a page."""
        pages = max(1, self.responses)
        return "%.2f collections and %.0f us a page" % (self.gc_collections / pages,
                                                        self.gc_s / pages * 1e6)

    def middle_line(self) -> str:
        """CPU and context switches a page in the middle half of the crawl."""
        pages, cpu_s, voluntary, involuntary, system_s = self.middle
        if not pages:
            return "n/a"
        return ("%.2f ms/page (%.2f of it in the kernel), %.2f voluntary and %.2f involuntary"
                " context switches a page" % (cpu_s / pages * 1e3, system_s / pages * 1e3,
                                              voluntary / pages, involuntary / pages))


def middle_half(samples: list[list[float]]) -> tuple[int, float, int, int, float]:
    """From one worker's readings: its responses, CPU s and context switches between
    a quarter and three quarters of its responses (:data:`NO_MIDDLE`: too few readings)."""
    if len(samples) < 3:
        return NO_MIDDLE
    total = samples[-1][0]
    start = min(samples, key=lambda x: abs(x[0] - total / 4))
    end = min(samples, key=lambda x: abs(x[0] - total * 3 / 4))
    if end[0] <= start[0]:
        return NO_MIDDLE
    return (int(end[0] - start[0]), end[1] - start[1], int(end[2] - start[2]),
            int(end[3] - start[3]), end[4] - start[4])


def read_thread_cpu(threads_dir: Path, worker_prefix: str) -> WorkerCpu | None:
    """What the ThreadCpu of the workers named ``<worker_prefix>*`` wrote, added up."""
    main = other = gc_s = 0.0
    responses = collections = 0
    middle = [0, 0.0, 0, 0, 0.0]
    for path in threads_dir.glob("%s*.json" % worker_prefix):
        data = json.loads(path.read_text())
        main += data["main_s"]
        other += data["other_s"]
        responses += data["responses"]
        collections += data["gc_collections"]
        gc_s += data["gc_s"]
        for i, value in enumerate(middle_half(data.get("samples", []))):
            middle[i] += value
    if main + other <= 0:
        return None
    return WorkerCpu(other / (main + other), responses, collections, gc_s,
                     (int(middle[0]), middle[1], int(middle[2]), int(middle[3]), middle[4]))


def codec_cost_s(repeat: int = 2000) -> tuple[float, float]:
    """CPU seconds to serialize one demo-site request and to rebuild one from its entry.

    The ``site`` spider's link: a callback, the crawl's domains and the depth
    in meta; the fastest of five rounds.
    """
    import time

    from scrapy import Request
    from scrapy.utils.test import get_crawler

    from bloomcrawl.crawl.serialization import ClassAllowList, request_from_json, request_to_json
    from bloomcrawl.crawl.spiders.site import SiteSpider

    crawler = get_crawler(SiteSpider, {})
    spider = SiteSpider.from_crawler(crawler)
    allowed = ClassAllowList.from_settings(crawler.settings).extended("bloomcrawl")
    request = Request("http://127.0.0.1:8000/page/1234", callback=spider.parse,
                      meta={"site_domains": ["127.0.0.1"], "depth": 3})
    entry = request_to_json(request, spider, allowed)
    best_out = best_in = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(repeat):
            request_to_json(request, spider, allowed)
        middle = time.process_time()
        for _ in range(repeat):
            request_from_json(entry, spider, allowed)
        ended = time.process_time()
        best_out = min(best_out, (middle - started) / repeat)
        best_in = min(best_in, (ended - middle) / repeat)
    return best_out, best_in


@dataclass(frozen=True)
class CpuRow:
    """What :func:`print_worker_cpu` prints about one bloomcrawl run."""

    workers: int
    pages: int
    worker_cpu_s: float
    pages_per_second: float
    enqueued: float  # requests sent to Redis, all workers
    cpu: WorkerCpu | None


@dataclass(frozen=True)
class SeparateRow:
    """Separate in-memory crawls side by side, one per process: what the machine allows."""

    worker_cpu_per_page_s: float
    pages_per_second_per_process: float
    cpu: WorkerCpu | None = None


def print_worker_cpu(rows: list[CpuRow], memory_cpu_per_page_s: float | None,
                     ceiling: float | None,
                     separate: dict[int, SeparateRow] | None = None,
                     memory_cpu: WorkerCpu | None = None) -> None:
    """bloomcrawl's worker CPU per page against the in-memory scheduler's, with the floor.

    ``separate``: by process count, the in-memory scheduler's separate crawls, each
    of the whole site, run side by side: the floor of that many processes here.
    ``memory_cpu``: the in-memory scheduler's threads, for its garbage collections.
    """
    print("worker CPU per page (issue 20): bloomcrawl beside the in-memory scheduler")
    if memory_cpu_per_page_s is None or not rows:
        print("  (needs the in-memory and bloomcrawl runs)")
        return
    encode_s, decode_s = codec_cost_s()
    memory_ms = memory_cpu_per_page_s * 1e3
    print("  in-memory scheduler: %.2f ms/page; the codec here: %.0f us to serialize a request,"
          " %.0f us to rebuild one" % (memory_ms, encode_s * 1e6, decode_s * 1e6))
    for row in rows:
        per_page = row.worker_cpu_s / row.pages
        ratio = per_page / memory_cpu_per_page_s
        io_s = row.cpu.other_share * per_page if row.cpu is not None else None
        codec_s = row.enqueued / row.pages * encode_s + decode_s
        floor = memory_cpu_per_page_s + (io_s or 0.0) + codec_s
        rate = row.pages_per_second / row.workers
        of_ceiling = rate / ceiling if ceiling else None
        print("  %d process%s: %.2f ms/page = %.2fx (target <= %.2f: %s); pages/s per process"
              " %.2f of the ceiling (target >= %.2f: %s)" % (
                  row.workers, "" if row.workers == 1 else "es", per_page * 1e3, ratio,
                  WORKER_CPU_TARGET, "PASS" if ratio <= WORKER_CPU_TARGET else "MISS",
                  of_ceiling if of_ceiling is not None else float("nan"), CEILING_TARGET,
                  "n/a" if of_ceiling is None
                  else ("PASS" if of_ceiling >= CEILING_TARGET else "MISS")))
        print("     floor %.2f ms/page = %.2fx: the in-memory scheduler's %.2f + the Redis I/O"
              " thread's %s + the codec's %.0f us (%.2f requests serialized and one rebuilt a"
              " page); above the floor: %.0f us/page of bookkeeping on the reactor (page"
              " tracking, leases, signals, exchanges)" % (
                  floor * 1e3, floor / memory_cpu_per_page_s, memory_ms,
                  "n/a" if io_s is None else "%.0f us" % (io_s * 1e6), codec_s * 1e6,
                  row.enqueued / row.pages, max(0.0, per_page - floor) * 1e6))
        if row.cpu is not None and row.cpu.responses:
            print("     garbage collection: %s (the in-memory scheduler: %s)" % (
                row.cpu.gc_line(), memory_cpu.gc_line() if memory_cpu is not None
                and memory_cpu.responses else "n/a"))
        alone = (separate or {}).get(row.workers)
        if row.cpu is not None:
            middle = [("the in-memory scheduler", memory_cpu)] if row.workers == 1 else [
                ("the separate in-memory crawls", alone.cpu if alone is not None else None)]
            print("     the middle half of each worker's responses: %s (%s)" % (
                row.cpu.middle_line(), "; ".join(
                    "%s: %s" % (name, cpu.middle_line() if cpu is not None else "n/a")
                    for name, cpu in middle)))
        if alone is not None:
            print("     floor with %d processes on this machine: %d separate in-memory crawls"
                  " side by side (no shared frontier, each fetches every page) take %.2f"
                  " ms/page = %.2fx, at %.2f of the ceiling per process" % (
                      row.workers, row.workers, alone.worker_cpu_per_page_s * 1e3,
                      alone.worker_cpu_per_page_s / memory_cpu_per_page_s,
                      alone.pages_per_second_per_process / ceiling if ceiling
                      else float("nan")))


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
