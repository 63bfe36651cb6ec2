"""A user's own Scrapy project on the cluster: ``tests/userproject``, not the bundled spider.

Real ``scrapy crawl`` workers (2-3 at once) crawl a local shop
(:mod:`shopsite`) with the project's CrawlSpider, SitemapSpider, a
RedisCrawlSpider from scrapy-redis and a plain Spider with start_urls and a
FormRequest; every page must be fetched exactly once and every item stored.
Scrapy's tool commands (shell, parse, fetch, check) run in the project too.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import scrapy
from scrapy import signals as scrapy_signals
from shopsite import CATEGORIES, RunningShop, serve_shop

from bloomcrawl.core import keys
from bloomcrawl.crawl import origins
from bloomcrawl.ops.cluster.processes import free_port

from kit import CRAWLER, TESTS
from kit.checks import (
    assert_each_once,
    frontier_left,
    leased_entries,
    leases_held,
    shared_stats,
    stored_items,
)
from kit.wait import wait_until
from kit.workers import Worker, WorkerPool, check_exits, run_workers

USERPROJECT = TESTS / "userproject"
#: the project's own dependency (requirements.txt), not installed in the test venv
PRICEFMT = USERPROJECT / "vendor" / "pricefmt"
PRODUCTS = 60
CRAWL_TIMEOUT_S = 120
#: items through LeasesWhileStored (which notes the leases held as each is stored), then
#: stored
LEASE_CHECKS = json.dumps({"test_user_project.LeasesWhileStored": 200,
                           "bloomcrawl.crawl.pipelines.RedisItemsPipeline": 300})


@pytest.fixture
def shop() -> Iterator[RunningShop]:
    with serve_shop(PRODUCTS) as site:
        yield site


#: MAX_IDLE_TIME_BEFORE_CLOSE of several workers started together (workers())
MULTI_IDLE_S = "4"


def workers(pool: WorkerPool, n: int, spider: str, redis_url: str, shop: RunningShop,
            settings: dict[str, str] | None = None, first: int = 0,
            **spider_args: str) -> list[Worker]:
    """``n`` workers of the user's project, its dependency on their PYTHONPATH.

    Several stay MULTI_IDLE_S idle before they close: a worker that finds the crawl over
    when it starts begins another, whose start requests come again, and on a loaded
    machine one worker may take seconds longer to start than another."""
    args = {} if spider.startswith("redis_") else {"shop_url": shop.url, **spider_args}
    if n > 1:
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": MULTI_IDLE_S, **(settings or {})}
    return pool.start_many(n, redis_url, settings, first=first, spider=spider, args=args,
                           project=USERPROJECT, pythonpath=(PRICEFMT,))


def killed_and_finished(pool: WorkerPool, spider: str, redis_url: str, client: Any,
                        shop: RunningShop, settings: dict[str, str], stored: int, held: str
                        ) -> tuple[int, list[Worker]]:
    """A worker of ``spider`` SIGKILLed once ``stored`` of its items are in Redis and it
    holds the page ``held`` (``"GET /path"``, which the shop answers only after the kill),
    then a second one that crawls to the end: the items stored at the kill, and the
    second worker."""
    gate = shop.server.gate(held)
    [first] = workers(pool, 1, spider, redis_url, shop, settings)

    def enough_stored() -> bool:
        assert first.running, first.tail()
        return bool(client.llen("%s:items" % spider) >= stored and shop.hits()[held] >= 1)

    wait_until(enough_stored, CRAWL_TIMEOUT_S,
               what="%d items stored and %s asked for" % (stored, held))
    first.kill()
    gate.set()
    at_kill = int(client.llen("%s:items" % spider))
    second = workers(pool, 1, spider, redis_url, shop, settings, first=1)
    run_workers(second, CRAWL_TIMEOUT_S)
    check_exits(second)
    return at_kill, second


def get_pages(shop: RunningShop) -> Counter[str]:
    return Counter({"GET " + p: 1 for p in shop.server.all_pages()})


def test_crawlspider_with_items_in_cb_kwargs_crawls_every_page_once(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    ws = workers(worker_pool, 3, "catalog", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert_each_once(shop.hits(), get_pages(shop))
    items = stored_items(redis_client, "catalog")
    assert sorted(i["url"] for i in items) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS))
    # the half-filled item came back an Item, its Decimal price, dataclass and set with it
    assert all(i["price"] == "%d.50" % (10 + int(str(i["url"]).rsplit("/", 1)[1]))
               for i in items)
    assert all(i["reviews"] == int(str(i["url"]).rsplit("/", 1)[1]) % 4 for i in items)
    stats = shared_stats(redis_client, "catalog")
    assert stats["pages"] == sum(get_pages(shop).values())
    assert stats.get("errors", 0) == 0 and stats.get("local", 0) == 0, stats
    assert not any("sets cookies" in w.text() for w in ws)  # no page of it sets one
    assert frontier_left(redis_client, "catalog") == 0
    # the CrawlSpider's rule requests (callback _callback) went through the shared queue
    assert sum(w.stats().get("scheduler/enqueued/redis", 0) for w in ws) >= PRODUCTS


def test_sitemap_spider_crawls_every_product_once(redis_server, redis_client, shop: RunningShop,
                                                   worker_pool: WorkerPool) -> None:
    """With scrapy-redis's own RedisPipeline storing the items, as its users have it."""
    settings = {"ITEM_PIPELINES": json.dumps({"scrapy_redis.pipelines.RedisPipeline": 300})}
    ws = workers(worker_pool, 2, "sitemap", redis_server.url, shop, settings)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    expected = Counter({"GET /sitemap.xml": 1})
    for p in range(PRODUCTS):
        expected.update({"GET /product/%d" % p: 1, "GET /product/%d/reviews" % p: 1})
    assert_each_once(shop.hits(), expected)
    items = stored_items(redis_client, "sitemap")
    assert len(items) == PRODUCTS == len({i["url"] for i in items})
    assert shared_stats(redis_client, "sitemap").get("errors", 0) == 0


