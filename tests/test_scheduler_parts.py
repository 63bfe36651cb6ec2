"""The scheduler's parts, each on its own (crawl/lease_book, seen, held, readiness, outbox).

The scheduler's behaviour as a whole is in test_scheduler.py and the crawl
tests; these pin down what each part promises the others.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import pytest
import redis
from scrapy import Request
from twisted.python.failure import Failure

from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.connection import ServerWatch
from bloomcrawl.core.errors import RedisUnavailableError
from bloomcrawl.core.frontier import Frontier, Outgoing
from bloomcrawl.core.keys import FrontierKeys
from bloomcrawl.core.leases import ONE_SLOT, Lease
from bloomcrawl.crawl.held import HeldRequests
from bloomcrawl.crawl.lease import LEASE_META_KEY, LeaseRef, Outcome
from bloomcrawl.crawl.lease_book import NO_ROOM, LeaseBook
from bloomcrawl.crawl.outbox import Outbox, Reply
from bloomcrawl.crawl.readiness import INF, PartitionReadiness
from bloomcrawl.crawl.redis_io import RedisIO
from bloomcrawl.crawl.seen import SeenCache
from bloomcrawl.crawl.timing import PACE_WINDOW_S, Pace, SoonestCall, lease_demand

from kit.redis import RedisServer


def lease(partition: int, token: str, at: float = 1.0, *, paced: bool = True) -> Lease:
    return Lease(partition, token, b"{}", at, paced)


# -- LeaseBook -----------------------------------------------------------------------


def test_a_lease_is_acked_once_and_carries_when_its_response_came() -> None:
    book = LeaseBook()
    book.take(lease(1, "a"), Request("http://a.test/a"))
    book.take(lease(0, "b"), Request("http://a.test/b"))
    assert (len(book), book.ready()) == (2, 2)
    first = book.pop_ready()
    assert first.meta[LEASE_META_KEY] == LeaseRef(1, "a") == (1, "a")  # a tuple in meta
    book.responded("a", 12.5)
    assert book.finish(first.meta[LEASE_META_KEY]) == "a|12.5"
    assert book.finish((1, "a")) is None  # not ours any more: never acked twice
    assert book.finish((0, "b")) == "b"
    assert len(book) == 0


def test_an_unreadable_lease_is_held_but_never_handed_to_the_engine() -> None:
    book = LeaseBook()
    book.take(lease(0, "bad"), None)
    assert (len(book), book.ready()) == (1, 0)
    assert book.held() == {"bad": 0}
    assert book.finish((0, "bad")) == "bad"


def test_lost_leases_are_neither_renewed_nor_acked() -> None:
    book = LeaseBook()
    for token in "abc":
        book.take(lease(0, token), Request("http://a.test/" + token))
    book.lost(["a", "c"])
    assert book.held() == {"b": 0}
    assert book.finish((0, "a")) is None
    # not handed to the engine yet: never fetched here (Redis hands them out again)
    assert book.ready() == 1 and book.pop_ready().url == "http://a.test/b"
    assert book.forget() == 1 and book.held() == {}
    book.clear()
    assert book.ready() == 0


def test_forgotten_leases_take_their_waiting_requests_with_them() -> None:
    """Redis lost writes of this worker (a rollback): every lease is given up. A request
    not handed to the engine yet is dropped, ready or leased for later: fetched now, it
    would be fetched again when its lease expires and Redis requeues it."""
    book = LeaseBook()
    now = time.monotonic()
    book.take(lease(0, "ready", at=now), Request("http://a.test/ready"))
    book.take(Lease(0, "later", b"{}", now, True, 0.5, ONE_SLOT, now + 60),
              Request("http://b.test/later"))
    book.take(lease(1, "engine", at=now), Request("http://c.test/engine"))
    assert book.pop_ready().url == "http://a.test/ready"
    in_engine = book.pop_ready()
    book.put_back(LeaseRef(0, "ready"), Request("http://a.test/ready"))
    assert (book.ready(), book.waiting()) == (1, 1)
    assert book.forget() == 3
    assert (book.ready(), book.waiting(), book.next_due(), len(book)) == (0, 0, math.inf, 0)
    # the one in the engine: done, never acked (its lease expires); back from the engine,
    # not queued again
    book.put_back(in_engine.meta[LEASE_META_KEY], in_engine)
    assert book.ready() == 0
    assert book.finish(in_engine.meta[LEASE_META_KEY]) is None


def test_a_request_back_from_the_engine_after_its_lease_was_lost_is_not_queued() -> None:
    book = LeaseBook()
    book.take(lease(0, "a"), Request("http://a.test/a"))
    book.take(lease(0, "b"), Request("http://a.test/b"))
    first, second = book.pop_ready(), book.pop_ready()
    book.lost(["a"])
    book.put_back(first.meta[LEASE_META_KEY], first)
    book.put_back(second.meta[LEASE_META_KEY], second)
    assert book.ready() == 1 and book.pop_ready() is second


def test_a_late_request_is_reported_from_when_it_went_out() -> None:
    book = LeaseBook()
    book.take(lease(0, "a", at=5.0), Request("http://a.test/a"))
    assert book.leased_at("a") == 5.0
    book.went_out("a", 9.0)
    assert book.leased_at("a") == 9.0
    book.finish((0, "a"))
    assert book.leased_at("a") is None


def test_a_paced_lease_knows_how_late_its_request_may_leave() -> None:
    """A host of several slots: the margin between its delay and its next lease. A host
    of one slot: any lateness (its next lease counts from the ack), and its ack carries
    when the request ended even when no response came."""
    book = LeaseBook()
    book.take(Lease(0, "many", b"{}", 5.0, True, 0.5, 0.525), Request("http://a.test/a"))
    book.take(Lease(0, "one", b"{}", 5.0, True, 0.5, ONE_SLOT), Request("http://b.test/b"))
    book.take(lease(0, "old", at=5.0), Request("http://c.test/c"))
    assert book.room("many") == pytest.approx((0.025, 0.525, 0.5))
    assert book.room("one") == (math.inf, ONE_SLOT, 0.5) and book.room("one").one_slot
    assert book.room("old") == NO_ROOM == (0.0, 0.0, 0.0)  # nothing known: any lag is reported
    before = time.monotonic()
    token, _, ended = book.finish((0, "one")).partition("|")
    assert token == "one" and before <= float(ended) <= time.monotonic()
    assert book.finish((0, "many")) == "many"  # no response: its lease's room holds
    assert book.room("many") == NO_ROOM
    # a retry that failed after a response: the ack carries now, not that response
    book.take(Lease(0, "retried", b"{}", 5.0, True, 0.5, ONE_SLOT), Request("http://d.test/"))
    book.responded("retried", 6.0)
    book.sending("retried", 7.0)
    before = time.monotonic()
    _, _, ended = book.finish((0, "retried")).partition("|")
    assert float(ended) >= before
    book.take(Lease(0, "answered", b"{}", 5.0, True, 0.5, ONE_SLOT), Request("http://e.test/"))
    book.sending("answered", 6.0)
    book.responded("answered", 7.0)
    assert book.finish((0, "answered")) == "answered|7.0"


def test_a_request_leased_for_later_waits_in_the_book_until_its_time() -> None:
    book = LeaseBook()
    now = time.monotonic()
    book.take(Lease(0, "later", b"{}", now, True, 0.5, ONE_SLOT, now + 0.2),
              Request("http://a.test/later"))
    book.take(Lease(0, "soon", b"{}", now, True, 0.5, ONE_SLOT, now + 0.1),
              Request("http://b.test/soon"))
    book.take(lease(0, "now", at=now), Request("http://c.test/now"))
    assert (book.ready(), book.waiting(), len(book)) == (1, 2, 3)
    assert book.next_due() == now + 0.1
    assert book.leased_at("soon") == now + 0.1  # late from its time, not its lease call
    assert book.pop_ready().url == "http://c.test/now"
    while book.ready() == 0:
        time.sleep(0.01)
    assert time.monotonic() >= now + 0.1
    assert [book.pop_ready().url] == ["http://b.test/soon"]  # the sooner first
    assert (book.waiting(), book.next_due()) == (1, now + 0.2)
    book.lost(["later"])  # Redis gave it to another worker: never fetched here
    assert (book.waiting(), book.next_due()) == (0, math.inf)
    assert book.held() == {"soon": 0, "now": 0}


def test_requests_leased_for_later_hold_the_slots_they_will_take() -> None:
    # 16 free slots, 3 ready, 5 waiting for their time: 8 more; none once they cover them
    assert lease_demand(16, 3, 5, prefetch=1, pace=0.0) == (8, 0)
    assert lease_demand(16, 0, 16, prefetch=1, pace=0.0) == (0, 0)
    # nothing waiting: at least SCHEDULER_PREFETCH, and ahead from the pace
    assert lease_demand(0, 0, 0, prefetch=1, pace=0.0) == (1, 0)
    assert lease_demand(4, 0, 0, prefetch=1, pace=100.0) == (4, 16)


def test_a_request_of_a_host_without_a_delay_is_never_reported_late() -> None:
    """Its lateness moves nothing in Redis: no exchange is spent on it."""
    book = LeaseBook()
    book.take(lease(0, "a", at=5.0, paced=False), Request("http://a.test/a"))
    assert book.leased_at("a") is None
    assert book.held() == {"a": 0}  # held, renewed and acked as any other
    assert book.finish((0, "a")) == "a"


def test_a_request_handed_to_the_engine_and_back_keeps_its_lease() -> None:
    book = LeaseBook()
    book.take(lease(2, "a"), Request("http://a.test/a"))
    request = book.pop_ready()
    book.put_back(request.meta[LEASE_META_KEY], request)
    again = book.pop_ready()
    assert again is request and again.meta[LEASE_META_KEY] == (2, "a")


# -- SeenCache, HeldRequests, PartitionReadiness ----------------------------------------


def test_the_seen_cache_is_bounded_and_follows_the_filter_generation() -> None:
    seen = SeenCache(capacity=3)
    seen.remember([b"a", b"b"], sent=2)
    assert b"a" in seen and len(seen) == 2
    seen.remember([b"c", b"d"], sent=2)  # 2 + 2 > 3: the old ones go first
    assert b"a" not in seen and {b"c", b"d"} == {f for f in (b"c", b"d") if f in seen}
    assert seen.follow(0) is False and len(seen) == 2
    assert seen.follow(1) is True and len(seen) == 0  # the filter was created again
    off = SeenCache(capacity=0)
    off.remember([b"a"], sent=1)
    assert b"a" not in off


def test_held_requests_come_out_by_priority_then_arrival() -> None:
    held = HeldRequests()
    for url, priority in (("http://a.test/low", -1), ("http://a.test/hi", 5),
                          ("http://a.test/hi2", 5)):
        held.push(Request(url, priority=priority))
    assert [held.pop().url for _ in range(len(held))] == [
        "http://a.test/hi", "http://a.test/hi2", "http://a.test/low"]
    assert held.first_of_kind("lambda") is True and held.first_of_kind("lambda") is False
    assert held.seen_before(b"f") is False and held.seen_before(b"f") is True


def test_readiness_leases_first_where_acks_wait_then_in_rotation() -> None:
    ready = PartitionReadiness(4)
    assert ready.ready_now() == [0, 1, 2, 3]
    assert ready.lease_order([0, 1, 2, 3], first=2)[0] == 2
    starts = {ready.lease_order([0, 1, 2, 3], first=None)[0] for _ in range(4)}
    assert starts == {0, 1, 2, 3}  # each partition goes first in turn
    ready.ready_in(1, None)
    ready.ready_in(3, 60.0)
    assert ready.ready_now() == [0, 2]
    assert ready.waiting_for_others() == [1]
    ready.ready_in(0, 30.0)
    ready.ready_in(2, None)
    assert ready.soonest() == pytest.approx(time.monotonic() + 30.0, abs=1.0)
    ready.may_have_work([1])
    assert ready.ready_now() == [1]
    ready.ready_in(1, None)
    ready.ready_in(0, None)
    ready.ready_in(3, None)
    assert ready.soonest() == INF


def test_the_pace_is_the_last_complete_windows_rate() -> None:
    """What a lease takes ahead of the free slots follows the worker's recent pace."""
    start = 1000.0
    pace = Pace(start)
    pace.done += 100
    assert pace.per_second(start + PACE_WINDOW_S / 2) == 0.0  # no window complete yet
    assert pace.per_second(start + PACE_WINDOW_S) == pytest.approx(100 / PACE_WINDOW_S,
                                                                   rel=0.01)
    pace.done += 10
    # within the next window, the last complete one's rate
    assert pace.per_second(start + PACE_WINDOW_S * 1.5) == pytest.approx(100 / PACE_WINDOW_S,
                                                                         rel=0.01)
    # a stalled worker: the window that ends after a long wait counts the wait
    assert pace.per_second(start + PACE_WINDOW_S + 10.0) == pytest.approx(1.0, rel=0.01)


