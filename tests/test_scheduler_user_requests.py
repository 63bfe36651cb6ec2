"""What the scheduler does with requests ordinary spiders make: kept, not dropped."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from scrapy import Request

from bloomcrawl.core import keys
from bloomcrawl.core.errors import SettingError
from bloomcrawl.crawl.lease import HOLD_META_KEY
from bloomcrawl.crawl.scheduler import check_middlewares
from bloomcrawl.crawl.seeds import take_start_items

from kit.wait import wait_until
from test_scheduler import DemoSpider, drain, finish, make_scheduler


def start_request(url: str) -> Request:
    """What Scrapy's default ``start()`` makes of a start URL (StartSpiderMiddleware marks it)."""
    return Request(url, dont_filter=True, meta={"is_start_request": True})


def test_a_request_the_frontier_cannot_share_is_crawled_by_its_worker(
        redis_server, redis_client) -> None:
    s = make_scheduler(redis_server.url)
    lock = threading.Lock()
    assert s.enqueue_request(Request("http://a.test/locked", meta={"lock": lock})) is True
    # filtered against what this worker kept
    assert s.enqueue_request(Request("http://a.test/locked", meta={"lock": lock})) is False
    assert s.has_pending_requests()
    got = s.next_request()
    assert got is not None and got.url == "http://a.test/locked" and got.meta["lock"] is lock
    assert HOLD_META_KEY in got.meta  # its page is tracked, so it is counted when done
    assert s.stats.get_value("bloomcrawl/local_requests") == 1
    finish(s, got)
    s.send_pending()
    shared = redis_client.hgetall("unit:stats")
    assert shared[b"local"] == b"1" and shared[b"pages"] == b"1", shared
    assert s.next_request() is None
    assert s.frontier.size(with_leases=True) == 0


def test_strict_mode_refuses_it_instead(redis_server, redis_client) -> None:
    s = make_scheduler(redis_server.url, FRONTIER_STRICT=True)
    assert s.enqueue_request(Request("http://a.test/locked", meta={"lock": object()})) is False
    assert s.next_request() is None
    assert s.stats.get_value("bloomcrawl/unserializable") == 1
    assert s.stats.get_value("bloomcrawl/local_requests") is None


def test_start_requests_are_queued_once_per_crawl_whichever_workers_start_them(
        redis_server, redis_client) -> None:
    workers = [make_scheduler(redis_server.url) for _ in range(3)]
    for s in workers:
        assert s.crawl_id == workers[0].crawl_id != b""
        s.enqueue_request(start_request("http://a.test/"))
        s.send_pending()
    got = [r for s in workers for r in drain(s)]
    assert [r.url for r in got] == ["http://a.test/"]
    # other dont_filter requests are not deduplicated
    workers[0].enqueue_request(Request("http://a.test/again", dont_filter=True))
    workers[1].enqueue_request(Request("http://a.test/again", dont_filter=True))
    for s in workers[:2]:
        s.send_pending()
    again = [(s, r) for s in workers for r in drain(s)]
    assert [r.url for _, r in again] == ["http://a.test/again"] * 2
    owner = next(s for s in workers if len(s.book))
    for s, r in [(owner, got[0]), *again]:
        finish(s, r)
    for s in workers:
        s.send_pending()
    # the first worker to ask takes the items start() yields in this crawl, asked twice
    assert [take_start_items(s.server, "unit", s.crawl_id, s.worker_id)
            for s in (workers[1], workers[0], workers[1])] == [True, False, True]
    for s in workers:
        s.close("finished")
    # the crawl ended with its frontier empty: the next one starts its start URLs again,
    # and its start items are the first asker's again
    assert redis_client.hgetall(keys.crawl_key("unit")) == {}
    fresh = make_scheduler(redis_server.url)
    assert fresh.crawl_id not in (b"", workers[0].crawl_id)
    fresh.enqueue_request(start_request("http://a.test/"))
    fresh.send_pending()
    assert [r.url for r in drain(fresh)] == ["http://a.test/"]


def test_an_explicit_crawl_id_is_shared_by_the_workers_given_it(redis_server) -> None:
    first = make_scheduler(redis_server.url, FRONTIER_CRAWL_ID="nightly-42")
    second = make_scheduler(redis_server.url, FRONTIER_CRAWL_ID="nightly-42")
    for s in (first, second):
        s.enqueue_request(start_request("http://a.test/start"))
        s.send_pending()
    assert len(drain(first) + drain(second)) == 1
    other: Any = make_scheduler(redis_server.url, FRONTIER_CRAWL_ID="nightly-43")
    other.enqueue_request(start_request("http://a.test/start"))
    other.send_pending()
    assert [r.url for r in drain(other)] == ["http://a.test/start"]


