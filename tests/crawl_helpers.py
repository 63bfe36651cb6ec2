"""Run real ``scrapy crawl site`` worker processes against a test Redis and demo site."""

from __future__ import annotations

import ast
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bloomcrawl.ops.hosts_site import Arrival, by_host

ROOT = Path(__file__).resolve().parent.parent
CRAWLER = ROOT / "crawler"

BASE_SETTINGS = {
    "REMOTE_CONTROL_ENABLED": "False",
    "TELNETCONSOLE_ENABLED": "False",
    "LOG_LEVEL": "INFO",
    "MAX_IDLE_TIME_BEFORE_CLOSE": "3",
    "BLOOMFILTER_CAPACITY": "200000",
    "ROBOTSTXT_OBEY": "False",
    # the demo site is one host and ours: its cluster-wide budget is every worker's
    # whole concurrency (the politeness tests set their own)
    "CONCURRENT_REQUESTS_PER_DOMAIN": "64",
}


class Worker:
    """One ``scrapy crawl`` process; its log goes to a file."""

    def __init__(self, name: str, redis_url: str, workdir: Path, settings: dict[str, Any],
                 spider: str = "site", env: dict[str, str] | None = None,
                 args: dict[str, str] | None = None, project: Path = CRAWLER,
                 pythonpath: tuple[Path, ...] = ()) -> None:
        """``project``: the Scrapy project's directory (its scrapy.cfg); ``pythonpath``:
        more import directories (a user project's own dependencies)."""
        self.name = name
        self.log = workdir / ("%s.log" % name)
        workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "scrapy", "crawl", spider, "-s", "REDIS_URL=" + redis_url]
        for key, value in {**BASE_SETTINGS, **settings}.items():
            cmd += ["-s", "%s=%s" % (key, value)]
        for key, value in (args or {}).items():
            cmd += ["-a", "%s=%s" % (key, value)]
        full_env = dict(env or os.environ)
        full_env["HOME"] = str(workdir / "home")
        full_env["PYTHONPATH"] = os.pathsep.join(
            [str(CRAWLER), str(ROOT / "tests"), *map(str, pythonpath)])
        full_env.pop("SCRAPY_SETTINGS_MODULE", None)
        self._logfile = self.log.open("wb")
        self.proc = subprocess.Popen(cmd, cwd=project, env=full_env, stdout=self._logfile,
                                     stderr=subprocess.STDOUT)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout)
        self._logfile.close()
        return code

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._logfile.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if not self._logfile.closed:
            self._logfile.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stats(self) -> dict[str, Any]:
        """The stats Scrapy dumps at the end of the log."""
        match = re.search(r"Dumping Scrapy stats:\n(\{.*?\})\n", self.text(), re.S)
        if not match:
            return {}
        text = re.sub(r"datetime\.datetime\([^)]*\)", "None", match.group(1))
        stats: dict[str, Any] = ast.literal_eval(text)
        return stats


def run_workers(workers: list[Worker], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for w in workers:
            w.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for w in workers:
            w.stop()
        logs = "\n".join("--- %s\n%s" % (w.name, w.text()[-3000:]) for w in workers)
        raise AssertionError("workers did not finish in %.0f s\n%s" % (timeout, logs)) from None


@contextmanager
def stopped_at_exit(workers: list[Worker]) -> Iterator[list[Worker]]:
    """Workers still running when the block ends (a failed assertion) are SIGKILLed.

    A worker outlives an unreachable Redis by design; one left behind by a
    failed test would write into whatever server later takes its port.
    """
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()


def wait_until(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def frontier_left(client: Any, spider: str = "site") -> int:
    """Requests queued or leased anywhere in a spider's frontier (the filter's partitions).

    Counts the hosts' queues (each partition's counter), the leases, and any
    queue of before per-host queues, so a request in none of them is lost.
    """
    import json

    from bloomcrawl.core import keys

    f = keys.FrontierKeys(spider)
    params = client.hget(f.meta, "params")
    f = keys.FrontierKeys(spider, partitions=json.loads(params)["partitions"])
    pipe = client.pipeline(transaction=False)
    for p in range(f.partitions):
        pipe.get(f.polite(p, "queued"))
        pipe.zcard(f.queue_part(p))
        pipe.zcard(f.deadlines(p))
        pipe.hlen(f.leases(p))
        pipe.zcard(f.polite(p, "depth"))
        pipe.hlen(f.polite(p, "busy"))
    counts = [int(n or 0) for n in pipe.execute()]
    left = sum(counts[i] + counts[i + 1] + counts[i + 2] + counts[i + 3]
               for i in range(0, len(counts), 6))
    # hosts with queued requests or leases left behind count too: their bookkeeping
    # must end empty along with the queues
    return left + sum(counts[i + 4] + counts[i + 5] for i in range(0, len(counts), 6))


# --- politeness crawls: workers the site tells apart ---------------------------------

#: workers of a politeness crawl
POLITE_WORKERS = 3
#: seconds they get to open their spiders (3 Scrapy processes on 2 cores)
POLITE_START_TIMEOUT_S = 30.0
#: seconds a politeness crawl gets, idle close included
POLITE_CRAWL_TIMEOUT_S = 60.0


def polite_agent(i: int) -> str:
    """Worker ``i``'s User-Agent: the site records it, and so tells who fetched what."""
    return "bloomcrawl-politeness-test/w%d" % i


def start_polite_workers(redis_url: str, tmp_path: Path, settings: dict[str, str]
                         ) -> list[Worker]:
    """POLITE_WORKERS ``scrapy crawl site`` processes, each with its own User-Agent
    (:func:`polite_agent`); returns once every one has opened its spider, so all of
    them compete from the first seed on."""
    workers = [Worker("w%d" % i, redis_url, tmp_path,
                      {**settings, "USER_AGENT": polite_agent(i)})
               for i in range(POLITE_WORKERS)]
    opened = wait_until(lambda: all("Spider opened" in w.text() for w in workers),
                        POLITE_START_TIMEOUT_S)
    if not opened:
        for w in workers:
            w.stop()
        pytest.fail("workers did not open their spiders in %.0f s:\n%s" % (
            POLITE_START_TIMEOUT_S, "\n".join("--- %s\n%s" % (w.name, w.text()[-2000:])
                                              for w in workers)))
    return workers


def check_exits(workers: list[Worker]) -> None:
    """Every worker exited 0 with no traceback in its log."""
    for w in workers:
        assert w.proc.returncode == 0, (w.name, w.text()[-3000:])
        assert "Traceback" not in w.text(), (w.name, w.text()[-3000:])


def closest(arrivals: list[Arrival], host: str,
            count: int = 5) -> list[tuple[float, str, str, str, str, float]]:
    """The ``count`` shortest gaps of ``host``, for messages: (gap, agent and path before,
    agent and path after, seconds from the host's first request to the gap)."""
    records = by_host(arrivals)[host]
    gaps = [(round(b.start - a.start, 4), a.agent[-2:], b.agent[-2:], a.path, b.path,
             round(a.start - records[0].start, 3))
            for a, b in itertools.pairwise(records)]
    return sorted(gaps)[:count]