def test_a_flush_timer_only_ever_moves_earlier() -> None:
    """An ack of a host with a delay must not wait for a later ack's longer timer, and a
    later ack must not push back the one set."""
    from twisted.internet.task import Clock

    clock, fired = Clock(), []
    timer = SoonestCall(lambda: fired.append(clock.seconds()), later=clock.callLater)
    timer.within(0.15)
    timer.within(0.05)  # sooner: moved
    timer.within(0.3)  # later: kept
    clock.advance(0.04)
    assert not fired and timer.pending()
    clock.advance(0.02)
    assert len(fired) == 1 and not timer.pending()
    clock.advance(1)  # neither the 0.15 nor the 0.3 s call is left
    assert len(fired) == 1 and not clock.getDelayedCalls()
    timer.within(0.15)
    timer.cancel()
    clock.advance(1)
    assert len(fired) == 1 and not timer.pending()


def test_outcomes_are_the_strings_the_signal_always_carried() -> None:
    assert [o.value for o in Outcome] == ["response", "spider_error", "download_error",
                                         "ignored"]
    assert Outcome.RESPONSE == "response"


# -- Outbox (against a real Redis) --------------------------------------------------------


def make_outbox(client: redis.Redis) -> tuple[Outbox, Frontier]:
    bloom = BloomFilter(client, "parts:bloomfilter", capacity=10_000, error_rate=0.001,
                        partitions=1, backend="bitmap")
    frontier = Frontier(client, bloom, FrontierKeys("parts", partitions=1), queue_type="fifo",
                        lease_timeout=5, worker_id="w1", node="n1")
    frontier.record_layout()
    watch = ServerWatch(client)
    return Outbox(RedisIO(), frontier, watch), frontier


