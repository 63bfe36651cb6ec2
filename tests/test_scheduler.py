"""The scheduler's Redis protocol, built through Scrapy's real factories."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from bloomcrawl.core import keys
from bloomcrawl.core.errors import SettingError
from bloomcrawl.core.start_entries import parse_start_entry
from bloomcrawl.crawl.lease import LEASE_META_KEY, request_finished
from bloomcrawl.crawl.scheduler import Scheduler
from bloomcrawl.crawl.serialization import (
    UnreadableRequest,
    UnserializableRequest,
    request_from_json,
    request_to_json,
)

from conftest import disconnect_at_teardown


class DemoSpider(Spider):
    name = "unit"

    def parse(self, response: Any, **kwargs: Any) -> None:
        pass

    def parse_item(self, response: Any, page: int = 0) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass


def make_scheduler(redis_url: str, spider_cls: type[DemoSpider] | None = None,
                   **settings: Any) -> Scheduler:
    """An opened scheduler of ``spider_cls`` (DemoSpider) on ``redis_url``."""
    cls = spider_cls or DemoSpider
    base = {
        "REDIS_URL": redis_url,
        "BLOOMFILTER_CAPACITY": 10_000,
        "BLOOMFILTER_ERROR_RATE": 0.001,
        "BLOOMFILTER_PARTITIONS": 2,
        "SCHEDULER_LEASE_TIMEOUT": 5,
    }
    crawler = get_crawler(cls, settings_dict={**base, **settings})
    crawler._apply_settings()
    spider = cls.from_crawler(crawler)
    crawler.spider = spider
    scheduler = build_from_crawler(Scheduler, crawler)
    disconnect_at_teardown(scheduler.server)  # before open_frontier, which may raise
    scheduler.open_frontier(spider)
    return scheduler


def finish(s: Scheduler, request: Request, outcome: str = "response") -> None:
    """What the middlewares do when a leased request's outcome is final."""
    s.crawler.signals.send_catch_log(request_finished, request=request, outcome=outcome)


@pytest.fixture
def scheduler(redis_server, redis_client) -> Iterator[Scheduler]:
    yield make_scheduler(redis_server.url)


def drain(s: Scheduler) -> list[Request]:
    out = []
    while (r := s.next_request()) is not None:
        out.append(r)
    return out


def test_enqueue_if_new_filters_duplicates_but_not_dont_filter(scheduler: Scheduler) -> None:
    for _ in range(2):
        scheduler.enqueue_request(Request("http://a.test/1"))
        scheduler.enqueue_request(Request("http://a.test/1#fragment"))  # same fingerprint
        scheduler.enqueue_request(Request("http://a.test/2", dont_filter=True))
    scheduler.send_pending()
    urls = sorted(r.url for r in drain(scheduler))
    assert urls == ["http://a.test/1", "http://a.test/2", "http://a.test/2"]
    assert scheduler.stats.get_value("dupefilter/filtered") == 3
    # one exchange: the worker leaves out the copies itself, the filter sees each once
    assert scheduler.bloom.info().filtered == 0


def test_priority_order_and_callbacks_survive_the_queue(scheduler: Scheduler) -> None:
    scheduler.enqueue_request(Request("http://a.test/low", priority=-5))
    scheduler.enqueue_request(Request("http://a.test/high", priority=10,
                                      callback=scheduler.spider.parse_item,
                                      errback=scheduler.spider.on_error,
                                      cb_kwargs={"page": 3}, meta={"depth": 2}))
    scheduler.enqueue_request(Request("http://a.test/mid"))
    scheduler.send_pending()
    got = drain(scheduler)
    # priority holds within a partition; across partitions, roughly: check the top one
    assert got[0].url == "http://a.test/high"
    high = got[0]
    assert high.callback == scheduler.spider.parse_item
    assert high.errback == scheduler.spider.on_error
    assert high.cb_kwargs == {"page": 3}
    assert high.meta["depth"] == 2
    assert LEASE_META_KEY in high.meta