def test_a_worker_without_the_frontier_middlewares_refuses_to_open(redis_server) -> None:
    s = make_scheduler(redis_server.url)
    with pytest.raises(SettingError, match=re.escape(
            "SPIDER_MIDDLEWARES lacks bloomcrawl.crawl.middleware.FrontierSpiderMiddleware")):
        s.open(s.spider)
    with_spider_mw = make_scheduler(redis_server.url, SPIDER_MIDDLEWARES={
        "bloomcrawl.crawl.middleware.FrontierSpiderMiddleware": 10})
    with pytest.raises(SettingError, match="DOWNLOADER_MIDDLEWARES lacks"):
        check_middlewares(with_spider_mw.crawler.settings)
    both = make_scheduler(redis_server.url, SPIDER_MIDDLEWARES={
        "bloomcrawl.crawl.middleware.FrontierSpiderMiddleware": 10},
        DOWNLOADER_MIDDLEWARES={"bloomcrawl.crawl.middleware.FrontierDownloaderMiddleware": 10})
    check_middlewares(both.crawler.settings)  # no error


def test_a_project_dupefilter_is_asked_first_and_a_bloom_one_refused(redis_server) -> None:
    from scrapy.dupefilters import RFPDupeFilter

    from bloomcrawl.crawl.dupefilter import RedisBloomDupeFilter

    class NoTracking(RFPDupeFilter):
        def request_seen(self, request: Request) -> bool:
            return "utm=" in request.url or bool(super().request_seen(request))

    class BloomOfMine(RedisBloomDupeFilter):
        pass

    s = make_scheduler(redis_server.url, DUPEFILTER_CLASS=NoTracking)
    assert s.enqueue_request(Request("http://a.test/x?utm=1")) is False
    assert s.enqueue_request(Request("http://a.test/x")) is True
    assert s.enqueue_request(Request("http://a.test/x?utm=2", dont_filter=True)) is True
    s.intake.flush_counts()
    assert s.stats.get_value("dupefilter/filtered") == 1
    with pytest.raises(SettingError, match="subclasses RedisBloomDupeFilter, which"):
        make_scheduler(redis_server.url, DUPEFILTER_CLASS=BloomOfMine)
    # Scrapy's, scrapy-redis's and bloomcrawl's own filter by fingerprint: not asked
    for plain in (RFPDupeFilter, RedisBloomDupeFilter, "scrapy_redis.dupefilter.RFPDupeFilter"):
        assert make_scheduler(redis_server.url, DUPEFILTER_CLASS=plain).intake.project_filter \
            is None


def test_a_worker_that_flushes_leaves_a_crawl_other_workers_hold_alone(
        redis_server, redis_client) -> None:
    """SCHEDULER_PERSIST = False (a flush when the worker closes) and
    SCHEDULER_FLUSH_ON_START (a flush when it opens) delete no crawl that another
    worker holds leases of: the last worker to close flushes it."""
    busy = make_scheduler(redis_server.url)
    for n in range(3):
        busy.enqueue_request(Request("http://a.test/%d" % n))
    busy.send_pending()
    leased = busy.next_request()
    assert leased is not None
    left = busy.frontier.size(with_leases=True)
    assert left == 3
    make_scheduler(redis_server.url, SCHEDULER_PERSIST=False).close("finished")
    assert busy.frontier.size(with_leases=True) == left
    make_scheduler(redis_server.url, SCHEDULER_FLUSH_ON_START=True).close("finished")
    assert busy.frontier.size(with_leases=True) == left
    # no lease held, no other worker alive: flushed
    finish(busy, leased)
    busy.close("finished")
    make_scheduler(redis_server.url, SCHEDULER_PERSIST=False).close("finished")
    assert busy.frontier.size(with_leases=True) == 0


def test_a_worker_between_leases_keeps_its_crawl_from_a_flush(
        redis_server, redis_client) -> None:
    """A worker alive may hold no lease (waiting out a host's delay, between two
    exchanges): another worker closing with SCHEDULER_PERSIST = False (cancelled or
    finished), or opening with SCHEDULER_FLUSH_ON_START, leaves its queue alone. The last
    worker alive to close flushes; one killed without a word counts for its lease time."""
    running = make_scheduler(redis_server.url, SCHEDULER_PERSIST=False)
    urls = ["http://a.test/%d" % n for n in range(5)]
    for url in urls:
        running.enqueue_request(Request(url))
    running.send_pending()
    assert running.frontier.size(with_leases=True) == 5
    make_scheduler(redis_server.url, SCHEDULER_PERSIST=False).close("shutdown")
    make_scheduler(redis_server.url, SCHEDULER_PERSIST=False).close("finished")
    make_scheduler(redis_server.url, SCHEDULER_FLUSH_ON_START=True).close("finished")
    assert running.frontier.size(with_leases=True) == 5
    leased = drain(running)
    assert sorted(r.url for r in leased) == urls
    # a worker killed without a word: alive for its lease time (5 s), then forgotten
    killed = make_scheduler(redis_server.url)
    assert redis_client.zscore(killed.frontier.keys.workers, killed.worker_id) is not None
    for request in leased:
        finish(running, request)
    running.close("finished")
    assert running.bloom.info().items == 5, "flushed while a killed worker was alive"
    deadline = float(redis_client.zscore(killed.frontier.keys.workers, killed.worker_id))
    wait_until(lambda: redis_client.time()[0] * 1000 > deadline + 1, timeout=15,
               what="the killed worker's lease time to pass")
    make_scheduler(redis_server.url, SCHEDULER_PERSIST=False).close("finished")
    assert running.bloom.info().items == 0
    assert running.frontier.size(with_leases=True) == 0
    assert redis_client.zcard(running.frontier.keys.workers) == 0