def entry(url: str) -> Outgoing:
    fp = url.encode().ljust(20, b"\0")[:20]
    return Outgoing(fp, False, 0.0, '{"url": "%s", "method": "GET"}' % url, "a.test")


def replies(outbox: Outbox, **kwargs: object) -> list[Reply | Failure]:
    got: list[Reply | Failure] = []
    d = outbox.send(**kwargs)  # type: ignore[arg-type]
    assert d is not None
    d.addBoth(got.append)
    return got


def test_one_exchange_sends_what_is_owed_and_leases_in_the_same_round_trip(
        redis_client: redis.Redis) -> None:
    outbox, frontier = make_outbox(redis_client)
    assert outbox.send() is None  # nothing owed, nothing asked: no round trip
    outbox.add(entry("http://a.test/1"))
    outbox.add(entry("http://a.test/1"))  # the outbox drops the second
    outbox.count("pages", 2)
    (reply,) = replies(outbox, lease_from=0, want=1)
    assert isinstance(reply, Reply)
    assert (reply.done.queued, reply.done.filtered, len(reply.leases)) == (1, 0, 1)
    assert (len(reply.batch.outgoing), reply.batch.duplicates) == (1, 1)
    assert not outbox.owes() and not outbox.exchanging
    assert redis_client.hmget(frontier.keys.stats, "pages", "filtered") == [b"2", b"1"]
    outbox.ack(0, reply.leases[0].token)
    assert outbox.ack_partition() == 0
    replies(outbox)
    assert frontier.size(with_leases=True) == 0


