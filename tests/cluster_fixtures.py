"""What the exporter and monitoring tests build on: a frontier in Redis, a real scrapyd.

``populate_frontier`` writes a spider's frontier the way the scheduler lays it
out (keys from :mod:`bloomcrawl.core.keys`), with a real Bloom filter, so these
tests do not depend on the scheduler.

``scrapyd_node`` is a real scrapyd process on a free 127.0.0.1 port, with basic
auth and a tiny project ``probe`` whose spider ``sleeper`` sleeps in its
constructor: with ``max_proc = 1`` a test gets a running and a pending job on
demand. It is started by the project's process manager
(:mod:`bloomcrawl.ops.cluster.processes`) in a process group of its own, and
that group (scrapyd and the jobs it spawned) is stopped by pid at teardown.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.ops.cluster.processes import ManagedProcess, free_port, start_scrapyd
from bloomcrawl.ops.scrapyd import Node, ScrapydError

STATS = {
    "pages": 42,
    "items": 40,
    "filtered": 97,
    "requeued": 3,
    "errors": 2,
    "bad_start_urls": 1,
    "unserializable": 4,
    "local": 5,
}
#: ``<spider>:pages_by_node``: worker host name -> pages (they add up to STATS["pages"])
NODE_PAGES = {"worker-a": 30, "worker-b": 12}


@dataclass
class Frontier:
    """What :func:`populate_frontier` wrote, for the tests to compare with."""

    spider: str
    bloom: BloomFilter
    frontier: keys.FrontierKeys
    queue_length: int
    leased: int
    leases_expired: int
    start_urls: int
    items_stored: int
    stats: dict[str, int]
    pages_by_node: dict[str, int]


def fingerprints(n: int, salt: str = "") -> list[bytes]:
    return [hashlib.sha1(f"{salt}{i}".encode()).digest() for i in range(n)]


def populate_frontier(
    client: redis.Redis,
    spider: str = "site",
    *,
    queue_type: str = "priority",
    partitions: int = 4,
    capacity: int = 10_000,
    urls: int = 300,
    duplicates: int = 100,
    backend: str = "bitmap",
) -> Frontier:
    """A filter holding ``urls`` fingerprints (``duplicates`` of them added twice),
    a queue of 7 requests over the partitions, 3 leases (1 expired), stats, pages
    per worker host, start URLs and items, laid out as the scheduler records them
    in the meta hash.
    """
    frontier = keys.FrontierKeys(spider, partitions=partitions)
    bloom = BloomFilter(client, frontier.filter, capacity=capacity, error_rate=0.01,
                        partitions=partitions, backend=backend)
    fps = fingerprints(urls, salt=spider)
    bloom.add_many(fps + fps[:duplicates])
    client.hset(frontier.meta, mapping={
        "spider": spider, "queue": frontier.queue, "queue_type": queue_type,
        "stats": frontier.stats, "start_urls": frontier.start_urls, "items": frontier.items,
        "pages_by_node": frontier.pages_by_node,
    })
    queue_length = 0
    for i in range(7):
        payload = json.dumps({"url": f"http://127.0.0.1/{spider}/{i}", "priority": i % 3})
        key = frontier.queue_part(i % partitions)
        if queue_type == "priority":
            client.zadd(key, {payload: -(i % 3)})
        else:
            client.rpush(key, payload)
        queue_length += 1
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    deadlines = {"w1:1:a": now_ms + 600_000, "w1:1:b": now_ms + 600_000, "w2:7:a": now_ms - 5}
    for n, (token, deadline) in enumerate(deadlines.items()):
        p = n % partitions
        client.hset(frontier.leases(p), token, json.dumps({"url": f"http://127.0.0.1/l/{n}"}))
        client.zadd(frontier.deadlines(p), {token: deadline})
    client.hset(frontier.stats, mapping=STATS)
    client.hset(frontier.pages_by_node, mapping=NODE_PAGES)
    client.rpush(frontier.start_urls, "http://127.0.0.1/a", '{"url": "http://127.0.0.1/b"}')
    client.rpush(frontier.items, *[json.dumps({"n": n}) for n in range(5)])
    return Frontier(spider=spider, bloom=bloom, frontier=frontier, queue_length=queue_length,
                    leased=3, leases_expired=1, start_urls=2, items_stored=5, stats=dict(STATS),
                    pages_by_node=dict(NODE_PAGES))


SCRAPYD_USER = "probe-user"
SCRAPYD_PASSWORD = "probe-secret"

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


class Sleeper(scrapy.Spider):
    name = "sleeper"

    def __init__(self, *args, seconds="60", **kwargs):
        super().__init__(*args, **kwargs)
        time.sleep(float(seconds))
"""


class ScrapydNode:
    """A scrapyd process this test session owns."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.username = SCRAPYD_USER
        self.password = SCRAPYD_PASSWORD
        self.node = Node(self.url, self.username, self.password)
        self.process: ManagedProcess | None = None

    def start(self) -> None:
        work = self.workdir
        (work / "probe" / "spiders").mkdir(parents=True, exist_ok=True)
        (work / "probe" / "__init__.py").write_text("")
        (work / "probe" / "settings.py").write_text(PROBE_SETTINGS)
        (work / "probe" / "spiders" / "__init__.py").write_text(PROBE_SPIDER)
        (work / "scrapy.cfg").write_text("[settings]\nprobe = probe.settings\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPYD_")}
        env["HOME"] = str(work / "home")
        env["PYTHONPATH"] = str(work)
        env.pop("SCRAPY_SETTINGS_MODULE", None)
        self.process = start_scrapyd(
            work, port=self.port, username=self.username, password=self.password, env=env,
            log=work / "scrapyd.log", timeout=30, settings={
                "max_proc": 1, "poll_interval": 0.2, "eggs_dir": work / "eggs",
                "logs_dir": work / "logs", "dbs_dir": work / "dbs",
            })

    def get(self, path: str) -> dict[str, Any]:
        return self.node.request(path, timeout=5)

    def post(self, path: str, **data: str) -> dict[str, Any]:
        return self.node.request(path, data, timeout=5)

    def schedule(self, seconds: float = 60) -> str:
        answer = self.post("schedule.json", project="probe", spider="sleeper",
                           seconds=str(seconds))
        assert answer["status"] == "ok", answer
        return str(answer["jobid"])

    def wait_for(self, *, running: int, pending: int, timeout: float = 60) -> dict[str, Any]:
        """Poll daemonstatus.json until it shows these counts."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.get("daemonstatus.json")
            if status["running"] == running and status["pending"] == pending:
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"scrapyd never showed running={running}"
                                     f" pending={pending}: {status}")
            time.sleep(0.2)

    def cancel_all(self) -> None:
        jobs = self.get("listjobs.json?project=probe")
        for job in jobs.get("pending", []) + jobs.get("running", []):
            self.post("cancel.json", project="probe", job=job["id"])

    def stop(self) -> None:
        """Cancel its jobs, then stop its process group (scrapyd and any job left)."""
        if self.process is None:
            return
        if self.process.running():
            try:
                self.cancel_all()
            except ScrapydError:
                pass
        self.process.stop()
        self.process = None


@pytest.fixture(scope="session", name="scrapyd_node")
def scrapyd_node_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScrapydNode]:
    """A running scrapyd with basic auth; tests leave it with no jobs running or pending."""
    node = ScrapydNode(tmp_path_factory.mktemp("scrapyd"))
    node.start()
    yield node
    node.stop()
