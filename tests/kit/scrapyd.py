"""One scrapyd node for the tests, started by the project's process manager.

A :class:`ScrapydNode` is ``python -m scrapyd`` on a free 127.0.0.1 port with
basic auth (:func:`bloomcrawl.ops.cluster.processes.start_scrapyd`), in a
process group of its own: :meth:`~ScrapydNode.stop` stops that group, scrapyd
and the jobs it spawned, by pid.

``probe=True`` gives it a tiny project ``probe`` whose spider ``sleeper``
sleeps in its constructor: with ``max_proc = 1`` a test gets a running and a
pending job on demand (:meth:`~ScrapydNode.schedule`); its ``waiter`` opens
and stays open, idle, as long as asked.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

from bloomcrawl.ops.cluster.processes import (
    ManagedProcess,
    free_port,
    group_alive,
    start_scrapyd,
)
from bloomcrawl.ops.scrapyd import Node, ScrapydError

from kit.wait import wait_until

USERNAME = "tester"
PASSWORD = "s3cret-for-tests"

PROBE_SETTINGS = """\
BOT_NAME = "probe"
SPIDER_MODULES = ["probe.spiders"]
TELNETCONSOLE_ENABLED = False
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
"""

PROBE_SPIDER = """\
import time

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider


class Sleeper(scrapy.Spider):
    name = "sleeper"

    def __init__(self, *args, seconds="60", **kwargs):
        super().__init__(*args, **kwargs)
        time.sleep(float(seconds))


class Waiter(scrapy.Spider):
    # opens, then stays open and idle for the seconds given

    name = "waiter"

    def __init__(self, *args, seconds="60", **kwargs):
        super().__init__(*args, **kwargs)
        self.until = time.monotonic() + float(seconds)
        self.waiting = False

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.idle, signal=signals.spider_idle)
        return spider

    def idle(self):
        if time.monotonic() < self.until:
            if not self.waiting:
                self.waiting = True
                self.logger.info("waiter: open and idle")  # the engine runs: tests wait for it
            raise DontCloseSpider
"""


class ScrapydNode:
    """A scrapyd process the caller owns; a context manager too.

    ``redis_url``: the REDIS_URL its jobs get; ``pythonpath``: its PYTHONPATH,
    as the local cluster gives its nodes one (the projects' requirements), none
    by default; ``max_proc``: jobs at once.
    """

    def __init__(self, workdir: Path, *, redis_url: str | None = None,
                 pythonpath: Path | None = None, max_proc: int = 2, probe: bool = False,
                 username: str = USERNAME, password: str = PASSWORD) -> None:
        self.workdir = workdir
        self.redis_url = redis_url
        self.pythonpath = pythonpath
        self.max_proc = max_proc
        self.probe = probe
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.username = username
        self.password = password
        self.node = Node(self.url, username, password)
        self.log = workdir / "scrapyd.log"
        self.process: ManagedProcess | None = None

    def start(self) -> ScrapydNode:
        work = self.workdir
        work.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SCRAPYD_", "REDIS_", "BLOOMCRAWL_"))}
        env["HOME"] = str(work / "home")
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        env.pop("PYTHONPATH", None)
        if self.redis_url is not None:
            env["REDIS_URL"] = self.redis_url
        paths = [str(self.pythonpath)] if self.pythonpath is not None else []
        if self.probe:
            (work / "probe" / "spiders").mkdir(parents=True, exist_ok=True)
            (work / "probe" / "__init__.py").write_text("")
            (work / "probe" / "settings.py").write_text(PROBE_SETTINGS)
            (work / "probe" / "spiders" / "__init__.py").write_text(PROBE_SPIDER)
            (work / "scrapy.cfg").write_text("[settings]\nprobe = probe.settings\n")
            paths.append(str(work))
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        self.process = start_scrapyd(
            work, port=self.port, username=self.username, password=self.password, env=env,
            log=self.log, timeout=30, settings={
                "max_proc": self.max_proc, "poll_interval": 0.2, "items_dir": "",
                "eggs_dir": work / "eggs", "logs_dir": work / "logs", "dbs_dir": work / "dbs",
            })
        return self

    # --- the HTTP API ---------------------------------------------------------------

    def get(self, path: str) -> dict[str, Any]:
        return self.node.request(path, timeout=5)

    def post(self, path: str, **data: str) -> dict[str, Any]:
        return self.node.request(path, data, timeout=5)

    def schedule(self, seconds: float = 60) -> str:
        """A job of the probe project's ``sleeper``; its id."""
        answer = self.post("schedule.json", project="probe", spider="sleeper",
                           seconds=str(seconds))
        assert answer["status"] == "ok", answer
        return str(answer["jobid"])

    def wait_for(self, *, running: int, pending: int, timeout: float = 60) -> dict[str, Any]:
        """Poll daemonstatus.json until it shows these counts; the last answer."""
        last: dict[str, Any] = {}

        def shown() -> bool:
            last.update(self.get("daemonstatus.json"))
            return bool(last["running"] == running and last["pending"] == pending)

        wait_until(shown, timeout, interval=0.1,
                   what=lambda: f"scrapyd to show running={running} pending={pending}: {last}")
        return last

    def wait_finished(self, project: str, spider: str, job: str, timeout: float = 90) -> str:
        """The log of ``job`` once scrapyd lists it as finished."""
        wait_until(lambda: any(j["id"] == job for j in self.node.list_jobs(project)["finished"]),
                   timeout, interval=0.2,
                   what=lambda: f"job {job} to finish: {self.node.list_jobs(project)}")
        return (self.workdir / "logs" / project / spider / f"{job}.log").read_text()

    def cancel_all(self, project: str = "probe") -> None:
        """Cancel every job of ``project``, a running one with SIGKILL: scrapyd's default
        SIGINT stops a job only before Scrapy installed its handler, and after that a
        ``sleeper`` sleeps out its seconds in its constructor (a test waiting for the
        node to be idle then waited as long)."""
        jobs = self.get(f"listjobs.json?project={project}")
        for job in jobs.get("pending", []):
            self.post("cancel.json", project=project, job=job["id"])
        for job in jobs.get("running", []):
            self.post("cancel.json", project=project, job=job["id"], signal="KILL")

    # --- the end ----------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel the probe's jobs, then stop its process group (scrapyd and any job left)."""
        process, self.process = self.process, None
        if process is None:
            return
        if self.probe and process.running():
            try:
                self.cancel_all()
            except ScrapydError:
                pass
        process.stop()
        assert not group_alive(process.pid), "scrapyd left a process of its group running"

    def __enter__(self) -> ScrapydNode:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
