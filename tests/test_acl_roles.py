"""The ACL users docs/scale.md gives each role are enough, and no more is needed.

The ACL SETUSER lines are read from the document itself, so the document
cannot drift from what was tried: two workers crawl the demo site as
``bloomcrawl-worker`` (politeness scripts included), the exporter's snapshot
runs as ``bloomcrawl-exporter`` and ``bloomcrawl throttle`` as
``bloomcrawl-operator``; Redis's ACL LOG must stay empty.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bloomcrawl.core.connection import redis_from_url
from bloomcrawl.ops import inspection

from conftest import ROOT
from crawl_helpers import Worker, frontier_left, run_workers

pytestmark = pytest.mark.slow

SCALE_MD = ROOT / "docs" / "scale.md"
PASSWORD = "role-test-pw"


def documented_users() -> dict[str, list[str]]:
    """user -> the ACL SETUSER arguments docs/scale.md gives it."""
    users = {}
    for line in SCALE_MD.read_text().splitlines():
        if line.startswith("ACL SETUSER "):
            words = shlex.split(line)[2:]
            users[words[0]] = [PASSWORD.join(w.split(w[1:]))
                               if re.fullmatch(r">[A-Z_]+", w) else w for w in words[1:]]
    return users


@pytest.fixture
def roles(redis_client: redis.Redis) -> Iterator[dict[str, str]]:
    """The documented users on the test's redis-server: role -> URL."""
    users = documented_users()
    assert set(users) == {"bloomcrawl-worker", "bloomcrawl-exporter", "bloomcrawl-operator"}
    for name, rules in users.items():
        assert ">" + PASSWORD in rules, rules
        redis_client.execute_command("ACL", "SETUSER", name, "reset", *rules)
    redis_client.execute_command("ACL", "LOG", "RESET")
    port = redis_client.connection_pool.connection_kwargs["port"]
    yield {name.removeprefix("bloomcrawl-"): "redis://%s:%s@127.0.0.1:%d/0"
           % (name, PASSWORD, port) for name in users}
    for name in users:
        redis_client.execute_command("ACL", "DELUSER", name)


@pytest.mark.parametrize("demo_site", [{"pages": 300}], indirect=True)
def test_each_role_crawls_reads_and_throttles_with_its_documented_commands(
        redis_client: redis.Redis, roles: dict[str, str], demo_site, tmp_path: Path) -> None:
    redis_client.rpush("site:start_urls", demo_site.url)
    workers = [Worker("w%d" % i, roles["worker"], tmp_path, {
        "DOWNLOAD_DELAY": "0", "SCHEDULER_REAP_INTERVAL": "1"}) for i in range(2)]
    run_workers(workers, timeout=240)
    stats = demo_site.stats()
    assert (stats["missing"], stats["duplicates"]) == (0, 0), stats
    assert frontier_left(redis_client) == 0
    for w in workers:
        assert w.proc.returncode == 0 and "Traceback" not in w.text(), w.text()[-3000:]

    exporter = redis_from_url(roles["exporter"])
    try:
        snap = inspection.snapshot(exporter)
    finally:
        exporter.close()
    [spider] = snap.spiders
    assert spider.problems == [] and spider.politeness is not None
    assert spider.politeness.queued == 0

    host = demo_site.url.split("//")[1].split(":")[0]
    done = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.cli", "throttle", host,
                           "--delay", "1.5", "--redis-url", roles["operator"]],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "delay 1.5 s" in done.stdout, done.stdout
    assert redis_client.execute_command("ACL", "LOG") == []