def test_a_raising_callback_counts_one_error(redis_server, redis_client) -> None:
    """Scrapy sends spider_error, and the middleware reports the outcome: one error."""
    from scrapy import signals
    from scrapy.http import HtmlResponse
    from twisted.python.failure import Failure

    s = make_scheduler(redis_server.url)
    s.enqueue_request(Request("http://a.test/boom"))
    s.send_pending()
    (request,) = drain(s)
    response = HtmlResponse(request.url, request=request, body=b"<html></html>")
    try:
        raise ValueError("boom")
    except ValueError:
        failure = Failure()
    s.crawler.signals.send_catch_log(signals.spider_error, failure=failure, response=response,
                                     spider=s.spider)
    finish(s, request, "spider_error")
    s.send_pending()
    shared = redis_client.hgetall("unit:stats")
    assert shared[b"errors"] == b"1", shared
    assert s.frontier.size(with_leases=True) == 0  # acked


class HeldSeedSpider(DemoSpider):
    """Makes each start entry's request with a callback that is no method of the spider:
    the frontier cannot share it, and the worker that reads the entry crawls it."""

    name = "heldseed"

    def make_request_from_start_entry(self, data: dict[str, Any]) -> Request:
        return Request(data["url"], callback=lambda response: None)


def held_seed_scheduler(redis_url: str) -> Any:
    return make_scheduler(redis_url, HeldSeedSpider, BLOOMFILTER_PARTITIONS=1)


def test_a_start_entry_whose_request_its_worker_crawls_is_acked_when_that_is_done(
        redis_server, redis_client) -> None:
    """The entry's lease waits for the request the worker keeps: a worker that closes
    before gives the entry back to the list, for the next worker; once the request is
    done, the entry is acked."""
    first = held_seed_scheduler(redis_server.url)
    deadlines = first.frontier.keys.start_deadlines
    redis_client.rpush("heldseed:start_urls", "http://a.test/seed")
    start_urls = first.loop.poller.start_urls
    assert start_urls.read().result == 1
    assert first.stats.get_value("bloomcrawl/local_requests") == 1
    first.send_pending()
    start_urls.read()  # would ack the entry if its request had been queued
    assert redis_client.zcard(deadlines) == 1, "acked while its request is only in memory"
    first.upkeep.renew()  # renewed with the worker's leases
    assert first.upkeep.start_holds.tokens() and redis_client.zcard(deadlines) == 1
    first.close("shutdown")  # cancelled before the engine asked for it
    assert redis_client.zrange(deadlines, 0, -1, withscores=True)[0][1] == 0  # given back

    second = held_seed_scheduler(redis_server.url)
    assert second.loop.poller.start_urls.read().result == 1  # the entry again
    request = second.next_request()
    assert request is not None and request.url == "http://a.test/seed"
    finish(second, request)
    second.send_pending()  # the exchange that carries what its page yielded
    second.loop.poller.start_urls.read()  # the read that acks the entry
    assert redis_client.zcard(deadlines) == 0
    assert redis_client.llen("heldseed:start_urls") == 0


def test_the_leases_of_an_exchange_under_way_go_back_when_the_worker_closes(
        redis_server, redis_client) -> None:
    """A worker closing waits for the exchange under way; its reply comes to the reactor
    after the close, so the close gives back what it leased instead of leaving it to
    expire (a lease time in which no worker may fetch those requests)."""
    s = make_scheduler(redis_server.url, SCHEDULER_LEASE_TIMEOUT=60)
    for n in range(3):
        s.enqueue_request(Request("http://a.test/%d" % n))
    s.send_pending()
    f = s.frontier.keys
    [partition] = [p for p in range(2) if int(redis_client.get(f.polite(p, "queued")) or 0)]
    s.io.start()  # the I/O thread; no reactor runs here to take its replies in
    assert s.loop.outbox.send(partition, want=3) is not None
    wait_until(lambda: redis_client.zcard(f.deadlines(partition)) == 3, timeout=10,
               what="the exchange to lease the three requests")
    s.close("shutdown")
    assert redis_client.zcard(f.deadlines(partition)) == 0
    assert s.frontier.size() == 3


def test_a_renewal_reply_counts_lost_only_the_leases_still_held(
        redis_server, redis_client) -> None:
    """Renewals queued while Redis was away carry the leases held then; a reply naming one
    finished since (its ack went first) is no lost lease, and one lease is counted once."""
    s = make_scheduler(redis_server.url)
    for n in range(2):
        s.enqueue_request(Request("http://a.test/%d" % n))
    s.send_pending()
    first, _ = drain(s)
    tokens = dict.fromkeys(s.book.held())
    finish(s, first)
    [still] = s.book.held()
    for _ in range(2):  # two renewals of the same snapshot
        s.upkeep._renewed(list(tokens))
    assert s.stats.get_value("bloomcrawl/leases_lost") == 1
    assert still not in s.book.held()
