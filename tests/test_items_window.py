"""The items pipeline stores each item once, remembering ids for a window only.

A page crawled twice (its worker died before the ack) yields the same items
under the same ids: they are stored once. The ids are kept for
REDIS_ITEMS_DEDUP_WINDOW seconds by Redis's clock, so the id zset holds the
ids of that window, not of every item ever stored.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from scrapy import Spider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from bloomcrawl.core import keys
from bloomcrawl.core.errors import SettingError
from bloomcrawl.crawl.pipelines import RedisItemsPipeline
from bloomcrawl.ops.cluster.processes import free_port

from kit.wait import wait_until


class ItemsSpider(Spider):
    name = "items"


def pipeline(redis_url: str, **settings: Any) -> RedisItemsPipeline:
    crawler = get_crawler(ItemsSpider, settings_dict={"REDIS_URL": redis_url, **settings})
    crawler.spider = ItemsSpider.from_crawler(crawler)
    built = build_from_crawler(RedisItemsPipeline, crawler)
    built.open_spider()
    return built


def store(p: RedisItemsPipeline, origin: str, item: dict[str, Any]) -> bool:
    """What the pipeline does, off the reactor, for an item tagged with ``origin``."""
    return p.push(origin, json.dumps(item))


@pytest.fixture
def items_keys() -> tuple[str, str, str]:
    items = "items:items"
    return items, keys.item_ids_key(items), keys.recent_item_ids_key(items)


def test_an_item_yielded_again_within_the_window_is_stored_once(
        redis_server, redis_client: redis.Redis, items_keys: tuple[str, str, str]) -> None:
    items, old_ids, recent = items_keys
    p = pipeline(redis_server.url)
    stored = [store(p, origin, {"o": origin}) for _ in range(2)  # the page crawled twice
              for origin in ("fp1:0", "fp1:1")]
    assert stored == [True, True, False, False]
    assert redis_client.llen(items) == 2
    assert redis_client.zcard(recent) == 2 and not redis_client.exists(old_ids)
    p.server.close()


def test_ids_older_than_the_window_are_dropped(
        redis_server, redis_client: redis.Redis, items_keys: tuple[str, str, str]) -> None:
    items, _, recent = items_keys
    p = pipeline(redis_server.url, REDIS_ITEMS_DEDUP_WINDOW=0.3)
    for i in range(50):
        store(p, "old:%d" % i, {"n": i})
    assert redis_client.zcard(recent) == 50
    # past the window, the next push drops every older id: the zset follows the window
    assert wait_until(lambda: redis_client.time()[0] * 1000 + redis_client.time()[1] // 1000
                      > int(redis_client.zrange(recent, -1, -1, withscores=True)[0][1]) + 300,
                      timeout=5)
    store(p, "new:0", {"n": "new"})
    assert redis_client.zrange(recent, 0, -1) == [b"new:0"]
    # an id of before the window is stored again: the bound the README states
    assert store(p, "old:0", {"n": 0}) is True
    assert redis_client.llen(items) == 52
    p.server.close()


def test_ids_of_the_set_of_before_still_count(
        redis_server, redis_client: redis.Redis, items_keys: tuple[str, str, str]) -> None:
    items, old_ids, recent = items_keys
    redis_client.sadd(old_ids, "fp9:0")  # stored by a version that kept every id
    p = pipeline(redis_server.url)
    assert store(p, "fp9:0", {"n": 0}) is False
    assert store(p, "fp9:1", {"n": 1}) is True
    assert redis_client.llen(items) == 1
    assert redis_client.scard(old_ids) == 1  # read, never written
    assert redis_client.zrange(recent, 0, -1) == [b"fp9:1"]
    p.server.close()


@pytest.mark.parametrize("window", ["0", "-1", "a week"])
def test_a_bad_window_is_a_setting_error(redis_server, window: str) -> None:
    with pytest.raises(SettingError, match="REDIS_ITEMS_DEDUP_WINDOW"):
        pipeline(redis_server.url, REDIS_ITEMS_DEDUP_WINDOW=window)


def test_the_window_counts_from_redis_time(redis_server, redis_client: redis.Redis,
                                           items_keys: tuple[str, str, str]) -> None:
    _, _, recent = items_keys
    p = pipeline(redis_server.url)
    store(p, "fp:0", {"n": 0})
    ((_, score),) = redis_client.zrange(recent, 0, -1, withscores=True)
    seconds, micros = redis_client.time()
    assert abs(seconds * 1000 + micros // 1000 - score) < 5_000
    p.server.close()


def test_the_stored_mark_is_the_last_item_written(
        redis_server, redis_client: redis.Redis, items_keys: tuple[str, str, str]) -> None:
    """What a worker whose Redis restarted asks the new server for: the id of the last
    item the pipeline wrote (an item already stored writes nothing), in the id zset."""
    _, _, recent = items_keys
    p = pipeline(redis_server.url)
    mark = p.mark
    assert mark is not None and mark.ids_key == recent and mark.last_id is None
    assert p.push_many([("fp1:0", "{}"), ("fp1:1", "{}")]) == [True, True]
    assert mark.last_id == "fp1:1" and not mark.in_flight
    assert p.push_many([("fp2:0", "{}"), ("fp1:0", "{}")]) == [True, False]
    assert mark.last_id == "fp2:0"  # fp1:0 was stored before: not a write
    assert redis_client.zscore(recent, mark.last_id) is not None
    p.server.close()


def test_a_call_whose_reply_was_lost_answers_what_its_first_send_did(
        redis_server, redis_client: redis.Redis, items_keys: tuple[str, str, str]) -> None:
    """The pipeline sends a call again when its reply is lost (here: applied by Redis,
    the reply swallowed by the proxy, the connection closed). The first send stored the
    item: "already stored" would leave the stored mark on the item before, and a restart
    from a snapshot taken between the two would look as if it had lost nothing of this
    worker's."""
    from faults.proxy import FaultProxy

    items, _, recent = items_keys
    with FaultProxy(redis_server.port) as proxy:
        p = pipeline(proxy.url)
        mark = p.mark
        assert mark is not None
        assert p.push_many([("fp:0", '{"o":0}')]) == [True]
        proxy.drop_replies(b"fp:1")
        token = p.new_token()
        with pytest.raises(redis.ConnectionError):
            p.push_many([("fp:1", '{"o":1}')], token)
        assert proxy.drops_pending == 0 and redis_client.llen(items) == 2  # it was stored
        # sent again with its token, as the pipeline's retry does: what the first send did
        assert p.push_many([("fp:1", '{"o":1}')], token) == [True]
        assert mark.last_id == "fp:1"
        assert redis_client.lrange(items, 0, -1) == [b'{"o":0}', b'{"o":1}']  # once each
        # a new call of the same items is told they were stored before
        assert p.push_many([("fp:1", '{"o":1}')]) == [False]
        token = p.new_token()
        assert p.push_many([("fp:2", "{}"), ("fp:0", "{}")], token) == [True, False]
        assert p.push_many([("fp:2", "{}"), ("fp:0", "{}")], token) == [True, False]
        assert p.push_many([("fp:2", "{}")]) == [False]
        assert mark.last_id == "fp:2" and redis_client.llen(items) == 3
        assert redis_client.zcard(recent) == 3
        # the record of the pipeline's last call expires after the retries' time
        record_ttl = redis_client.pttl(p.record_key)
        assert 0 < record_ttl <= p.record_ms
        p.server.close()


