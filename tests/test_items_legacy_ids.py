"""The id set of earlier versions is bounded by the dedup window, and a window shorter
than a lease is warned about.

Earlier versions kept every item's id in the set ``{<items>}:ids``. It is still read,
so what it holds stays stored once, and the first push that finds it without an expiry
gives it one of one window: its ids are all older than the window by then. A window
shorter than SCHEDULER_LEASE_TIMEOUT cannot keep "stored once" for a page whose worker
died, crawled again only after its lease expired: the pipeline says so as it starts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import redis
from test_items_window import pipeline

from bloomcrawl.core import keys
from bloomcrawl.ops import acl

from kit.wait import wait_until

ITEMS = "items:items"
LEGACY = keys.item_ids_key(ITEMS)
RECENT = keys.recent_item_ids_key(ITEMS)
PIPELINE_LOGGER = "bloomcrawl.crawl.pipelines"


def test_the_first_push_gives_the_set_of_before_an_expiry_of_one_window(
        redis_server, redis_client: redis.Redis) -> None:
    redis_client.sadd(LEGACY, "fp9:0", "fp9:1")  # stored by a version that kept every id
    p = pipeline(redis_server.url, REDIS_ITEMS_DEDUP_WINDOW=3600)
    assert redis_client.pttl(LEGACY) == -1
    assert p.push("fp8:0", "{}") is True  # any push, not only one of its ids
    ttl = redis_client.pttl(LEGACY)
    assert 3_595_000 < ttl <= 3_600_000
    # until it expires, its ids are still stored once
    assert p.push("fp9:0", '{"n": 0}') is False
    assert p.push_many([("fp9:1", "{}"), ("fp9:2", "{}")]) == [False, True]
    assert redis_client.llen(ITEMS) == 2 and redis_client.scard(LEGACY) == 2
    # later pushes leave its expiry as the first set it: it is not renewed
    wait_until(lambda: redis_client.pttl(LEGACY) < ttl - 50, timeout=5)
    before = redis_client.pttl(LEGACY)
    p.push("fp8:1", "{}")
    assert 0 < redis_client.pttl(LEGACY) <= before
    p.server.close()


def test_the_set_of_before_expires_one_window_after_the_first_push(
        redis_server, redis_client: redis.Redis) -> None:
    redis_client.sadd(LEGACY, "old:0")
    p = pipeline(redis_server.url, REDIS_ITEMS_DEDUP_WINDOW=0.5)
    assert p.push("new:0", "{}") is True
    assert p.push("old:0", '{"n": 0}') is False  # within the window: stored once
    assert wait_until(lambda: not redis_client.exists(LEGACY), timeout=5)
    # past the window, its ids are stored again, as the zset's own would be
    assert p.push("old:0", '{"n": 0}') is True
    assert redis_client.lrange(ITEMS, 0, -1) == [b"{}", json.dumps({"n": 0}).encode()]
    assert not redis_client.exists(LEGACY)  # never made again
    p.server.close()


def test_a_set_that_has_an_expiry_keeps_it(redis_server, redis_client: redis.Redis) -> None:
    redis_client.sadd(LEGACY, "old:0")
    redis_client.pexpire(LEGACY, 60_000)  # one an operator gave it
    p = pipeline(redis_server.url, REDIS_ITEMS_DEDUP_WINDOW=3600)
    assert p.push("old:0", "{}") is False
    assert 55_000 < redis_client.pttl(LEGACY) <= 60_000
    p.server.close()


@pytest.fixture
def worker_url(redis_server, redis_client: redis.Redis) -> Iterator[str]:
    """The URL of the worker role's ACL user (docs/scale.md, bloomcrawl.ops.acl) for the
    spider ``items``."""
    redis_client.execute_command("ACL", "SETUSER", "legacy-ids-worker", "reset", "on",
                                 ">pw", *acl.rules("worker", ["items"]))
    redis_client.execute_command("ACL", "LOG", "RESET")
    yield "redis://legacy-ids-worker:pw@127.0.0.1:%d/0" % redis_server.port
    redis_client.execute_command("ACL", "DELUSER", "legacy-ids-worker")


def test_the_worker_role_may_give_the_set_its_expiry(
        worker_url: str, redis_client: redis.Redis) -> None:
    redis_client.sadd(LEGACY, "old:0")
    p = pipeline(worker_url, REDIS_ITEMS_DEDUP_WINDOW=3600)
    assert p.push_many([("old:0", "{}"), ("new:0", "{}")]) == [False, True]
    assert redis_client.pttl(LEGACY) > 0
    assert redis_client.execute_command("ACL", "LOG") == []
    p.server.close()


def test_a_worker_user_made_before_the_role_had_pexpire_keeps_storing_items(
        redis_server, redis_client: redis.Redis) -> None:
    """An upgrade that leaves the ACL users as they were: items are stored, once, and
    the set of before keeps no expiry until the command is added to the user."""
    rules = [r for r in acl.rules("worker", ["items"]) if r != "+pexpire"]
    assert len(rules) == len(acl.rules("worker", ["items"])) - 1
    redis_client.execute_command("ACL", "SETUSER", "old-worker", "reset", "on", ">pw", *rules)
    try:
        for legacy in (False, True):
            if legacy:
                redis_client.sadd(LEGACY, "old:0")
            p = pipeline("redis://old-worker:pw@127.0.0.1:%d/0" % redis_server.port,
                         REDIS_ITEMS_DEDUP_WINDOW=3600)
            assert p.push_many([("old:0", "{}"), ("new:%s" % legacy, "{}")]) == [
                not legacy, True]
            assert redis_client.pttl(LEGACY) == (-1 if legacy else -2)
            p.server.close()
    finally:
        redis_client.execute_command("ACL", "DELUSER", "old-worker")


@pytest.mark.parametrize(("settings", "warned"), [
    ({"REDIS_ITEMS_DEDUP_WINDOW": 10, "SCHEDULER_LEASE_TIMEOUT": 30}, True),
    ({"REDIS_ITEMS_DEDUP_WINDOW": 29.5}, True),  # the default lease timeout, 30 s
    ({"REDIS_ITEMS_DEDUP_WINDOW": 30, "SCHEDULER_LEASE_TIMEOUT": 30}, False),
    ({"REDIS_ITEMS_DEDUP_WINDOW": 1, "SCHEDULER_LEASE_TIMEOUT": 0.5}, False),
    ({}, False),  # 7 days
])
def test_a_window_shorter_than_a_lease_is_warned_about(
        redis_server, caplog: pytest.LogCaptureFixture, settings: dict[str, float],
        warned: bool) -> None:
    with caplog.at_level(logging.WARNING, logger=PIPELINE_LOGGER):
        p = pipeline(redis_server.url, **settings)
    found = [r.getMessage() for r in caplog.records
             if r.name == PIPELINE_LOGGER and r.levelno == logging.WARNING
             and "REDIS_ITEMS_DEDUP_WINDOW" in r.getMessage()]
    if warned:
        window = settings["REDIS_ITEMS_DEDUP_WINDOW"]
        lease = settings.get("SCHEDULER_LEASE_TIMEOUT", 30)
        assert len(found) == 1
        assert "REDIS_ITEMS_DEDUP_WINDOW (%gs)" % window in found[0]
        assert "SCHEDULER_LEASE_TIMEOUT (%gs)" % lease in found[0]
        assert "stored twice" in found[0]
    else:
        assert found == []
    p.server.close()