def test_a_sitemap_spider_reads_its_sitemap_in_every_crawl_and_takes_sitemaps_as_seeds(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """A URL pushed to a SitemapSpider's list is a sitemap, as its ``sitemap_urls`` are; its
    start requests (not dont_filter) are fetched once per crawl, not once for good."""
    redis_client.rpush("sitemap:start_urls", shop.url + "/sitemap.xml?from=seed")
    ws = workers(worker_pool, 2, "sitemap", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    expected = Counter({"GET /sitemap.xml": 1, "GET /sitemap.xml?from=seed": 1})
    for p in range(PRODUCTS):
        expected.update({"GET /product/%d" % p: 1, "GET /product/%d/reviews" % p: 1})
    assert_each_once(shop.hits(), expected)
    assert shared_stats(redis_client, "sitemap").get("errors", 0) == 0
    # the next crawl reads the sitemap again (a product added since would be found);
    # the products it lists are in the filter
    ws = workers(worker_pool, 2, "sitemap", redis_server.url, shop, first=2)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert_each_once(shop.hits(), expected + Counter({"GET /sitemap.xml": 1}))


def test_a_sitemap_that_moved_is_read_in_every_crawl(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The spider's sitemap URL redirects (301) to where the sitemap is now: the redirect
    of a start request is fetched once per crawl too, not once for good."""
    for first in (0, 2):
        ws = workers(worker_pool, 2, "sitemap", redis_server.url, shop, first=first,
                     sitemap_path="/old-sitemap.xml")
        run_workers(ws, CRAWL_TIMEOUT_S)
        check_exits(ws)
    hits = shop.hits()
    assert (hits["GET /old-sitemap.xml"], hits["GET /sitemap.xml"]) == (2, 2), hits
    assert max(hits[f"GET /product/{p}"] for p in range(PRODUCTS)) == 1


def test_a_spider_that_starts_itself_refuses_pushed_urls_and_starts_in_every_crawl(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """``async start()`` and no ``parse()``: its start requests once per crawl across the
    workers; a URL pushed to its list has no callback to go to: refused, said, counted.
    The item ``start()`` yields (every worker yields it: one takes it, the other drops its
    own) and the start pages' items go through the pipelines once per crawl, as one
    ``scrapy crawl`` stores them each time."""
    redis_client.rpush("starter:start_urls", shop.url + "/category/books")
    ws = workers(worker_pool, 2, "starter", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    once = Counter({"GET /category/%s" % c: 1 for c in ("books", "games", "tools")})
    assert_each_once(shop.hits(), once)
    stats = shared_stats(redis_client, "starter")
    assert stats["bad_start_urls"] == 1 and stats.get("errors", 0) == 0, stats
    assert "spider 'starter' has no parse() callback" in "".join(w.text() for w in ws)
    crawl = ["*", "books", "games", "tools"]
    assert sorted(i["category"] for i in stored_items(redis_client, "starter")) == crawl
    assert [w.stats().get("bloomcrawl/start_items_elsewhere", 0) for w in ws].count(1) == 1
    # through the item pipelines once each, the project's own ones too
    assert sum(w.stats().get("item_scraped_count", 0) for w in ws) == len(crawl)
    assert stats["items"] == len(crawl), stats
    ws = workers(worker_pool, 2, "starter", redis_server.url, shop, first=2)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert_each_once(shop.hits(), once + once)
    assert sorted(i["category"] for i in stored_items(redis_client, "starter")) == sorted(
        crawl + crawl)


def test_redis_crawl_spider_from_scrapy_redis_with_form_requests(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    redis_client.rpush("redis_catalog:start_urls", shop.url + "/")
    ws = workers(worker_pool, 2, "redis_catalog", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    expected = get_pages(shop) + Counter({"GET /search": 1, "POST /search": 3})
    assert_each_once(shop.hits(), expected)
    items = stored_items(redis_client, "redis_catalog")
    products = [i for i in items if i.get("spider") == "redis_catalog"]
    reviews = [i for i in items if "reviews_of" in i]
    results = [i for i in items if "result" in i]
    assert len(products) == len(reviews) == len(results) == PRODUCTS, Counter(
        tuple(sorted(i)) for i in items)
    assert shared_stats(redis_client, "redis_catalog").get("errors", 0) == 0


def test_a_scrapy_redis_spider_with_its_own_key_and_make_request_from_data(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """``redis_key`` of its own, ``make_request_from_data`` overridden (one entry, two
    requests) and scrapy-redis's JSON format: each entry leased once across two workers,
    every request it made crawled once."""
    entries = [json.dumps({"shop": shop.url, "category": c}) for c in CATEGORIES]
    entries.append(json.dumps({"url": shop.url + "/search", "method": "POST", "q": "games"}))
    redis_client.rpush("shopcrawl:seeds", *entries[1:])
    # pushed where `bloomcrawl crawl` pushes before any worker recorded the spider's list
    redis_client.rpush("redis_seeds:start_urls", entries[0])
    ws = workers(worker_pool, 2, "redis_seeds", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    expected = Counter({"POST /search": 1})
    for c in CATEGORIES:
        expected += Counter({"GET /category/%s" % c: 1, "GET /category/%s?page=2" % c: 1})
    assert_each_once(shop.hits(), expected)
    items = stored_items(redis_client, "redis_seeds")
    assert sorted((i["category"], i["page"], i["products"]) for i in items if "category" in i) \
        == sorted((c, page, 5) for c in CATEGORIES for page in ("1", "2")), items
    assert [i for i in items if "posted" in i] == [{"posted": shop.url + "/search",
                                                    "results": PRODUCTS // 3}]
    # every entry leased by the scheduler (scrapy-redis's own reader is off), none left
    assert int(redis_client.get("{shopcrawl:seeds}:seq")) == len(entries)
    assert redis_client.llen("shopcrawl:seeds") == 0
    assert redis_client.zcard("{shopcrawl:seeds}:deadlines") == 0
    assert redis_client.llen("redis_seeds:start_urls") == 0
    assert redis_client.zcard("{redis_seeds:start_urls}:deadlines") == 0
    log = "".join(w.text() for w in ws)
    assert "moved 1 start URL entry from redis_seeds:start_urls to shopcrawl:seeds" in log
    # where the CLI and the exporter look for this spider's start URLs
    assert redis_client.hget(keys.FrontierKeys("redis_seeds").meta, "start_urls") \
        == b"shopcrawl:seeds"
    assert shared_stats(redis_client, "redis_seeds").get("bad_start_urls", 0) == 0


def test_a_bad_entry_of_a_scrapy_redis_spider_is_counted_and_the_others_crawled(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """An entry its make_request_from_data cannot read, or that makes a request bloomcrawl
    cannot queue (not http(s)), is logged, counted and acked; the rest are crawled."""
    redis_client.rpush("shopcrawl:seeds", "not json",
                       json.dumps({"url": "ftp://127.0.0.1/x"}),
                       json.dumps({"shop": shop.url, "category": "books"}))
    ws = workers(worker_pool, 1, "redis_seeds", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert_each_once(shop.hits(), Counter({"GET /category/books": 1,
                                           "GET /category/books?page=2": 1}))
    assert shared_stats(redis_client, "redis_seeds")["bad_start_urls"] == 2
    log = ws[0].text()
    assert "bad start URL entry b'not json' in shopcrawl:seeds" in log, log[-3000:]
    assert "not an http(s) URL: 'ftp://127.0.0.1/x'" in log, log[-3000:]
    assert redis_client.llen("shopcrawl:seeds") == 0


def test_start_urls_once_per_crawl_and_a_request_that_cannot_be_shared_is_crawled(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """A plain Spider's start URLs (dont_filter) once across workers; a lock in meta, and a
    dataclass whose __post_init__ cannot build it again, stay local."""
    ws = workers(worker_pool, 2, "deals", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    once = Counter({"GET /search": 1, "GET /category/books": 1, "POST /search": 3,
                    "GET /deals": 1})
    assert_each_once(shop.hits(), once)
    items = stored_items(redis_client, "deals")
    assert sorted(str(i.get("search")) for i in items if "search" in i) == [
        "books", "games", "tools"]
    # the Search dataclass reached its callback as it was made
    assert sorted(str(i["asked"]) for i in items if "search" in i) == [
        "['books']", "['games']", "['tools']"]
    assert [i for i in items if "deals" in i] == [{"deals": ["half price"], "locked": True}]
    stats = shared_stats(redis_client, "deals")
    assert stats["local"] == 4, stats  # the lock's request and the three searches
    log = "".join(w.text() for w in ws)
    assert "meta['lock']" in log and "this worker crawls it itself" in log
    assert "meta['search'] is of type shopcrawl.items.Search, whose __post_init__ fails" in log
    assert redis_client.hget("deals:crawl", "id") is None  # the crawl ended with the frontier empty

    # a new crawl fetches the start URLs again; the rest is in the filter (the requests
    # kept by their worker are filtered only by it: they are crawled again)
    ws = workers(worker_pool, 1, "deals", redis_server.url, shop, first=2)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert_each_once(shop.hits(), once + Counter({"GET /search": 1, "GET /category/books": 1,
                                                  "GET /deals": 1, "POST /search": 3}))


def test_a_start_request_that_fails_once_is_retried(
        redis_server, redis_client, worker_pool: WorkerPool) -> None:
    """Both start URLs answer 503 the first time: RetryMiddleware's retries go through
    the frontier as retries, not as the start request again (which the filter holds for
    this crawl), and the crawl is the one a site that never failed gives."""
    flaky = frozenset({"GET /search", "GET /category/books"})
    with serve_shop(PRODUCTS, flaky=flaky) as shop:
        ws = workers(worker_pool, 2, "deals", redis_server.url, shop)
        run_workers(ws, CRAWL_TIMEOUT_S)
        check_exits(ws)
        hits = shop.hits()
    assert_each_once(hits, Counter({"GET /search": 2, "GET /category/books": 2,
                                    "POST /search": 3, "GET /deals": 1}))
    assert sum(w.stats().get("retry/count", 0) for w in ws) == 2
    items = stored_items(redis_client, "deals")
    assert sorted(str(i.get("search")) for i in items if "search" in i) == [
        "books", "games", "tools"]
    assert [i for i in items if "deals" in i] == [{"deals": ["half price"], "locked": True}]


def test_a_redirect_off_the_allowed_domains_is_dropped_and_its_page_done(
        redis_server, redis_client, worker_pool: WorkerPool) -> None:
    """Each category's first page links to a page that redirects to another site. The
    CrawlSpider's allowed_domains leave it out, so Scrapy's OffsiteMiddleware ignores
    the redirect, which carries its page's lease, at ``request_scheduled``: the lease
    is acked there (the page is done, as in plain Scrapy), not renewed for good while
    the workers wait for it."""
    with serve_shop(PRODUCTS, partners=True) as shop:
        ws = workers(worker_pool, 2, "catalog", redis_server.url, shop)
        run_workers(ws, CRAWL_TIMEOUT_S)  # they close by themselves
        check_exits(ws)
        hits = shop.hits()
        pages = get_pages(shop)
    partner = {"GET /category/%s/partner" % name for name in CATEGORIES}
    assert partner <= set(pages)
    assert_each_once(hits, pages)  # the redirects' targets, on the other site, never
    assert sum(w.stats().get("offsite/filtered", 0) for w in ws) == len(partner)
    assert frontier_left(redis_client, "catalog") == 0
    # an ignored request counts as neither a page nor an error
    stats = shared_stats(redis_client, "catalog")
    assert stats["pages"] == len(pages) - len(partner), stats
    assert stats.get("errors", 0) == 0, stats
    assert len(stored_items(redis_client, "catalog")) == PRODUCTS


def test_requests_a_callback_hands_the_engine_with_its_page_meta_are_links_of_the_page(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The ``direct`` spider gives every other link to ``engine.crawl()`` itself, with
    ``meta=dict(response.meta)``: the page's lease and ``is_start_request`` come with
    it. Each such request is a link of that page (not a retry of it, which would ack
    the page's lease before its other links were queued, nor a start request, fetched
    once more per crawl), and every page is fetched once."""
    ws = workers(worker_pool, 2, "direct", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    # "/" twice, as in plain Scrapy: its start request is dont_filter, so the filter does
    # not hold it, and the pages link back to it
    expected = get_pages(shop) + Counter({"GET /search": 1, "GET /": 1})
    assert_each_once(shop.hits(), expected)
    assert sorted(str(i["url"]) for i in stored_items(redis_client, "direct")) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS))
    stats = shared_stats(redis_client, "direct")
    assert stats["pages"] == sum(expected.values()), stats
    assert frontier_left(redis_client, "direct") == 0


def test_requests_a_held_page_hands_the_engine_with_its_meta_are_its_links(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The ``direct`` spider with ``held=1``: every link carries a lock, so the worker
    that crawls the start page crawls the whole shop itself, and the start page keeps
    its lease until every page below it is done (a worker killed before then leaves it
    to be crawled again). The requests a held page gives ``engine.crawl()`` with its
    meta are links of that page too: taken for retries of it, each one let go of the
    page's parent once more, and the start page's lease went before the crawl was
    done."""
    ws = workers(worker_pool, 2, "direct", redis_server.url, shop,
                 {"ITEM_PIPELINES": LEASE_CHECKS}, held="1")
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    expected = get_pages(shop) + Counter({"GET /search": 1, "GET /": 1})
    assert_each_once(shop.hits(), expected)
    items = stored_items(redis_client, "direct")
    assert sorted(str(i["url"]) for i in items) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS))
    early = [str(i["url"]) for i in items if not i["start_leased"]]
    assert not early, early
    stats = shared_stats(redis_client, "direct")
    assert stats["local"] == sum(expected.values()) - 1, stats  # all held but the start
    assert frontier_left(redis_client, "direct") == 0


def test_a_response_a_middleware_replaces_with_a_new_request_is_done(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The project's FirstPageMiddleware answers each category's first page with a new
    ``?page=1`` request, made fresh (no meta copied, so no lease): the replaced request
    is done once the new one is queued, and its lease given back. Left held, such
    leases stopped the crawl once they filled the host's budget."""
    middlewares = json.dumps({"bloomcrawl.crawl.middleware.FrontierDownloaderMiddleware": 10,
                              "shopcrawl.middlewares.FirstPageMiddleware": 500})
    ws = workers(worker_pool, 2, "listing", redis_server.url, shop,
                 {"DOWNLOADER_MIDDLEWARES": middlewares})
    run_workers(ws, CRAWL_TIMEOUT_S)  # they close by themselves
    check_exits(ws)
    expected = Counter({"GET /": 1})
    for name in CATEGORIES:
        expected["GET /category/%s" % name] = 1
        for n in range(1, shop.server.pages_of(name) + 1):
            expected["GET /category/%s?page=%d" % (name, n)] = 1
    assert_each_once(shop.hits(), expected)
    assert len(stored_items(redis_client, "listing")) == PRODUCTS
    stats = shared_stats(redis_client, "listing")
    # the replaced first pages are neither pages nor errors
    assert stats["pages"] == sum(expected.values()) - len(CATEGORIES), stats
    assert stats.get("errors", 0) == 0, stats
    assert frontier_left(redis_client, "listing") == 0


def test_the_project_s_own_dupefilter_is_asked_first(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """DUPEFILTER_CLASS set to the project's RFPDupeFilter subclass, which drops the
    reviews of two products in three: those requests are dropped as plain Scrapy drops
    them, and the rest goes through the cluster's filter, each page once."""
    ws = workers(worker_pool, 2, "catalog", redis_server.url, shop, {
        "DUPEFILTER_CLASS": "shopcrawl.dupefilters.ReviewsOfEveryThirdProduct"})
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    expected = Counter({page: 1 for page in get_pages(shop)
                        if not (page.endswith("/reviews") and int(page.split("/")[-2]) % 3)})
    assert_each_once(shop.hits(), expected)
    assert sorted(str(i["url"]) for i in stored_items(redis_client, "catalog")) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS) if p % 3 == 0)
    assert "DUPEFILTER_CLASS shopcrawl.dupefilters.ReviewsOfEveryThirdProduct is asked" \
        " first" in "".join(w.text() for w in ws)
    assert frontier_left(redis_client, "catalog") == 0


def test_a_response_a_middleware_rejects_is_done(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The project's RejectReviewsMiddleware raises IgnoreRequest from ``process_response``
    for every fifth product's reviews, which Scrapy hands to no ``process_exception``:
    the request is done, ignored, and the workers close by themselves. Left leased,
    each kept its worker open for good."""
    middlewares = json.dumps({"bloomcrawl.crawl.middleware.FrontierDownloaderMiddleware": 10,
                              "shopcrawl.middlewares.RejectReviewsMiddleware": 500})
    ws = workers(worker_pool, 2, "catalog", redis_server.url, shop,
                 {"DOWNLOADER_MIDDLEWARES": middlewares})
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert_each_once(shop.hits(), get_pages(shop))
    assert sorted(str(i["url"]) for i in stored_items(redis_client, "catalog")) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS) if p % 5)
    stats = shared_stats(redis_client, "catalog")
    # the rejected pages are neither pages nor errors
    assert stats["pages"] == sum(get_pages(shop).values()) - PRODUCTS // 5, stats
    assert stats.get("errors", 0) == 0, stats
    assert frontier_left(redis_client, "catalog") == 0


def test_a_callback_s_own_download_with_its_page_meta_that_fails_leaves_the_page_leased(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The ``inline`` spider's callbacks download from a stock service that is down,
    through ``engine.download()``, with their page's meta (its lease with it). That
    failure is the callback's to handle: it finished the page as failed, its lease
    acked before its item was stored, and a worker killed then lost the page and every
    page below it."""
    down = "http://127.0.0.1:%d/" % free_port()  # nothing listens there
    ws = workers(worker_pool, 1, "inline", redis_server.url, shop,
                 {"ITEM_PIPELINES": LEASE_CHECKS}, stock_url=down)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    items = stored_items(redis_client, "inline")
    assert sorted(str(i["url"]) for i in items) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS))
    assert all("Refused" in str(i["stock"]) for i in items), items[:3]
    early = [str(i["url"]) for i in items if not i["url_leased"]]
    assert not early, early
    stats = shared_stats(redis_client, "inline")
    assert stats.get("errors", 0) == 0, stats
    assert frontier_left(redis_client, "inline") == 0


class LeasesWhileStored:
    """Test instrumentation: before an item goes on, waits HOLD_S (past the 50 ms within
    which an ack leaves) and notes in it how many leases its spider holds in Redis, and
    whether one of them is for the item's URL, or for the spider's first start URL."""

    HOLD_S = 0.5

    def __init__(self, crawler: Any) -> None:
        self.server = redis.Redis.from_url(crawler.settings["REDIS_URL"])
        self.spider = crawler.spider.name
        self.start_url = next(iter(getattr(crawler.spider, "start_urls", ())), "")

    @classmethod
    def from_crawler(cls, crawler: Any) -> LeasesWhileStored:
        return cls(crawler)

    async def process_item(self, item: Any, spider: Any = None) -> Any:
        await asyncio.sleep(self.HOLD_S)
        item["leases_held"] = leases_held(self.server, self.spider)
        entries = leased_entries(self.server, self.spider)
        item["url_leased"] = self.leased(str(item["url"]), entries)
        item["start_leased"] = self.leased(self.start_url, entries)
        return item

    @staticmethod
    def leased(url: str, entries: list[bytes]) -> bool:
        return any(b'"url":"%s"' % url.encode() in entry for entry in entries)


def test_a_failed_request_is_acked_after_what_its_errback_yields_is_stored(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The ``outage`` spider's errback yields an item for a page it could not fetch, and
    the same request at a mirror (``failure.request.replace(url=...)``, the failed
    request's meta with it). The failed request's lease is held until that item went
    through the pipeline and the mirror was queued: a worker killed before then leaves
    the request to be tried again, and nothing is lost. The mirror request is a new
    request of that page's, not a retry of the failed one, which would ack its lease as
    soon as it was queued."""
    down = "http://127.0.0.1:%d/" % free_port()  # nothing listens there
    ws = workers(worker_pool, 1, "outage", redis_server.url, shop,
                 {"ITEM_PIPELINES": LEASE_CHECKS}, down_url=down)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    items = {str(i["url"]): i for i in stored_items(redis_client, "outage")}
    # Scrapy 2.13.0 and 2.13.1 drop what an errback returns (plain Scrapy too)
    errback_output = scrapy.version_info >= (2, 13, 2)
    mirror = shop.url + "/deals?mirror=1"
    expected = [shop.url + "/deals"] + ([down, mirror] if errback_output else [])
    assert sorted(items) == sorted(expected), (items, ws[0].text()[-3000:])
    if errback_output:
        assert "ConnectionRefused" in str(items[down]["error"]), items[down]
        assert items[down]["url_leased"] is True, items[down]  # its own, not acked yet
        assert items[mirror]["url_leased"] is True, items[mirror]
    assert shop.hits() == Counter({"GET /deals": 1} | (
        {"GET /deals?mirror=1": 1} if errback_output else {})), shop.hits()
    stats = shared_stats(redis_client, "outage")
    # /deals, and the mirror; the unreachable request is an error
    assert stats["pages"] == (2 if errback_output else 1) and stats["errors"] == 1, stats
    assert stats["items"] == len(expected), stats
    assert frontier_left(redis_client, "outage") == 0


@pytest.mark.skipif(scrapy.version_info < (2, 13, 2),
                    reason="Scrapy 2.13.0 and 2.13.1 drop what an errback returns")
def test_what_errbacks_yield_is_stored_once_when_their_pages_are_crawled_again(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """``outage`` with 20 unreachable pages: each errback yields an item and a mirror
    page of its own, fetched again on purpose (``dont_filter``). The first worker reaches
    Redis through the fault proxy; once the shop holds its first mirror page, its frontier
    calls are held, so that page's item is stored and the page never acked. The worker is
    SIGKILLed, and a second crawls its leased pages again, their errbacks too: each item
    is stored once. Scrapy hands an errback's output to no spider middleware: its items
    were stored under random ids (and a warning blamed a pipeline), its dont_filter
    requests were new visits, and both came twice."""
    from faults.proxy import FaultProxy

    pages = 20
    down = "http://127.0.0.1:%d/" % free_port()  # nothing listens there
    mirror = shop.url + "/deals?mirror=1"
    gated = mirror + "&page=0"
    gated_hit = "GET " + gated[len(shop.url):]
    settings = {"ENRICH_DELAY": "0.3", "SCHEDULER_LEASE_TIMEOUT": "3",
                "ITEM_PIPELINES": json.dumps({"shopcrawl.pipelines.EnrichPipeline": 100,
                                              "bloomcrawl.crawl.pipelines.RedisItemsPipeline":
                                              300})}
    gate = shop.server.gate(gated_hit)
    proxy = FaultProxy(redis_server.port).start()
    try:
        [first] = workers(worker_pool, 1, "outage", proxy.url, shop, settings,
                          down_url=down, down_pages=str(pages))

        def holding_the_page() -> bool:
            assert first.running, first.tail()
            return shop.hits()[gated_hit] >= 1

        wait_until(holding_the_page, CRAWL_TIMEOUT_S, what="the first worker holds " + gated)
        proxy.hold_connections(b"{outage:bloomfilter:")
        gate.set()

        def page_item_stored() -> bool:
            assert first.running, first.tail()
            return any(i["url"] == gated for i in stored_items(redis_client, "outage"))

        wait_until(page_item_stored, CRAWL_TIMEOUT_S, what="the item of " + gated)
        first.kill()
    finally:
        proxy.stop()
    second = workers(worker_pool, 1, "outage", redis_server.url, shop, settings, first=1,
                     down_url=down, down_pages=str(pages))
    run_workers(second, CRAWL_TIMEOUT_S)
    check_exits(second)
    stored = Counter(str(i["url"]) for i in stored_items(redis_client, "outage"))
    expected = Counter([shop.url + "/deals", down, mirror]
                       + ["%s?page=%d" % (down, i) for i in range(pages)]
                       + ["%s&page=%d" % (mirror, i) for i in range(pages)])
    assert stored == expected, (expected - stored, stored - expected)
    stats = second[0].stats()
    # the second worker crawled again pages whose items the first had stored: the gated
    # one at least
    assert shop.hits()[gated_hit] >= 2, shop.hits()
    assert stats.get("bloomcrawl/items_stored_before", 0) > 0, stats
    assert "bloomcrawl/items_without_origin" not in stats, stats
    assert frontier_left(redis_client, "outage") == 0


def test_strict_mode_closes_the_spider_on_a_request_it_cannot_share(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    ws = workers(worker_pool, 1, "deals", redis_server.url, shop, {"FRONTIER_STRICT": "True"})
    run_workers(ws, CRAWL_TIMEOUT_S)
    assert ws[0].returncode == 0
    assert ws[0].stats().get("finish_reason") == "unshareable_request", ws[0].text()[-2000:]
    # none of the requests it could not share was fetched: the lock's, the searches'
    assert shop.hits()["GET /deals"] == 0 and shop.hits()["POST /search"] == 0
    assert shared_stats(redis_client, "deals")["unserializable"] >= 1


def test_no_item_is_lost_when_a_worker_dies_with_items_in_its_pipeline(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The lease of a page is acked only after its items were stored.

    Each item spends 1 s in a pipeline; the first worker is SIGKILLed with
    items in flight. Their pages' leases expire and a second worker crawls
    them again: every product's item is stored, once.
    """
    settings = {"ENRICH_DELAY": "1.0", "SCHEDULER_LEASE_TIMEOUT": "3",
                "ITEM_PIPELINES": json.dumps({"shopcrawl.pipelines.EnrichPipeline": 100,
                                              "bloomcrawl.crawl.pipelines.RedisItemsPipeline":
                                              300}),
                "EXTENSIONS": TAGS_AT_CLOSE}
    stored_at_kill, second = killed_and_finished(worker_pool, "catalog", redis_server.url,
                                                 redis_client, shop, settings, 10,
                                                 "GET /product/30/reviews")
    assert 10 <= stored_at_kill < PRODUCTS
    items = stored_items(redis_client, "catalog")
    urls = Counter(str(i["url"]) for i in items)
    missing = {"%s/product/%d" % (shop.url, p) for p in range(PRODUCTS)} - set(urls)
    assert not missing, sorted(missing)
    assert max(urls.values()) == 1  # each stored once, also when its page was crawled twice
    assert all(i["enriched"] for i in items)
    assert frontier_left(redis_client, "catalog") == 0
    # the items were tagged with their pages, and no tag outlived its page
    assert second[0].stats().get("test/items_tagged") == 1
    assert second[0].stats().get("test/item_tags_held") == 0


def test_a_page_fetched_again_on_purpose_stores_its_items_once_each_visit(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The ``stock`` spider fetches each product page a second time on purpose
    (``dont_filter``, another callback), as plain Scrapy lets it: that visit's items are
    stored too, once, also when the first worker is SIGKILLed with items in its pipeline
    and a second worker crawls its leased pages again.

    Items are keyed by their page and position, and a ``dont_filter`` page by its queue
    entry as well: keyed by the page alone, every stock item counted as stored before.
    """
    settings = {"ENRICH_DELAY": "0.3", "SCHEDULER_LEASE_TIMEOUT": "3",
                "ITEM_PIPELINES": json.dumps({"shopcrawl.pipelines.EnrichPipeline": 100,
                                              "bloomcrawl.crawl.pipelines.RedisItemsPipeline":
                                              300})}
    killed_and_finished(worker_pool, "stock", redis_server.url, redis_client, shop, settings,
                        20, "GET /product/30")
    stored = Counter((str(i["url"]), str(i["kind"]))
                     for i in stored_items(redis_client, "stock"))
    expected = Counter({("%s/product/%d" % (shop.url, p), kind): 1
                        for p in range(PRODUCTS) for kind in ("product", "stock")})
    assert stored == expected, (expected - stored, stored - expected)
    hits = shop.hits()
    assert all(hits["GET /product/%d" % p] >= 2 for p in range(PRODUCTS)), hits
    # the kill left pages to be crawled again, and their stock requests made again
    assert any(hits["GET /product/%d" % p] > 2 for p in range(PRODUCTS)), hits
    assert frontier_left(redis_client, "stock") == 0


def test_a_listing_spider_stores_every_listed_item_once_in_fewer_calls(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """A page's items reach RedisItemsPipeline together: those that come while a call is
    under way are stored in the next one, each once."""
    ws = workers(worker_pool, 2, "listing", redis_server.url, shop)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert_each_once(shop.hits(), {"GET " + p for p in shop.server.all_pages()
                                   if p == "/" or p.startswith("/category/")})
    items = stored_items(redis_client, "listing")
    assert sorted(i["url"] for i in items) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS))
    calls = sum(w.stats().get("bloomcrawl/item_store_calls", 0) for w in ws)
    assert 0 < calls < PRODUCTS, calls
    assert shared_stats(redis_client, "listing")["items"] == PRODUCTS
    # the next crawl fetches its start page again, and only that: the listings got the
    # start page's meta (is_start_request too) but are not start requests
    before = shop.hits()
    ws = workers(worker_pool, 1, "listing", redis_server.url, shop, first=2)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    assert shop.hits() - before == Counter({"GET /": 1})


class ItemTagsAtClose:
    """A test extension: the item tags this worker still holds when its spider closes
    (``test/item_tags_held``), and whether it tagged any (``test/items_tagged``)."""

    def __init__(self, crawler: Any) -> None:
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Any) -> ItemTagsAtClose:
        extension = cls(crawler)
        crawler.signals.connect(extension.spider_closed, signal=scrapy_signals.spider_closed)
        return extension

    def spider_closed(self, **kwargs: Any) -> None:
        self.stats.set_value("test/item_tags_held", origins.held())
        self.stats.set_value("test/items_tagged", int(origins.tagged_any))


TAGS_AT_CLOSE = json.dumps({"test_user_project.ItemTagsAtClose": 0})


@pytest.mark.parametrize("pipelines", [{}, {"shopcrawl.pipelines.EnrichPipeline": 100}])
def test_items_are_not_tagged_without_the_items_pipeline(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool,
        pipelines: dict[str, int]) -> None:
    """Without RedisItemsPipeline nothing reads an item's origin: none is kept (it was
    kept for every item scraped, for the worker's life)."""
    settings = {"ITEM_PIPELINES": json.dumps(pipelines), "EXTENSIONS": TAGS_AT_CLOSE}
    ws = workers(worker_pool, 1, "catalog", redis_server.url, shop, settings)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    stats = ws[0].stats()
    assert stats.get("item_scraped_count") == PRODUCTS, stats
    assert stats.get("test/items_tagged") == 0
    assert stats.get("test/item_tags_held") == 0
    assert shared_stats(redis_client, "catalog")["items"] == PRODUCTS


def test_an_item_a_pipeline_replaced_is_stored_and_said(
        redis_server, redis_client, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """A pipeline before RedisItemsPipeline returns a new dict for each Item: every item is
    stored, each once, the worker says why they lost their page's id, and no tag is left
    behind by the Items they replaced."""
    settings = {"ITEM_PIPELINES": json.dumps({"shopcrawl.pipelines.AsDictPipeline": 100,
                                              "bloomcrawl.crawl.pipelines.RedisItemsPipeline":
                                              300}),
                "EXTENSIONS": TAGS_AT_CLOSE}
    ws = workers(worker_pool, 2, "catalog", redis_server.url, shop, settings)
    run_workers(ws, CRAWL_TIMEOUT_S)
    check_exits(ws)
    items = stored_items(redis_client, "catalog")
    assert sorted(i["url"] for i in items) == sorted(
        "%s/product/%d" % (shop.url, p) for p in range(PRODUCTS))
    assert all(i["exported"] for i in items)
    stats = [w.stats() for w in ws]
    assert sum(s.get("bloomcrawl/items_without_origin", 0) for s in stats) == PRODUCTS
    assert all(s.get("test/item_tags_held") == 0 for s in stats), stats
    said = [w for w in ws if "is not the object the callback yielded" in w.text()]
    assert len(said) == sum(1 for s in stats if s.get("item_scraped_count"))


# --- Scrapy's tool commands in the project ------------------------------------------


def scrapy_tool(args: list[str], redis_url: str, shop: RunningShop,
                tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(tmp_path), SHOP_URL=shop.url,
               PYTHONPATH=os.pathsep.join([str(PRICEFMT), str(CRAWLER)]))
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return subprocess.run([sys.executable, "-m", "scrapy", *args, "-s", "REDIS_URL=" + redis_url],
                          cwd=USERPROJECT, env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("args", "expect"), [
    (["parse", "--spider=catalog", "-c", "parse_product", "{shop}/product/3"],
     "/product/3/reviews"),
    (["fetch", "--nolog", "{shop}/product/4"], "EUR 14.50"),
    (["check", "deals"], "OK"),
    (["shell", "{shop}/product/5", "-c", "response.css('h1.name::text').get()"],
     "Product 5"),
])
def test_scrapy_tool_commands_work_and_leave_the_frontier_alone(
        redis_server, redis_client, shop: RunningShop, tmp_path: Path, args: list[str],
        expect: str) -> None:
    redis_client.rpush("catalog:start_urls", shop.url + "/never-crawled-by-a-tool")
    argv = [a.replace("{shop}", shop.url) for a in args]
    result = scrapy_tool(argv, redis_server.url, shop, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert expect in output, output[-3000:]
    # nothing of the cluster's was taken or marked seen
    assert redis_client.lrange("catalog:start_urls", 0, -1) == [
        (shop.url + "/never-crawled-by-a-tool").encode()]
    assert not [k for k in redis_client.scan_iter() if b"bloomfilter" in k or k.endswith(
        b":crawl")], list(redis_client.scan_iter())
    assert "GET /never-crawled-by-a-tool" not in shop.hits()


#: the catalog spider's items through a pipeline that takes 0.3 s each, then stored
SLOW_PIPELINE = {"ENRICH_DELAY": "0.3", "SCHEDULER_LEASE_TIMEOUT": "3",
                 "ITEM_PIPELINES": json.dumps({
                     "shopcrawl.pipelines.EnrichPipeline": 100,
                     "bloomcrawl.crawl.pipelines.RedisItemsPipeline": 300})}


def every_product_once(client: redis.Redis, shop: RunningShop) -> None:
    """Every product's item of the catalog spider is stored, once, and its frontier is empty."""
    urls = Counter(str(i["url"]) for i in stored_items(client, "catalog"))
    expected = {"%s/product/%d" % (shop.url, p) for p in range(PRODUCTS)}
    assert not expected - set(urls), sorted(expected - set(urls))
    assert max(urls.values()) == 1, urls
    assert frontier_left(client, "catalog") == 0


@pytest.mark.slow
def test_a_redis_rollback_under_the_crawlspider_loses_no_item(
        tmp_path, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """Two workers of the project's CrawlSpider (items half-filled on the listing, passed
    in cb_kwargs, finished on the product page; a pipeline that takes 0.3 s an item)
    while Redis is SIGKILLed and started from a snapshot taken a moment before: the items
    stored after it are gone (a product's, whose reviews page the shop answers only after
    the snapshot, at least), and so are the links queued and the acks. Every product's
    item is stored all the same, once, and the frontier ends empty."""
    from kit.redis import RedisServer

    gated_hit = "GET /product/30/reviews"
    gate = shop.server.gate(gated_hit)
    server = RedisServer(tmp_path / "r")
    server.start()
    try:
        ws = workers(worker_pool, 2, "catalog", server.url, shop, SLOW_PIPELINE)
        client = server.client()

        def running() -> None:
            assert all(w.running for w in ws), [w.tail() for w in ws]

        def holding_the_page() -> bool:
            running()
            return shop.hits()[gated_hit] >= 1

        wait_until(holding_the_page, CRAWL_TIMEOUT_S, what="a worker holds " + gated_hit)
        server.bgsave()
        gate.set()
        gated_item = shop.url + "/product/30"

        def gated_item_stored() -> bool:
            running()
            return gated_item in {i["url"] for i in stored_items(client, "catalog")}

        # stored after the snapshot: lost with it
        wait_until(gated_item_stored, CRAWL_TIMEOUT_S, what="the item of " + gated_item)
        server.kill()
        server.start()  # from the snapshot
        client.close()
        client = server.client()
        run_workers(ws, CRAWL_TIMEOUT_S)
        check_exits(ws)
        assert any("is another server now" in w.text() for w in ws)
        every_product_once(client, shop)
        client.close()
    finally:
        server.stop()


@pytest.mark.slow
def test_a_restart_that_kept_the_exchanges_and_lost_items_under_the_crawlspider(
        tmp_path, shop: RunningShop, worker_pool: WorkerPool) -> None:
    """The CrawlSpider's two workers (a pipeline taking 0.3 s an item) reach Redis through
    the fault proxy. Once the shop holds a product's reviews page (where its item is
    finished), the frontier calls are held and a snapshot taken; then the shop answers,
    and the items of the pages in hand, that one's included, are still stored on the
    pipeline's own connection; then Redis is SIGKILLed and started from the snapshot.
    The server holds every exchange a worker had confirmed and none of those items (AOF
    everysec, a replica a moment behind): a worker must not ack their pages there. Every
    product's item is stored, once."""
    from faults.proxy import FaultProxy

    from kit.redis import RedisServer

    gated_hit = "GET /product/30/reviews"
    gate = shop.server.gate(gated_hit)
    server = RedisServer(tmp_path / "r")
    server.start()
    proxy = FaultProxy(server.port).start()
    try:
        ws = workers(worker_pool, 2, "catalog", proxy.url, shop, SLOW_PIPELINE)
        client = server.client()
        counts = [0]

        def running() -> None:
            assert all(w.running for w in ws), [w.tail() for w in ws]

        def holding_the_page() -> bool:
            running()
            return shop.hits()[gated_hit] >= 1

        def quiet() -> bool:
            running()
            counts.append(int(client.llen("catalog:items")))
            return len(counts) > 20 and len(set(counts[-20:])) == 1

        wait_until(holding_the_page, CRAWL_TIMEOUT_S, what="a worker holds " + gated_hit)
        proxy.hold_connections(b"{catalog:bloomfilter:")
        server.bgsave()
        # the gated page's item is stored after this, so after the snapshot
        at_snapshot = int(client.llen("catalog:items"))
        gate.set()
        gated_item = shop.url + "/product/30"

        def gated_item_stored() -> bool:
            running()
            return gated_item in {i["url"] for i in stored_items(client, "catalog")}

        wait_until(gated_item_stored, 20, what="the item of " + gated_item)
        counts[:] = [at_snapshot]
        wait_until(quiet, 20, interval=0.05, what="the items of the pages in hand")
        assert counts[-1] > at_snapshot, (counts[-1], at_snapshot)
        assert proxy.held_connections >= 1
        server.kill()
        server.start()  # from the snapshot
        proxy.resume()
        client.close()
        client = server.client()
        run_workers(ws, CRAWL_TIMEOUT_S)
        check_exits(ws)
        every_product_once(client, shop)
        assert any("kept this worker's exchanges, not all its items" in w.text() for w in ws), (
            "no worker found its exchanges kept and items lost: the case this test is for")
        client.close()
    finally:
        proxy.stop()
        server.stop()