def test_requests_of_the_last_exchange_are_not_sent_again(redis_client: redis.Redis) -> None:
    """A link found again while the exchange that sent it was under way stays here."""
    def entry(url: str) -> Outgoing:  # fingerprints unlike each other in every byte
        return Outgoing(hashlib.sha1(url.encode()).digest(), False, 0.0,
                        '{"url": "%s", "method": "GET"}' % url, "a.test")

    outbox, frontier = make_outbox(redis_client)
    outbox.add(entry("http://a.test/1"))
    (reply,) = replies(outbox)
    assert isinstance(reply, Reply) and reply.done.queued == 1
    outbox.add(entry("http://a.test/1"))
    outbox.add(entry("http://a.test/2"))
    (reply,) = replies(outbox)
    assert isinstance(reply, Reply)
    assert [e.payload for e in reply.batch.outgoing] == [
        '{"url": "http://a.test/2", "method": "GET"}']
    assert (reply.done.queued, reply.batch.duplicates) == (1, 1)
    # Redis may have lost them (a restart): from then on they go again
    outbox.take_dropped()
    outbox.add(entry("http://a.test/2"))
    (reply,) = replies(outbox)
    assert isinstance(reply, Reply)
    assert (len(reply.batch.outgoing), reply.done.filtered) == (1, 1)
    # the outbox counts its own; the filter's are the exchange loop's to count
    assert redis_client.hget(frontier.keys.stats, "filtered") == b"1"