@pytest.mark.parametrize(("queue_class", "expected"), [
    ("fifo", ["http://a.test/0", "http://a.test/1", "http://a.test/2"]),
    ("scrapy_redis.queue.LifoQueue", ["http://a.test/2", "http://a.test/1", "http://a.test/0"]),
])
def test_fifo_and_lifo(redis_server, redis_client, queue_class, expected) -> None:
    s = make_scheduler(redis_server.url, SCHEDULER_QUEUE_CLASS=queue_class,
                       BLOOMFILTER_PARTITIONS=1)
    for i in range(3):
        s.enqueue_request(Request("http://a.test/%d" % i))
    s.send_pending()
    assert [r.url for r in drain(s)] == expected


def test_unknown_queue_class_is_a_setting_error(redis_server, redis_client) -> None:
    with pytest.raises(SettingError, match="SCHEDULER_QUEUE_CLASS 'heap'"):
        make_scheduler(redis_server.url, SCHEDULER_QUEUE_CLASS="heap")


def test_changing_queue_type_of_a_nonempty_queue_is_refused(redis_server, redis_client) -> None:
    s = make_scheduler(redis_server.url)
    s.enqueue_request(Request("http://a.test/1"))
    s.send_pending()
    with pytest.raises(SettingError, match="holds a priority queue, asked for fifo"):
        make_scheduler(redis_server.url, SCHEDULER_QUEUE_CLASS="fifo")


def test_leased_request_stays_in_redis_until_acked(scheduler: Scheduler, redis_client) -> None:
    scheduler.enqueue_request(Request("http://a.test/1"))
    scheduler.send_pending()
    request = drain(scheduler)[0]
    f = scheduler.frontier.keys
    held = sum(redis_client.zcard(f.deadlines(p)) for p in range(f.partitions))
    assert (held, scheduler.frontier.size()) == (1, 0)
    finish(scheduler, request)
    scheduler.send_pending()
    held = sum(redis_client.zcard(f.deadlines(p)) + redis_client.hlen(f.leases(p))
               for p in range(f.partitions))
    assert held == 0
    assert int(redis_client.hget(f.stats, "pages")) == 1
    import socket

    assert int(redis_client.hget(f.pages_by_node, socket.gethostname())) == 1


def test_expired_lease_is_requeued_and_old_holder_cannot_ack_it(redis_server, redis_client) -> None:
    first = make_scheduler(redis_server.url, SCHEDULER_LEASE_TIMEOUT=0.2)
    first.enqueue_request(Request("http://a.test/slow"))
    first.send_pending()
    stale = drain(first)[0]
    time.sleep(0.3)
    second = make_scheduler(redis_server.url, SCHEDULER_LEASE_TIMEOUT=5)
    # opening reaped the expired lease already: nothing is left to reap
    assert second.frontier.reap() == 0
    fresh = drain(second)
    assert [r.url for r in fresh] == ["http://a.test/slow"]
    assert int(redis_client.hget(second.frontier.keys.stats, "requeued")) == 1
    # the first worker finishes late: its ack must not touch the second worker's lease
    finish(first, stale)
    first.send_pending()
    f = second.frontier.keys
    assert sum(redis_client.zcard(f.deadlines(p)) for p in range(f.partitions)) == 1
    finish(second, fresh[0])
    second.send_pending()
    assert sum(redis_client.zcard(f.deadlines(p)) for p in range(f.partitions)) == 0


def test_renewal_keeps_a_slow_request_from_being_handed_on(redis_server, redis_client) -> None:
    holder = make_scheduler(redis_server.url, SCHEDULER_LEASE_TIMEOUT=1.5)
    holder.enqueue_request(Request("http://a.test/slow"))
    holder.send_pending()
    drain(holder)
    f = holder.frontier
    (deadlines,) = [f.keys.deadlines(p) for p in range(f.partitions)
                    if redis_client.zcard(f.keys.deadlines(p))]
    other = make_scheduler(redis_server.url, SCHEDULER_LEASE_TIMEOUT=1.5)
    last = redis_client.zrange(deadlines, 0, 0, withscores=True)[0][1]
    started = time.monotonic()
    while time.monotonic() - started < 3.5:  # more than twice the lease
        time.sleep(0.3)  # renewing every 0.3 s leaves 1.2 s for a loaded machine's delays
        holder.renew()
        deadline = redis_client.zrange(deadlines, 0, 0, withscores=True)[0][1]
        assert deadline > last  # each renewal moved the deadline on
        last = deadline
        assert other.frontier.reap() == 0
    assert drain(other) == []


