"""What a SIGKILLed worker costs: bloomcrawl's leased frontier beside scrapy-redis.

Three ``scrapy crawl site`` processes crawl a 2,000-page demo site (its own
process, no delay) from ``/`` through one private redis-server. When a third
of the pages have been fetched, the busiest worker is SIGKILLed; the other two
go on until the frontier is empty and close after MAX_IDLE_TIME_BEFORE_CLOSE
idle seconds. The demo site's per-page GET counters then tell:

* lost: pages whose response no worker ever processed: no item was stored
  for them (items go to ``site:items`` with the project's pipeline, for
  every contender). The site's own counter is not enough: with no delay, a
  page the killed worker requested is usually served (and counted) before
  the kill, yet its callback never ran. scrapy-redis's pop removes a request
  from Redis and its dupefilter already calls the URL seen, so what the
  killed worker held is gone for good;
* unfetched: pages the site never served;
* twice: extra fetches (the site's counters) and extra items. bloomcrawl's
  killed leases expire (SCHEDULER_LEASE_TIMEOUT=3) and are requeued
  (SCHEDULER_REAP_INTERVAL=1), so the killed worker's unfinished pages are
  fetched again.

Contenders: bloomcrawl (the project's settings), scrapy-redis's Scheduler
with its SADD RFPDupeFilter, and with scrapy_redis_bloomfilter's dupefilter
(the seeds' recipe). All with CONCURRENT_REQUESTS=8 and the same spider code.
The table is the product; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from _crawl import (
    BLOOMCRAWL,
    ITEM_PIPELINES,
    RECIPE,
    SCRAPY_REDIS,
    CrawlFailed,
    CrawlRun,
    pick_contenders,
    run_crawl,
)
from _site import SiteProcess

from kit.redis import RedisServer

PAGES = 2000
WORKERS = 3
KILL_AT = 1 / 3
CONCURRENT_REQUESTS = 8
MAX_IDLE_S = 5
TIMEOUT_S = 300.0
CONTENDERS = (BLOOMCRAWL, SCRAPY_REDIS, RECIPE)
SETTINGS = {
    "CONCURRENT_REQUESTS": str(CONCURRENT_REQUESTS),
    "MAX_IDLE_TIME_BEFORE_CLOSE": str(MAX_IDLE_S),
    "ITEM_PIPELINES": ITEM_PIPELINES["redis"],
}
LEASE_SETTINGS = {"SCHEDULER_LEASE_TIMEOUT": "3", "SCHEDULER_REAP_INTERVAL": "1"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=PAGES)
    parser.add_argument("--repeat", type=int, default=1, help="runs per contender")
    parser.add_argument("--contenders", default=",".join(c.key for c in CONTENDERS),
                        help="comma-separated subset of %(default)s")
    args = parser.parse_args(argv)
    contenders = pick_contenders(parser, args.contenders, CONTENDERS)

    print("SIGKILL comparison: %d workers crawl a %d-page demo site; the busiest is"
          " SIGKILLed at 1/3 of the pages" % (WORKERS, args.pages))
    print("CONCURRENT_REQUESTS=%d, MAX_IDLE_TIME_BEFORE_CLOSE=%d; bloomcrawl:"
          " SCHEDULER_LEASE_TIMEOUT=3, SCHEDULER_REAP_INTERVAL=1; %d CPUs, load average %s"
          % (CONCURRENT_REQUESTS, MAX_IDLE_S, os.cpu_count() or 0,
             " ".join("%.2f" % x for x in os.getloadavg())))
    sys.stdout.flush()
    runs: list[CrawlRun] = []
    failures = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-bench-kill-") as tmp, \
            RedisServer() as server, SiteProcess(args.pages) as site:
        client = server.client()
        for contender in contenders:
            settings = dict(SETTINGS)
            if contender is BLOOMCRAWL:
                settings.update(LEASE_SETTINGS)
            for i in range(args.repeat):
                print("  running %s (%d/%d) ..." % (contender.label, i + 1, args.repeat),
                      file=sys.stderr, flush=True)
                try:
                    runs.append(run_crawl(
                        contender, workers=WORKERS, site=site, client=client,
                        redis_url=server.url, workdir=Path(tmp) / ("%s-%d" % (contender.key, i)),
                        timeout=TIMEOUT_S, settings=settings, kill_at=KILL_AT))
                except CrawlFailed as exc:
                    failures += 1
                    print(str(exc), file=sys.stderr)
        client.close()
    print("finished in %.0f s" % (time.monotonic() - started))
    print()
    header = "%-34s %6s %9s %7s %6s %9s %13s %11s %9s %7s" % (
        "contender", "pages", "killed at", "victim", "lost", "unfetched", "fetched twice",
        "items twice", "requeued", "span s")
    print(header)
    print("-" * len(header))
    for run in runs:
        requeued = run.shared_stats.get("requeued", 0) if run.contender is BLOOMCRAWL else None
        print("%-34s %6d %9s %7s %6d %9d %13d %11d %9s %7.1f" % (
            run.contender.label, run.pages,
            "-" if run.killed_at is None else str(run.killed_at),
            "-" if run.killed_responses is None else str(run.killed_responses),
            run.items_missing, run.missing, run.duplicates, run.items_twice,
            "n/a" if requeued is None else str(requeued), run.span_s))
    print()
    print("killed at: distinct pages fetched when the busiest worker was SIGKILLed; victim: its"
          " responses by then (to 10)")
    print("lost: pages no item was stored for (never processed); unfetched: never served by"
          " the site; fetched twice: extra GETs at the site; items twice: extra items")
    print("requeued: expired leases put back (bloomcrawl's site:stats); span: first to last"
          " page GET")
    print("the killed worker could hold up to CONCURRENT_REQUESTS=%d requests in download,"
          " plus downloaded responses waiting for their callback" % CONCURRENT_REQUESTS)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