def test_only_links_no_leased_page_makes_again_wait_for_the_next_exchange(
        redis_client: redis.Redis) -> None:
    """A duplicate the seen cache dropped waits for Redis to answer from the same server,
    to go again if the fingerprint was lost; on one Redis a leased page's link need not:
    a server that lost its fingerprint lost the page's ack too, and the page comes again."""
    outbox, _ = make_outbox(redis_client)
    assert not outbox.watch.cluster
    outbox.dropped("of a leased page", of_leased_page=True)
    outbox.dropped("of no page", of_leased_page=False)
    assert outbox.take_dropped() == ["of no page"]
    assert outbox.take_dropped() == []


def test_a_failed_exchange_puts_its_batch_back_in_front(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "r", appendonly=True) as server:
        client = server.client(socket_timeout=2)
        outbox, frontier = make_outbox(client)
        outbox.add(entry("http://a.test/1"))
        outbox.count("items")
        outbox.start_waiting("seed-1")
        server.stop()
        (failure,) = replies(outbox)
        assert isinstance(failure, Failure) and isinstance(failure.value, RedisUnavailableError)
        assert outbox.owes() and not outbox.exchanging
        server.start()
        outbox.add(entry("http://a.test/2"))
        (reply,) = replies(outbox)
        assert isinstance(reply, Reply)
        # the failed batch went first, whole: both requests, the count once, the seed acked
        assert [e.payload for e in reply.batch.outgoing] == [
            entry("http://a.test/1").payload, entry("http://a.test/2").payload]
        assert client.hget(frontier.keys.stats, "items") == b"1"
        assert outbox.take_start_acks() == ["seed-1"]
        client.close()


# -- SeenCache keys ---------------------------------------------------------------------