def test_close_puts_unprocessed_leases_back(redis_server, redis_client) -> None:
    s = make_scheduler(redis_server.url)
    for i in range(3):
        s.enqueue_request(Request("http://a.test/%d" % i))
    s.send_pending()
    drain(s)
    s.close("shutdown")
    other = make_scheduler(redis_server.url)
    assert sorted(r.url for r in drain(other)) == ["http://a.test/0", "http://a.test/1",
                                                   "http://a.test/2"]


def test_a_request_the_queue_cannot_hold_is_named_by_its_key_and_kept(
        scheduler: Scheduler) -> None:
    assert scheduler.enqueue_request(Request("http://a.test/x", meta={"sock": object()})) is True
    assert scheduler.stats.get_value("bloomcrawl/local_requests") == 1
    assert scheduler.frontier.size(with_leases=True) == 0
    with pytest.raises(UnserializableRequest, match=r"meta\['sock'\]"):
        request_to_json(Request("http://a.test/x", meta={"sock": object()}), scheduler.spider)
    with pytest.raises(UnserializableRequest, match=r"cb_kwargs\['n'\]\['f'\]"):
        request_to_json(Request("http://a.test/x", cb_kwargs={"n": {"f": open}}),
                        scheduler.spider)


def test_request_json_round_trip(scheduler: Scheduler) -> None:
    spider = scheduler.spider
    original = Request("http://a.test/form", method="POST", body=b"\x00\xffa=1",
                       headers={"X-Test": "v1"}, cookies={"c": "1"}, priority=3,
                       meta={"nested": {"a": [1, 2]}}, callback=spider.parse_item)
    text = request_to_json(original, spider)
    # stored as plain JSON: text anyone can read, with the callback by name, never code
    stored = json.loads(text)
    assert stored["url"] == "http://a.test/form"
    assert stored["callback"] == "parse_item"
    assert base64.b64decode(stored["body"]) == b"\x00\xffa=1"
    assert stored["meta"] == {"nested": {"a": [1, 2]}}
    copy = request_from_json(text, spider)
    assert (copy.url, copy.method, copy.body, copy.priority) == (
        original.url, original.method, original.body, original.priority)
    assert copy.headers.get("X-Test") == b"v1"
    assert copy.meta == {"nested": {"a": [1, 2]}}
    assert copy.callback == spider.parse_item


