"""The ACL users docs/scale.md gives each role are enough, and no more is needed.

The ACL SETUSER lines are read from the document itself, so the document
cannot drift from what was tried: two workers crawl the demo site as
``bloomcrawl-worker`` (politeness scripts included), the exporter's snapshot
runs as ``bloomcrawl-exporter`` and ``bloomcrawl throttle`` as
``bloomcrawl-operator``; Redis's ACL LOG must stay empty. On a Redis with the bf
module, two workers crawl as ``bloomcrawl-worker`` on the bitmap filter its rights allow.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable, Iterator

import pytest
import redis

from bloomcrawl.core.connection import redis_from_url
from bloomcrawl.ops import acl, inspection, scrapyd
from bloomcrawl.ops.cli.target import Target
from bloomcrawl.ops.exporter import ClusterCollector, build_registry
from bloomcrawl.ops.runs import RunStore, check_run
from bloomcrawl.ops.timer import Timer

from kit import ROOT
from kit.checks import assert_crawled_once
from kit.cli import run_cli
from kit.scrapyd import PASSWORD as SCRAPYD_PASSWORD
from kit.scrapyd import USERNAME, ScrapydNode
from kit.wait import wait_until
from kit.workers import WorkerPool, run_workers

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


def test_the_role_users_a_published_redis_gets_are_the_documented_ones() -> None:
    """``up --redis-bind`` creates the users of bloomcrawl.ops.acl: the document's rules."""
    documented = documented_users()
    assert set(documented) == {acl.user_name(role) for role in acl.ROLES}
    for role in acl.ROLES:
        state, password, *rules = documented[acl.user_name(role)]
        assert (state, password) == ("on", ">" + PASSWORD)
        assert rules == acl.rules(role), role
        line = acl.config_line(role, PASSWORD).split()
        assert line[:3] == ["user", acl.user_name(role), "on"] and line[4:] == rules
        assert line[3] == "#" + hashlib.sha256(PASSWORD.encode()).hexdigest()
    # REDIS_WORKER_SPIDERS in .env: the worker reaches those spiders' keys instead
    env = {acl.password_variable(role): PASSWORD for role in acl.ROLES}
    worker = acl.config_lines({**env, "REDIS_WORKER_SPIDERS": "shop, news"})[0].split()
    assert [w for w in worker if w.startswith("~")] == ["~shop:*", "~{shop:*", "~news:*",
                                                         "~{news:*"]
    assert acl.config_lines(env)[0].split()[4:] == acl.rules("worker")


@pytest.fixture
def roles(redis_client: redis.Redis) -> Iterator[dict[str, str]]:
    """The documented users on the test's redis-server: role -> URL."""
    yield from documented_roles(redis_client)


@pytest.fixture
def module_roles(redismod_client: redis.Redis) -> Iterator[dict[str, str]]:
    """The same on a redis-server with the bf module loaded (redis-stack, Redis 8)."""
    yield from documented_roles(redismod_client)


def documented_roles(redis_client: redis.Redis) -> Iterator[dict[str, str]]:
    users = documented_users()
    assert set(users) == {"bloomcrawl-worker", "bloomcrawl-exporter", "bloomcrawl-operator",
                          "bloomcrawl-timer"}
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
def test_the_worker_role_crawls_on_a_redis_with_the_bf_module(
        redismod_client: redis.Redis, module_roles: dict[str, str], demo_site,
        worker_pool: WorkerPool) -> None:
    """The role lists no bf command, so the filter auto makes its user is a bitmap one
    (what to grant is logged); asked once, by the worker that made the filter."""
    redismod_client.rpush("site:start_urls", demo_site.url)
    workers = worker_pool.start_many(2, module_roles["worker"], {"DOWNLOAD_DELAY": "0"})
    run_workers(workers, timeout=240)
    assert_crawled_once(demo_site, redismod_client, workers)
    stored = redismod_client.hget("site:bloomfilter:meta", "params")
    assert stored is not None and b'"backend": "bitmap"' in stored, stored
    assert any("may not run BF.RESERVE" in w.text() for w in workers)
    refused = sorted((e[b"object"], e[b"count"])
                     for e in redismod_client.execute_command("ACL", "LOG"))
    assert refused == [(b"bf.info", 1), (b"bf.insert", 1), (b"bf.mexists", 1),
                       (b"bf.reserve", 1)], refused


@pytest.mark.parametrize("demo_site", [{"pages": 300}], indirect=True)
def test_each_role_crawls_reads_and_throttles_with_its_documented_commands(
        redis_client: redis.Redis, roles: dict[str, str], demo_site,
        worker_pool: WorkerPool, cli_env: dict[str, str]) -> None:
    redis_client.rpush("site:start_urls", demo_site.url)
    workers = worker_pool.start_many(2, roles["worker"], {
        "DOWNLOAD_DELAY": "0", "SCHEDULER_REAP_INTERVAL": "1"})
    run_workers(workers, timeout=240)
    # every page once (nothing missing, nothing twice), the frontier empty, clean exits
    assert_crawled_once(demo_site, redis_client, workers)

    exporter = redis_from_url(roles["exporter"])
    try:
        snap = inspection.snapshot(exporter)
    finally:
        exporter.close()
    [spider] = snap.spiders
    assert spider.problems == [] and spider.politeness is not None
    assert spider.politeness.queued == 0

    host = demo_site.url.split("//")[1].split(":")[0]
    done = run_cli("throttle", host, "--delay", "1.5", "--redis-url", roles["operator"],
                   env=cli_env)
    assert done.code == 0, done.stderr
    assert "delay 1.5 s" in done.stdout, done.stdout
    assert redis_client.execute_command("ACL", "LOG") == []


def test_the_timer_fires_and_the_exporter_reads_schedules_with_their_documented_commands(
        redis_client: redis.Redis, roles: dict[str, str],
        scrapyd_nodes: Callable[..., ScrapydNode], cli_env: dict[str, str]) -> None:
    node = scrapyd_nodes("scrapyd", probe=True)
    made = run_cli("schedule", "--redis-url", roles["operator"], "--name", "hourly", "--every",
                   "1h", "--spider", "sleeper", "--project", "probe", "-a", "seconds=0",
                   "http://127.0.0.1:9/", env=cli_env)
    assert made.code == 0, made.output
    timer_client = redis_from_url(roles["timer"])
    exporter = redis_from_url(roles["exporter"])
    try:
        nodes = [scrapyd.Node(node.url, USERNAME, SCRAPYD_PASSWORD)]
        timer = Timer(timer_client, lambda: Target(roles["timer"], nodes, None, None))
        assert timer.tick() == ["hourly"]
        runs = RunStore(timer_client)
        [run] = runs.recent()
        wait_until(lambda: check_run(timer_client, runs, run, nodes), 60, interval=0.2,
                   what="the run to end")
        registry = build_registry(ClusterCollector(exporter))
        assert registry.get_sample_value("bloomcrawl_up") == 1
        assert registry.get_sample_value("bloomcrawl_schedule_firings_total",
                                         {"schedule": "hourly", "spider": "sleeper"}) == 1
        assert registry.get_sample_value(
            "bloomcrawl_run_running", {"schedule": "hourly", "spider": "sleeper", "ago": "0"}) == 0
    finally:
        timer_client.close()
        exporter.close()
    assert redis_client.lrange("sleeper:start_urls", 0, -1)  # the run's start URL was pushed
    assert redis_client.execute_command("ACL", "LOG") == []
