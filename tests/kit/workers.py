"""The one ``scrapy crawl`` launcher of the tests and benchmarks.

A :class:`Worker` is one ``python -m scrapy crawl SPIDER`` process, started
by the project's process manager (:func:`bloomcrawl.ops.cluster.processes.spawn`:
a session of its own, stopped by pid and process group), its output in
``<workdir>/<name>.log``. Its environment holds nothing of the caller's
cluster (no ``REDIS_*``, ``SCRAPYD_*``, ``BLOOMCRAWL_*``, no
``SCRAPY_SETTINGS_MODULE`` unless asked), its HOME is in ``workdir``, and
its settings are ``-s`` options: :data:`BASE_SETTINGS` (a ``base`` of the
caller's choosing), then the caller's, JSON objects merged key by key
(:func:`merge_settings`).

A :class:`WorkerPool` starts workers and stops every one still running when
it is closed: the ``worker_pool`` fixture closes its pool when the test ends,
however it ends, so no worker outlives a failed assertion (a worker outlives
an unreachable Redis by design, and would write into whatever server later
takes its port).
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from bloomcrawl.ops.cluster.processes import KILL_TIMEOUT, ManagedProcess, spawn

from kit import CRAWLER, TESTS
from kit.wait import WaitTimeout, wait_until

#: the settings of every test worker unless the test says otherwise
BASE_SETTINGS: dict[str, str] = {
    "REMOTE_CONTROL_ENABLED": "False",
    "TELNETCONSOLE_ENABLED": "False",
    "LOG_LEVEL": "INFO",
    # the worker closes this many seconds after the cluster's frontier emptied (queued,
    # leased and start entries all count): 1 s ends no crawl early, and every crawl test
    # pays it once
    "MAX_IDLE_TIME_BEFORE_CLOSE": "1",
    "BLOOMFILTER_CAPACITY": "200000",
    # a new filter starts with small slices (256 URLs a partition) that share the error
    # rate: at the default 0.001 a crawl of 1,000 new URLs loses one to a false positive
    # in about one run of ten or twenty. The crawl tests count every page, so a false
    # positive must not happen in them: at 1e-6, about one run in ten thousand
    "BLOOMFILTER_ERROR_RATE": "0.000001",
    "ROBOTSTXT_OBEY": "False",
    # the demo site is one host and ours: its cluster-wide budget is every worker's
    # whole concurrency (the politeness tests set their own)
    "CONCURRENT_REQUESTS_PER_DOMAIN": "64",
}
#: environment variables of the caller's own cluster, never passed to a worker
CLUSTER_ENV_PREFIXES = ("REDIS_", "SCRAPYD_", "BLOOMCRAWL_")
LOG_TAIL_CHARS = 3000


def merge_settings(*layers: Mapping[str, str]) -> dict[str, str]:
    """Later layers win, except that JSON objects (EXTENSIONS, ...) are merged key by key."""
    merged: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.items():
            old = merged.get(key)
            if old is not None and old.startswith("{") and value.startswith("{"):
                try:
                    value = json.dumps({**json.loads(old), **json.loads(value)})
                except ValueError:
                    pass
            merged[key] = value
    return merged


class Worker:
    """One ``scrapy crawl`` process; :meth:`start` starts it.

    ``project``: the directory of the Scrapy project's scrapy.cfg (the working
    directory); with ``settings_module`` (SCRAPY_SETTINGS_MODULE) the worker
    runs in ``workdir`` instead, away from any scrapy.cfg. ``pythonpath``: more
    import directories after ``crawler/`` and ``tests/`` (a user project's own
    dependencies, the benchmarks' modules). ``{worker}`` and ``{workdir}`` in a
    setting's value are this worker's name and directory.
    """

    def __init__(self, name: str, redis_url: str, workdir: Path,
                 settings: Mapping[str, str] | None = None, *, spider: str = "site",
                 args: Mapping[str, str] | None = None, project: Path = CRAWLER,
                 pythonpath: Sequence[Path] = (), settings_module: str | None = None,
                 base: Mapping[str, str] = BASE_SETTINGS) -> None:
        self.name = name
        self.workdir = workdir
        self.log = workdir / ("%s.log" % name)
        self.cmd = ["-m", "scrapy", "crawl", spider, "-s", "REDIS_URL=" + redis_url]
        for key, value in merge_settings(base, settings or {}).items():
            value = value.replace("{worker}", name).replace("{workdir}", str(workdir))
            self.cmd += ["-s", "%s=%s" % (key, value)]
        for key, value in (args or {}).items():
            self.cmd += ["-a", "%s=%s" % (key, value)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(CLUSTER_ENV_PREFIXES)}
        env["HOME"] = str(workdir / "home")  # Scrapy writes job state under ~
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (CRAWLER, TESTS, *pythonpath))
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        if settings_module is not None:
            env["SCRAPY_SETTINGS_MODULE"] = settings_module
        self.env = env
        self.cwd = project if settings_module is None else workdir
        self.process: ManagedProcess | None = None
        #: SIGSTOPped by :meth:`pause`
        self.paused = False

    def start(self) -> Worker:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log.unlink(missing_ok=True)  # a log of this worker's alone
        self.process = spawn(self.name, [sys.executable, *self.cmd], log=self.log,
                             cwd=self.cwd, env=self.env)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "%s was never started" % self.name
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running()

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs."""
        return None if self.process is None else self.process.popen.poll()

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` s for it to exit; its exit code, or None if it still runs."""
        assert self.process is not None, "%s was never started" % self.name
        try:
            return self.process.popen.wait(max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def pause(self) -> None:
        """SIGSTOP: it holds its leases and connections, and does nothing."""
        if self.running:
            os.kill(self.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.running:
            os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL its process group, by pid; then it is reaped."""
        if self.process is not None:
            self.process.stop(timeout=KILL_TIMEOUT, sig=signal.SIGKILL)
        self.paused = False

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        return self.text()[-chars:]

    def opened(self) -> bool:
        """Whether its spider opened (Scrapy logged it)."""
        return "Spider opened" in self.text()

    def stats(self) -> dict[str, Any]:
        """The stats Scrapy dumps at the end of the log ({} before it closed)."""
        match = re.search(r"Dumping Scrapy stats:\n(\{.*?\})\n", self.text(), re.S)
        if not match:
            return {}
        text = re.sub(r"datetime\.datetime\([^)]*\)", "None", match.group(1))
        stats: dict[str, Any] = ast.literal_eval(text)
        return stats


def logs(workers: Iterable[Worker], chars: int = LOG_TAIL_CHARS) -> str:
    """The workers' log tails, for a failure message."""
    return "\n".join("--- %s\n%s" % (w.name, w.tail(chars)) for w in workers)


def run_workers(workers: Sequence[Worker], timeout: float) -> None:
    """Wait until every worker exited by itself; after ``timeout`` s, kill them all and fail
    with their logs."""
    try:
        wait_until(lambda: not any(w.running for w in workers), timeout, interval=0.1,
                   what="workers to finish")
    except WaitTimeout:
        for w in workers:
            w.kill()
        raise AssertionError("workers did not finish in %.0f s\n%s"
                             % (timeout, logs(workers))) from None
    for w in workers:
        w.wait(KILL_TIMEOUT)  # reaped: its exit code is known


def wait_opened(workers: Sequence[Worker], timeout: float) -> None:
    """Wait until every worker opened its spider; fail with their logs if one exits first
    or time is up."""

    def opened() -> bool:
        if not all(w.running or w.opened() for w in workers):
            raise AssertionError("a worker exited before opening its spider\n" + logs(workers))
        return all(w.opened() for w in workers)

    wait_until(opened, timeout, interval=0.1,
               what=lambda: "workers to open their spiders\n" + logs(workers, 2000))


def check_exits(workers: Iterable[Worker]) -> None:
    """Every worker exited 0 with no traceback in its log."""
    for w in workers:
        assert w.returncode == 0, (w.name, w.returncode, w.tail())
        assert "Traceback" not in w.text(), (w.name, w.tail())


class WorkerPool:
    """Workers started in ``workdir``; :meth:`close` kills every one still running.

    ``defaults`` are :class:`Worker` keyword arguments for every worker of the
    pool (``base``, ``settings_module``, ``project``, ...).
    """

    def __init__(self, workdir: Path, **defaults: Any) -> None:
        self.workdir = workdir
        self.defaults = defaults
        self.workers: list[Worker] = []

    def start(self, name: str, redis_url: str, settings: Mapping[str, str] | None = None,
              **kwargs: Any) -> Worker:
        worker = Worker(name, redis_url, self.workdir, settings, **{**self.defaults, **kwargs})
        self.workers.append(worker)
        return worker.start()

    def start_many(self, count: int, redis_url: str, settings: Mapping[str, str] | None = None,
                   *, first: int = 0, prefix: str = "w", **kwargs: Any) -> list[Worker]:
        """``count`` workers named ``<prefix><first>``, ``<prefix><first + 1>``, ..."""
        return [self.start("%s%d" % (prefix, i), redis_url, settings, **kwargs)
                for i in range(first, first + count)]

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