@pytest.mark.parametrize(("entry", "message"), [
    ("not a url", "not an http"),
    ("ftp://x.test/", "not an http"),
    ('{"url": 5}', "no url"),
    ('{"url": "http://x.test/", "priority": "high"}', "priority"),
    ('{"url": "http://x.test/", "meta": []}', "meta"),
    ('{"url": "http://x.test/", "colour": 1}', "unknown fields"),
    ("[1, 2]", "not an http"),
])
def test_bad_start_entries(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_start_entry(entry)


def test_start_entries() -> None:
    assert parse_start_entry(b" http://x.test/a ")["url"] == "http://x.test/a"
    data = parse_start_entry('{"url": "https://x.test/", "meta": {"k": 1}, "priority": 5}')
    assert data == {"url": "https://x.test/", "meta": {"k": 1}, "priority": 5}


def test_layout_recorded_for_the_exporter(scheduler: Scheduler, redis_client) -> None:
    meta = {k.decode(): v.decode() for k, v in
            redis_client.hgetall(keys.meta_key("unit:bloomfilter")).items()}
    assert meta["spider"] == "unit"
    assert meta["queue"] == "unit:requests"
    assert meta["queue_type"] == "priority"
    assert meta["stats"] == "unit:stats"


def test_unreachable_redis_names_the_url(closed_port_url: str) -> None:
    from bloomcrawl.core.errors import RedisUnavailableError

    with pytest.raises(RedisUnavailableError, match=closed_port_url.replace("/0", "")):
        make_scheduler(closed_port_url)


def test_malformed_redis_url_is_a_setting_error() -> None:
    with pytest.raises(SettingError, match="REDIS_URL 'http://x'"):
        make_scheduler("http://x")
    with pytest.raises(SettingError, match="BLOOMFILTER_CAPACITY must be an integer"):
        make_scheduler("redis://127.0.0.1:1/0", BLOOMFILTER_CAPACITY="lots")


def test_redis_down_while_crawling_keeps_pending_work(tmp_path) -> None:
    from bloomcrawl.core.errors import RedisUnavailableError

    from kit.redis import RedisServer

    server = RedisServer(tmp_path / "r", appendonly=True)
    server.start()
    try:
        s = make_scheduler(server.url)
        s.enqueue_request(Request("http://a.test/1"))
        server.stop()
        with pytest.raises(RedisUnavailableError):
            s.send_pending()
        assert s.next_request() is None  # the engine is told "nothing now", not an error
        assert s.has_pending_requests()
        server.start()
        # the request was kept in the worker and is sent with the next lease
        assert [r.url for r in drain(s)] == ["http://a.test/1"]
    finally:
        server.stop()


def test_duplicates_this_worker_already_sent_cost_no_round_trip(scheduler: Scheduler,
                                                                 redis_client) -> None:
    scheduler.enqueue_request(Request("http://a.test/1"))
    scheduler.send_pending()
    calls_before = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    checked_before = scheduler.bloom.info().checked
    assert scheduler.enqueue_request(Request("http://a.test/1#again")) is False
    assert scheduler.enqueue_request(Request("http://a.test/1", dont_filter=True)) is True
    scheduler.send_pending()
    calls_after = redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]
    # only the dont_filter request was sent (one enqueue call), with the shared stats
    # (one call); the duplicate never reached the filter
    assert calls_after == calls_before + 2
    assert scheduler.bloom.info().checked == checked_before
    assert scheduler.stats.get_value("bloomcrawl/filtered_locally") == 1
    assert sorted(r.url for r in drain(scheduler)) == ["http://a.test/1", "http://a.test/1"]


def test_filter_deleted_mid_crawl_is_created_again(scheduler: Scheduler) -> None:
    scheduler.enqueue_request(Request("http://a.test/1"))
    scheduler.send_pending()
    scheduler.bloom.clear()
    scheduler.enqueue_request(Request("http://a.test/2"))
    scheduler.send_pending()
    assert scheduler.bloom.info().items == 1  # a new, empty filter holding /2
    # what this worker remembered was forgotten with the filter
    assert scheduler.enqueue_request(Request("http://a.test/1")) is True


def test_ack_rides_with_the_next_lease(redis_server, redis_client) -> None:
    scheduler = make_scheduler(redis_server.url, BLOOMFILTER_PARTITIONS=1)
    for i in range(2):
        scheduler.enqueue_request(Request("http://a.test/%d" % i))
    scheduler.send_pending()
    first = scheduler.next_request()
    assert first is not None
    finish(scheduler, first)
    before = redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]
    second = scheduler.next_request()
    assert second is not None and second.url != first.url
    after = redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]
    # two script calls: one acked the first and leased the second, one added the page count
    assert after - before == 2
    f = scheduler.frontier.keys
    assert sum(redis_client.zcard(f.deadlines(p)) for p in range(f.partitions)) == 1


@pytest.mark.parametrize(("entry", "message"), [
    ({"url": "http://a.test/x", "callback": "__init__"}, "special method, never a callback"),
    ({"url": "http://a.test/x", "callback": "_private"}, "not a method of spider class"),
    ({"url": "http://a.test/x", "callback": "from_crawler"}, "callback"),
    ({"url": "http://a.test/x", "callback": "start_requests"}, "callback"),
    ({"url": "http://a.test/x", "errback": "name"}, "not a method of spider"),
    ({"url": "http://a.test/x", "callback": "crawler"}, "not a method of spider"),
    ({"url": "http://a.test/x", "_class": "subprocess.Popen"}, "neither Scrapy's nor"),
    ({"url": "http://a.test/x", "_class": "scrapy.Spider"}, "not a Request class"),
])
def test_a_queue_entry_names_only_spider_callbacks_and_request_classes(
        scheduler: Scheduler, entry: dict[str, Any], message: str) -> None:
    with pytest.raises(UnreadableRequest, match=message):
        request_from_json(json.dumps(entry), scheduler.spider)