def test_the_stored_mark_tells_what_a_restarted_server_lost_of_each_server(
        tmp_path) -> None:
    """The pipeline's connection is not the scheduler's: it may store items on the new
    server before the scheduler asks. The last item written to the old server is what
    tells whether the restart lost items, not the last one written."""
    from kit.redis import RedisServer

    server = RedisServer(tmp_path / "r")
    server.start()
    try:
        p = pipeline(server.url)
        mark = p.mark
        assert mark is not None
        assert p.push_many([("fp:0", "{}")]) == [True]
        server.bgsave()  # fp:0 is in the snapshot
        assert p.push_many([("fp:1", "{}")]) == [True]  # and fp:1 is not
        old = mark.server
        server.kill()
        server.start()  # from the snapshot
        stored: list[bool] = []

        def pushed() -> bool:
            try:
                stored.extend(p.push_many([("fp:2", "{}")]))
            except redis.ConnectionError:
                return False  # the old connection's error; the next one reaches the new server
            return True

        wait_until(pushed, 5, what="an item stored on the new server")
        assert stored == [True]
        client = server.client()
        new = client.info("server")["run_id"]
        assert old and mark.server == new != old
        assert mark.last_ids == {old: "fp:1", new: "fp:2"}
        assert client.zscore(mark.ids_key, "fp:2") is not None  # the last item written is there
        unreachable = redis.Redis(port=free_port(), socket_connect_timeout=1)
        with pytest.raises(redis.ConnectionError):
            mark.kept_on(unreachable, new)
        assert mark.last_ids == {old: "fp:1", new: "fp:2"}  # not answered: asked again
        assert not mark.kept_on(client, new)  # fp:1, the old server's last, is not
        assert mark.last_ids == {new: "fp:2"}  # the old server is asked once
        assert mark.kept_on(client, new)
        server.bgsave()
        server.kill()
        server.start()  # from a snapshot that holds every item
        assert mark.kept_on(client, client.info("server")["run_id"])
        client.close()
        p.server.close()
    finally:
        server.stop()