def test_seen_cache_answers_for_a_request_before_its_host_is_known() -> None:
    from bloomcrawl.core.politeness import filter_fingerprint

    seen = SeenCache(100)
    own = hashlib.sha1(b"http://a.test/1").digest()
    sent = filter_fingerprint(own, "a.test", "host")
    assert sent != own  # the filter's fingerprint carries the host's partition
    seen.remember([sent], sent=1)
    # the request's own fingerprint finds it: the host leaves the bytes the cache keys on
    assert own in seen and sent in seen
    assert hashlib.sha1(b"http://a.test/2").digest() not in seen


# -- FrontierDownloaderMiddleware: cookies -----------------------------------------


@pytest.mark.parametrize("enabled", [True, False])
def test_a_response_that_sets_cookies_is_said_once(caplog: pytest.LogCaptureFixture,
                                                   enabled: bool) -> None:
    """Each worker keeps its own cookie jar: the first response that sets a cookie says
    so, once, unless cookies are off."""
    from scrapy.http import HtmlResponse
    from scrapy.utils.test import get_crawler

    from bloomcrawl.crawl.middleware import FrontierDownloaderMiddleware

    crawler = get_crawler(settings_dict={"COOKIES_ENABLED": enabled})
    mw = FrontierDownloaderMiddleware.from_crawler(crawler)
    plain = HtmlResponse("http://127.0.0.1/a", body=b"<p>a</p>")
    login = HtmlResponse("http://127.0.0.1/login", body=b"<p>in</p>",
                         headers={"Set-Cookie": "session=1; Path=/"})
    with caplog.at_level("WARNING", logger="bloomcrawl.crawl.middleware"):
        for response in (plain, login, login, plain):
            assert mw.process_response(Request(response.url), response) is response
    said = [r.getMessage() for r in caplog.records if "sets cookies" in r.getMessage()]
    assert said == (["<200 http://127.0.0.1/login> sets cookies: Scrapy keeps cookies in"
                     " each worker's own jar, and a queued request carries only the cookies"
                     " set on it (cookies=..., a Cookie header), so other workers fetch it"
                     " without this one's session (a login on one worker logs in no other)."
                     " See \"What each worker keeps to itself\" in bloomcrawl's README"]
                    if enabled else [])


# -- PageTracker: the leases a restart that kept the exchanges gives up ---------------


def test_leases_given_up_are_those_of_pages_whose_items_were_sent() -> None:
    """RedisItemsPipeline marks an item's page as it sends the item
    (:func:`origins.sending`); a held page's mark goes to the leased page it waits
    under. Pages whose items only wait, or that yielded none, keep their leases."""
    from scrapy.http import HtmlResponse
    from scrapy.utils.test import get_crawler

    from bloomcrawl.crawl import origins
    from bloomcrawl.crawl.lease import HOLD_META_KEY
    from bloomcrawl.crawl.pages import Page, PageTracker, leases_with_items_sent

    tracker = PageTracker(get_crawler())

    def page_of(url: str, **meta: object) -> tuple[HtmlResponse, Page]:
        response = HtmlResponse(url, body=b"<p>x</p>", request=Request(url, meta=meta))
        return response, tracker.open(response)

    responses = []
    for n, token in enumerate(["sent", "waiting", "no-items", "parent"]):
        response, page = page_of("http://a.test/%d" % n, **{LEASE_META_KEY: LeaseRef(0, token)})
        responses.append((response, page))
    (_, sent), (_, waiting), _, (_, parent) = responses
    _response, held = page_of("http://a.test/held", **{HOLD_META_KEY: (parent.number, 1)})
    items = []
    for page in (sent, waiting, held):
        item = {"page": page.number}
        items.append(item)
        page.tags.append(origins.tag(item, "origin-%d" % page.number, page))
    assert leases_with_items_sent(tracker) == []  # tagged, none sent yet
    # what the pipeline does with the items of "sent" and of the held page
    for item in (items[0], items[2]):
        tagged = origins.pop(item)
        assert tagged is not None
        origins.sending([tagged[1]])
    assert leases_with_items_sent(tracker) == ["parent", "sent"]
    origins.forget([id(items[1])])  # the tag still held: no other test meets it