def test_a_hostile_queue_entry_is_dropped_and_the_crawl_goes_on(scheduler: Scheduler,
                                                                redis_client) -> None:
    scheduler.enqueue_request(Request("http://a.test/good"))
    scheduler.send_pending()
    f = scheduler.frontier.keys
    for p in range(f.partitions):
        hostile = json.dumps({"url": "http://a.test/evil%d" % p, "callback": "__init__",
                              "method": "GET"})
        # a queue of before per-host queues: moved into the host's queue when a worker opens
        redis_client.zadd(f.queue_part(p), {hostile: -100})  # leased first: higher priority
    assert scheduler.frontier.migrate() == f.partitions
    called = []
    scheduler.spider.__dict__["__init__"] = lambda *a, **k: called.append(a)
    assert [r.url for r in drain(scheduler)] == ["http://a.test/good"]
    assert called == []
    assert scheduler.stats.get_value("bloomcrawl/unreadable_requests") == f.partitions
    # the hostile entries were acked, not left to be leased again
    scheduler.send_pending()
    assert scheduler.frontier.size() + sum(redis_client.hlen(f.leases(p))
                                           for p in range(f.partitions)) == 1  # /good, leased


@pytest.mark.parametrize(("entry", "message"), [
    ('{"url": "http://x.test/", "priority": %s}' % ("9" * 400), "within"),
    ('{"url": "http://x.test/", "meta": {"_bloomcrawl_lease": [0, "t"]}}', "bloomcrawl's own"),
])
def test_poisoned_start_entries_are_refused(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_start_entry(entry)


def test_a_huge_priority_from_a_spider_still_queues(scheduler: Scheduler) -> None:
    scheduler.enqueue_request(Request("http://a.test/first", priority=10**400))
    scheduler.enqueue_request(Request("http://a.test/last", priority=-10**400))
    scheduler.send_pending()
    assert sorted(r.url for r in drain(scheduler)) == ["http://a.test/first",
                                                       "http://a.test/last"]


def test_an_evicting_redis_is_refused_unless_the_loss_is_accepted(redis_server,
                                                                 redis_client) -> None:
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(SettingError,
                           match=r"maxmemory-policy allkeys-lru.*REDIS_ALLOW_EVICTION"):
            make_scheduler(redis_server.url)
        assert redis_client.keys("*") == []  # refused before writing anything
        s = make_scheduler(redis_server.url, REDIS_ALLOW_EVICTION=True)
        # accepted: the frontier opened and works
        s.enqueue_request(Request("http://a.test/1"))
        assert [r.url for r in drain(s)] == ["http://a.test/1"]
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")


def test_a_restarted_redis_that_lost_state_gets_what_the_seen_cache_dropped(tmp_path) -> None:
    """A rollback or a restart without persistence: fingerprints this worker remembers
    sending are gone from Redis; what it dropped against them must be sent again."""
    from kit.redis import RedisServer

    server = RedisServer(tmp_path / "r")  # no persistence: a restart loses everything
    server.start()
    try:
        s = make_scheduler(server.url, BLOOMFILTER_PARTITIONS=1)
        s.enqueue_request(Request("http://a.test/1"))
        assert [r.url for r in drain(s)] == ["http://a.test/1"]
        epoch = s.watch.epoch
        server.restart()
        # the worker still remembers /1 as sent: dropped here, held until Redis answers
        assert s.enqueue_request(Request("http://a.test/1#again")) is False
        got = drain(s)
        assert s.watch.epoch == epoch + 1  # the reconnection saw another run_id
        assert [r.url for r in got] == ["http://a.test/1#again"]
        assert s.stats.get_value("bloomcrawl/redis_restarts") == 1
        s.server.connection_pool.disconnect()
    finally:
        server.stop()


def test_the_same_server_keeps_the_seen_cache(scheduler: Scheduler) -> None:
    scheduler.enqueue_request(Request("http://a.test/1"))
    assert [r.url for r in drain(scheduler)] == ["http://a.test/1"]
    scheduler.server.connection_pool.disconnect()  # a new connection, the same server
    assert scheduler.enqueue_request(Request("http://a.test/1#again")) is False
    assert drain(scheduler) == []
    assert scheduler.stats.get_value("bloomcrawl/redis_restarts") is None


def test_counts_redis_lost_in_a_restart_are_sent_again_once(tmp_path) -> None:
    from kit.redis import RedisServer

    server = RedisServer(tmp_path / "r")  # no persistence: a restart loses the stats too
    server.start()
    try:
        s = make_scheduler(server.url, BLOOMFILTER_PARTITIONS=1)
        for i in range(2):
            s.enqueue_request(Request("http://a.test/%d" % i))
        pages = drain(s)
        for request in pages:
            finish(s, request)
        s.send_pending()
        stats = s.frontier.keys.stats
        assert int(server.client().hget(stats, "pages")) == 2
        server.restart()
        s.enqueue_request(Request("http://a.test/new"))
        assert [r.url for r in drain(s)] == ["http://a.test/new"]
        s.send_pending()
        # the two pages' counts came back, once, and nothing else was counted twice
        assert int(server.client().hget(stats, "pages")) == 2
        s.send_pending()
        s.send_pending()
        assert int(server.client().hget(stats, "pages")) == 2
        s.server.connection_pool.disconnect()
    finally:
        server.stop()


def test_settings_the_frontier_does_not_use_are_named_when_it_opens(
        redis_server, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bloomcrawl.crawl.scheduler"):
        make_scheduler(redis_server.url, JOBDIR=str(tmp_path / "job"),
                       SCHEDULER_SERIALIZER="scrapy_redis.picklecompat")
    said = caplog.text
    assert "JOBDIR is set (%s)" % (tmp_path / "job") in said
    assert "SCHEDULER_SERIALIZER is not used" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bloomcrawl.crawl.scheduler"):
        make_scheduler(redis_server.url)
    assert "JOBDIR" not in caplog.text and "SCHEDULER_SERIALIZER" not in caplog.text


def test_a_rollback_leaves_a_start_entry_whose_request_it_lost_to_be_read_again(
        tmp_path) -> None:
    """A start entry is acked once the exchange carrying its request was confirmed. A
    rollback to a snapshot that holds the entry's lease and not that exchange lost the
    request: the ack must not reach the restored server, or nothing queues it again."""
    from kit.redis import RedisServer

    server = RedisServer(tmp_path / "r")
    server.start()
    try:
        s = make_scheduler(server.url, BLOOMFILTER_PARTITIONS=1, SCHEDULER_LEASE_TIMEOUT=1)
        start_urls = s.loop.poller.start_urls
        server.client().rpush("unit:start_urls", "http://a.test/start")
        assert start_urls.read().result == 1  # leased; its request waits in the outbox
        server.bgsave()  # the entry's lease is in the snapshot, its request is not
        s.send_pending()
        assert s.loop.outbox.has_start_acks()  # the request went: the entry is done
        server.kill()
        server.start()  # from the snapshot
        assert drain(s) == []  # the restored server has no request queued
        assert s.stats.get_value("bloomcrawl/redis_rollbacks") == 1
        got: list[str] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            start_urls.read()  # its lease expires: the entry is read again
            got = [r.url for r in drain(s)]
            time.sleep(0.2)
        assert got == ["http://a.test/start"]
        s.server.connection_pool.disconnect()
    finally:
        server.stop()


@pytest.mark.parametrize(("per_domain", "reported"), [(2, [False, True]), (1, [False, False])])
def test_a_late_send_is_reported_only_beyond_its_hosts_margin(
        redis_server, redis_client, per_domain: int, reported: list[bool]) -> None:
    """A host of two slots with a 0.5 s delay: its next lease comes 5 % (25 ms) after the
    delay, so a request 10 ms late changes nothing (half the margin is kept for the way
    to the site), and one 100 ms late is reported (the host's next lease then counts
    from when it left). A host of one slot: never, since its next lease waits for the
    ack, which carries when the request ended."""
    scheduler = make_scheduler(redis_server.url, BLOOMFILTER_PARTITIONS=1, DOWNLOAD_DELAY=0.5,
                               CONCURRENT_REQUESTS_PER_DOMAIN=per_domain,
                               RANDOMIZE_DOWNLOAD_DELAY=False)
    scheduler.enqueue_request(Request("http://a.test/1"))
    scheduler.send_pending()
    request = scheduler.next_request()
    assert request is not None
    token = request.meta[LEASE_META_KEY][1]
    leased_at = scheduler.book.leased_at(token)
    assert leased_at is not None  # a host with a delay: when it leaves matters
    seen = []
    for lag in (0.01, 0.1):
        scheduler.feedback.went_out(request, token, leased_at + lag)
        seen.append(scheduler.stats.get_value("bloomcrawl/late_sends_reported") is not None)
    assert seen == reported
    sent = scheduler.loop.outbox.feedback_for(0).sent
    assert ("a.test" in sent) == reported[-1]


def on_a_clock(s: Scheduler, monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The scheduler's exchange timers and poller on a clock the test steps (no reactor
    runs here), its loop started as in a crawl."""
    from bloomcrawl.crawl import exchanges

    clock = Clock()
    loop = s.loop
    for timer in (loop._flush_call, loop._wake_call, loop._retry_call, loop._due_call):
        monkeypatch.setattr(timer, "_later", clock.callLater)
    monkeypatch.setattr(exchanges, "call_later", clock.callLater)
    loop.started = True
    return clock


def test_an_exchange_that_carries_the_acks_leaves_no_ack_timer(
        scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ack timer is for acks no exchange has taken yet. One set for acks that then
    left with a lease would send, at its time, the acks of the pages finished since,
    sooner than their own delay: an exchange more, a Redis woken once more."""
    s, loop = scheduler, scheduler.loop
    for i in range(2):
        s.enqueue_request(Request("http://a.test/%d" % i))
    s.send_pending()
    first, second = drain(s)
    on_a_clock(s, monkeypatch)
    try:
        finish(s, first)
        assert loop.flush_pending()  # its ack waits for a lease, or leaves by the timer
        s.send_pending()  # an exchange takes it, as a lease does
        assert not loop.outbox.owes()
        assert not loop.flush_pending()
        finish(s, second)
        assert loop.flush_pending()  # the next ack sets it again, from its own time
    finally:
        loop.stop()


def test_a_poll_of_a_busy_worker_sends_no_counts_alone(
        scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker with work sends its counts with the next exchange that goes anyway; what
    it owes Redis beyond counts (links, acks, reports), and no timer will send, a poll
    does."""
    s, loop = scheduler, scheduler.loop
    on_a_clock(s, monkeypatch)
    loop.starved = False
    try:
        loop.outbox.count("pages", 1)
        loop.poller._poll()
        assert loop.outbox.owes() and not loop.outbox.exchanging  # the count waits
        s.enqueue_request(Request("http://a.test/link"))
        loop.poller._poll()
        assert not loop.outbox.owes()  # the link went, and the count with it
        assert s.server.hget(s.frontier.keys.stats, "pages") == b"1"
    finally:
        loop.stop()


def test_an_exchange_that_goes_anyway_tops_up_the_leased_requests(
        redis_server, redis_client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ack timer's exchange of a worker whose engine still has a leased request also
    leases what the worker's pace wants ahead, in the same call: the engine, dry a
    moment later, would otherwise start an exchange of its own (Redis woken once more).
    Too few wanted ahead (MIN_TOP_UP) and it leases nothing."""
    from bloomcrawl.crawl.exchanges import ACK_DELAY_UNPACED, MIN_TOP_UP

    s = make_scheduler(redis_server.url, BLOOMFILTER_PARTITIONS=1, SCHEDULER_PREFETCH=2,
                       CONCURRENT_REQUESTS_PER_DOMAIN=32)
    loop = s.loop
    for i in range(40):
        s.enqueue_request(Request("http://a.test/%d" % i))
    s.send_pending()
    first = s.next_request()  # the engine's lease: two, one of them still ready
    assert first is not None and loop.book.ready() == 1
    clock = on_a_clock(s, monkeypatch)
    pace_wants = {"ahead": MIN_TOP_UP - 1}
    monkeypatch.setattr(loop, "_demand", lambda: (1, pace_wants["ahead"]))
    try:
        finish(s, first)
        clock.advance(ACK_DELAY_UNPACED)  # the ack timer: too few wanted ahead
        assert not loop.outbox.owes() and loop.book.ready() == 1
        second = s.next_request()
        assert second is not None and not loop.book.ready()
        pace_wants["ahead"] = 8
        s.enqueue_request(Request("http://a.test/link"))  # of a page still crawled
        loop.outbox.count("pages", 1)
        loop.poller._poll()  # the poll sends the link, and tops up the engine's requests
        assert not loop.outbox.owes()
        assert loop.book.ready() == 9  # want and ahead, as ahead: a.test has no delay
        finish(s, second)
        clock.advance(ACK_DELAY_UNPACED)
        assert not loop.outbox.owes()  # the ack went, with the requests wanted ahead
        assert loop.book.ready() == 18
        leased = drain(s)
        assert {r.url for r in leased} <= {"http://a.test/%d" % i for i in range(40)} | {
            "http://a.test/link"}
        assert len({r.url for r in leased}) == len(leased)
    finally:
        loop.stop()


def test_a_poll_while_leased_requests_wait_for_the_engine_sends_nothing_alone(
        redis_server, redis_client, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine asked for a request and got none (starved), then a lease came: until it
    asks again it is not starved. A poll then sends no exchange for counts alone, and
    asks nothing of the frontier's size: the engine has work."""
    s = make_scheduler(redis_server.url, SCHEDULER_PREFETCH=2)
    loop = s.loop
    for i in range(2):
        s.enqueue_request(Request("http://a.test/%d" % i))
    s.send_pending()
    assert s.next_request() is not None and loop.book.ready() == 1
    on_a_clock(s, monkeypatch)
    loop.starved = True  # as after a lease the engine did not ask for yet
    try:
        loop.outbox.count("pages", 1)
        loop.poller._poll()
        assert loop.outbox.owes() and not loop.outbox.exchanging  # the count waits
        assert loop.frontier_size is None
    finally:
        loop.stop()


def test_a_worker_waiting_on_a_hosts_delay_sends_its_acks_by_their_timer(
        redis_server, redis_client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition's soonest host is ready at a known time (a delay): the engine asking
    for work sends nothing before then (no lease is possible), its acks leave by their
    timer; a poll asks Redis nothing either (requests are queued: the frontier is not
    empty, and the wake timer leases then)."""
    from bloomcrawl.crawl.exchanges import ACK_DELAY

    s = make_scheduler(redis_server.url, BLOOMFILTER_PARTITIONS=1, SCHEDULER_PREFETCH=2,
                       DOWNLOAD_DELAY=0.5, CONCURRENT_REQUESTS_PER_DOMAIN=2,
                       RANDOMIZE_DOWNLOAD_DELAY=False)
    loop = s.loop
    for i in range(3):
        s.enqueue_request(Request("http://a.test/%d" % i))
    s.send_pending()
    first = s.next_request()  # one of two asked: a.test's next is in 0.5 s
    assert first is not None and not loop.book.ready()
    assert loop.readiness.waiting_for_time() and not loop.readiness.ready_now()
    clock = on_a_clock(s, monkeypatch)
    sizes: list[int] = []
    size = s.frontier.size
    monkeypatch.setattr(s.frontier, "size", lambda **kw: sizes.append(1) or size(**kw))
    poller = loop.poller
    try:
        finish(s, first)
        # the I/O thread as in a crawl (the wake timer needs it), though nothing may go to it
        monkeypatch.setattr(loop.io, "_pool", object())
        poller._read_at = poller._found_at = time.monotonic()  # no start URL read due
        assert s.next_request() is None  # starved: nothing is ready to lease
        assert loop.outbox.owes() and loop.flush_pending()  # the ack waits for its timer
        assert loop._wake_call.pending()  # the lease, for when a.test is ready
        loop._wake_call.cancel()
        loop.frontier_size = 0  # as a stale reading would say
        poller._poll()
        assert (loop.frontier_size, sizes) == (None, [])
        assert loop.outbox.owes() and loop._wake_call.pending()
        monkeypatch.setattr(loop.io, "_pool", None)
        clock.advance(ACK_DELAY)
        assert not loop.outbox.owes()  # the timer sent it
    finally:
        loop.stop()
