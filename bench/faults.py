"""What ordinary Redis and worker faults cost: bloomcrawl beside plain scrapy-redis.

The fault suite's scenarios (``tests/faults/scenarios.py``, issue 9) that
make sense for both, each one crawl per contender of the same demo site (its
own process, no delay) by 2 ``scrapy crawl site`` workers whose REDIS_URL is
the fault proxy (``tests/faults/proxy.py``) in front of a private
redis-server:

* bloomcrawl: the project's settings, SCHEDULER_LEASE_TIMEOUT=3,
  SCHEDULER_REAP_INTERVAL=1, the home page in ``site:start_urls``;
* scrapy-redis: its Scheduler, SADD RFPDupeFilter and PriorityQueue
  (SCHEDULER_PERSIST=True), the same ``site`` spider started from a spider
  argument, as ``bench/crawl.py`` runs it.

Both: CONCURRENT_REQUESTS=8, MAX_IDLE_TIME_BEFORE_CLOSE=2, items into
``site:items`` with the project's pipeline. Where a scenario drops the reply
to a packet that takes a request from the queue, that is bloomcrawl's lease
script call and scrapy-redis's ``MULTI ZRANGE ZREMRANGEBYRANK EXEC``.

Columns, per contender: pages lost (the site never served them), fetched
twice (extra GETs), items lost (pages served without an item stored), items
duplicated, stats error (bloomcrawl's ``site:stats`` pages and items against the
responses the site served; scrapy-redis keeps no shared stats), recover s
(from the end of the fault until 17 more pages were served, more than can
have been in flight, or the last one; "-": nothing was left to fetch;
"never"), workers (exited 0 on their own / all). The table is the
product; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path[:0] = [str(ROOT / "crawler"), str(ROOT / "tests")]

from _crawl import ITEM_PIPELINES, SCRAPY_REDIS  # noqa: E402
from _site import SiteProcess  # noqa: E402
from faults.harness import BLOOMCRAWL, Contender, Outcome, format_seconds  # noqa: E402
from faults.scenarios import SCENARIOS, Scenario, heartbeat_lags  # noqa: E402

from bloomcrawl.ops.demo_site import page_url  # noqa: E402

PAGES = 400
QUICK_PAGES = 200
QUICK_SCENARIOS = ("rollback", "dropped-reply", "worker-sigstop")

SCRAPY_REDIS_FAULTS = Contender(
    "scrapy_redis", "scrapy-redis",
    {**SCRAPY_REDIS.settings, "ITEM_PIPELINES": ITEM_PIPELINES["redis"]},
    start="argument", settings_module="crawlbench.settings",
    # after crawler/ and tests/ (the kit's worker puts them first): tests/faults is found
    # before bench/faults.py
    pythonpath=(BENCH,), shared_stats=False,
    pop_marker=b"ZREMRANGEBYRANK")
CONTENDERS = (BLOOMCRAWL, SCRAPY_REDIS_FAULTS)
#: over the fault suite's settings: an idle close that outlasts a fault's gaps for both
#: contenders (the suite's own crawls close after 1 s)
BENCH_SETTINGS = {"MAX_IDLE_TIME_BEFORE_CLOSE": "2"}
METRICS = ("lost", "twice", "items lost", "items dup", "stats err", "recover s", "workers")


class SharedSite:
    """The benchmark's demo-site process, as the fault harness reads it."""

    def __init__(self, site: SiteProcess) -> None:
        self.process = site
        self.pages = site.pages

    @property
    def url(self) -> str:
        return self.process.url

    def page_url(self, page: int) -> str:
        return page_url(page, self.process.base)

    def progress(self) -> tuple[int, int]:
        brief = self.process.brief()
        return int(brief["total"]), int(brief["distinct"])

    def counts(self) -> dict[str, Any]:
        return self.process.stats()


def cells(outcome: Outcome | None) -> list[str]:
    """One contender's cells of a row; a run that failed shows "error"."""
    if outcome is None:
        return ["error"] + [""] * (len(METRICS) - 1)
    ok = sum(1 for code in outcome.exit_codes.values() if code == 0)
    return [str(outcome.lost), str(outcome.fetched_twice), str(outcome.items_lost),
            str(outcome.items_duplicated),
            "n/a" if outcome.stats_error is None else str(outcome.stats_error),
            format_seconds(outcome.recover_s),
            "%d/%d%s" % (ok, len(outcome.exit_codes), " wedged" if outcome.wedged else "")]


def table(rows: list[tuple[Scenario, list[list[str]]]], contenders: list[Contender]) -> str:
    header = ["fault"] + [m for _ in contenders for m in METRICS]
    body = [[scenario.title] + [c for per in results for c in per]
            for scenario, results in rows]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    group = [" " * widths[0]]
    for i, contender in enumerate(contenders):
        span = sum(widths[1 + i * len(METRICS):1 + (i + 1) * len(METRICS)])
        span += 2 * (len(METRICS) - 1)
        group.append(contender.label.center(span, "-"))
    lines = ["  ".join(group),
             "  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in
                       enumerate(zip(header, widths, strict=True)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in body:
        lines.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                               enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: %d pages, %s" % (QUICK_PAGES,
                                                            ", ".join(QUICK_SCENARIOS)))
    parser.add_argument("--pages", type=int, default=None,
                        help="demo-site pages (default %d)" % PAGES)
    parser.add_argument("--scenarios", default="",
                        help="comma-separated subset of %s" % ", ".join(
                            k for k, s in SCENARIOS.items() if s.bench))
    parser.add_argument("--repeat", type=int, default=1, help="runs per fault and contender")
    parser.add_argument("--keep", action="store_true",
                        help="keep the workers' logs (their directory is printed)")
    args = parser.parse_args(argv)
    pages = args.pages or (QUICK_PAGES if args.quick else PAGES)
    chosen = [k.strip() for k in args.scenarios.split(",") if k.strip()] or [
        k for k, s in SCENARIOS.items() if s.bench and (not args.quick or k in QUICK_SCENARIOS)]
    unknown = [k for k in chosen if k not in SCENARIOS or not SCENARIOS[k].bench]
    if unknown:
        parser.error("unknown scenario %s" % ", ".join(unknown))
    contenders = list(CONTENDERS)

    print("Faults: 2 workers crawl a %d-page demo site through a fault proxy; one fault per"
          " crawl" % pages)
    print("CONCURRENT_REQUESTS=8, MAX_IDLE_TIME_BEFORE_CLOSE=2; bloomcrawl:"
          " SCHEDULER_LEASE_TIMEOUT=3, SCHEDULER_REAP_INTERVAL=1; %d CPUs, load average %s"
          % (os.cpu_count() or 0, " ".join("%.2f" % x for x in os.getloadavg())))
    sys.stdout.flush()
    started = time.monotonic()
    rows: list[tuple[Scenario, list[list[str]]]] = []
    notes: list[str] = []
    tmp = tempfile.mkdtemp(prefix="bloomcrawl-bench-faults-")
    with SiteProcess(pages) as process:
        site = SharedSite(process)
        for key, repeat in [(k, i) for k in chosen for i in range(args.repeat)]:
            scenario = SCENARIOS[key]
            results = []
            for contender in contenders:
                print("  %s: %s (%d/%d) ..." % (scenario.title, contender.label, repeat + 1,
                                                args.repeat), file=sys.stderr, flush=True)
                process.reset()
                try:
                    outcome = scenario.run(
                        Path(tmp) / ("%s-%s-%d" % (key, contender.key, repeat)), contender,
                        site=site, extra_settings=BENCH_SETTINGS)
                    results.append(cells(outcome))
                    if "stall_from" in outcome.facts:
                        lags = [lag for lag in heartbeat_lags(outcome).values()
                                if lag is not None]
                        notes.append("%s, %s: worst lag of a 50 ms reactor timer %s" % (
                            scenario.title, contender.label,
                            "%.2f s" % max(lags) if lags else "not measured"))
                except Exception as exc:  # one failed run must not hide the others
                    print("    %s under %s failed: %s" % (contender.label, key,
                                                          str(exc)[:2000]), file=sys.stderr)
                    results.append(cells(None))
            rows.append((scenario, results))
    elapsed = time.monotonic() - started
    if not args.keep:
        _remove(Path(tmp))
    else:
        print("logs in %s" % tmp)
    print("finished in %.0f s" % elapsed)
    print()
    print(table(rows, contenders))
    print()
    print("lost: pages the site never served; twice: extra GETs; items lost: pages served"
          " with no item stored; items dup: extra items")
    print("stats err: |site:stats pages - responses served| + |items - pages served|"
          " (scrapy-redis keeps no shared stats)")
    print("recover s: end of the fault until 17 more pages (more than were in flight) or the"
          " last one were served (-: nothing left to fetch)")
    print("workers: exited 0 by themselves / all (wedged: killed after the bound)")
    for note in notes:
        print(note)
    return 0


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
