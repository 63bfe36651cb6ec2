"""Named revisit windows (BLOOMFILTER_REVISIT_WINDOWS) against a real redis-server.

Two windows beside the default one (BLOOMFILTER_REVISIT_AFTER = 0, never):
"listing" of 2 s in 2 generations (a URL added more than 3 s ago is new
again) and "article", never. Each window is a ring of its own: a URL is a
duplicate only of what was added in the same window. Times are Redis's.
"""

from __future__ import annotations

import logging

import pytest
import redis
from scrapy import Request, Spider
from scrapy.settings import Settings

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.errors import FilterMismatchError, SettingError, UnknownWindow
from bloomcrawl.core.frontier import Frontier, Outgoing
from bloomcrawl.core.keys import FrontierKeys
from bloomcrawl.crawl.config import FilterConfig
from bloomcrawl.crawl.windows import RevisitWindows, window_fingerprint
from bloomcrawl.ops.inspection import partition_fill

from kit.cluster import RedisClusterProcesses
from kit.data import fingerprints, outgoing
from kit.redis import redis_now, wait_for_redis_time
from kit.wait import wait_until

KEY = "t:bloomfilter"
LISTING = 2.0
GENERATIONS = 2
BOUND = LISTING * (1 + 1 / GENERATIONS)
WINDOWS = {"listing": LISTING, "article": 0}




def named(client: redis.Redis, partitions: int = 2, **options: object) -> BloomFilter:
    settings: dict[str, object] = dict(capacity=10_000, error_rate=1e-6, partitions=partitions,
                                       generations=GENERATIONS, windows=WINDOWS)
    settings.update(options)
    return BloomFilter(client, KEY, **settings)  # type: ignore[arg-type]


def listing_generation(client: redis.Redis, bf: BloomFilter) -> int:
    names = [name for name, _ in bf.params.windows]
    period = bf.params.window_periods_ms()[names.index("listing")]
    return int(redis_now(client) * 1000 // period)


def test_each_window_is_a_filter_of_its_own(redis_client: redis.Redis) -> None:
    bf = named(redis_client)
    fps = fingerprints(300, "page")
    assert bf.add_many(fps, ["listing"] * 300) == [True] * 300
    assert bf.add_many(fps, ["listing"] * 300) == [False] * 300
    # the same fingerprints in another window, or in the default one, are new there
    assert bf.add_many(fps, ["article"] * 300) == [True] * 300
    assert bf.add_many(fps) == [True] * 300
    assert bf.add_many(fps, [None, "default", "article"] * 100) == [False] * 300
    assert all(bf.contains_many(fps, ["listing"] * 300))
    assert not any(bf.contains_many(fingerprints(50, "other"), ["article"] * 50))
    assert bf.info().items == 900


def test_a_short_window_forgets_while_never_keeps(redis_client: redis.Redis) -> None:
    bf = named(redis_client)
    period = LISTING / GENERATIONS
    wait_until(lambda: redis_now(redis_client) % period < 0.1, timeout=5,
               what="the first 100 ms of a generation")
    listing, article = fingerprints(200, "listing"), fingerprints(200, "article")
    assert bf.add_many(listing + article, ["listing"] * 200 + ["article"] * 200) == [True] * 400
    added = redis_now(redis_client)
    wait_for_redis_time(redis_client, added + LISTING - 0.3)
    assert bf.add_many(listing, ["listing"] * 200) == [False] * 200
    wait_for_redis_time(redis_client, added + BOUND + 0.05)
    # the listing pages are new again; the articles, in a window that never forgets, not
    assert bf.add_many(listing, ["listing"] * 200) == [True] * 200
    assert bf.add_many(article, ["article"] * 200) == [False] * 200
    # the articles' ring kept one generation: nothing of it was retired
    for p in range(2):
        assert redis_client.hget(keys.state_key(KEY, p), keys.generations_field(1)) == b"0"


def test_retiring_a_named_windows_generation_unlinks_only_its_keys(
        redis_client: redis.Redis) -> None:
    bf = named(redis_client)
    first = listing_generation(redis_client, bf)
    bf.add_many(fingerprints(2000, "old"), ["listing"] * 2000)
    bf.add_many(fingerprints(500, "kept"), ["article"] * 500)
    ring = keys.generations_field(2)  # "listing" is the second name in order
    old = {key for p in range(2)
           for key in redis_client.scan_iter(match=keys.generation_pattern(KEY, p, 2))}
    assert old and any(b":s1:c0" in key for key in old)
    wait_until(lambda: listing_generation(redis_client, bf) > first + GENERATIONS + 1,
               timeout=10,
               what="listing generation %d out of the window" % first)
    bf.add_many(fingerprints(10, "now"), ["listing"] * 10)
    now = {key for p in range(2)
           for key in redis_client.scan_iter(match=keys.generation_pattern(KEY, p, 2))}
    assert now.isdisjoint(old)
    assert not any(bf.add_many(fingerprints(500, "kept"), ["article"] * 500))
    assert bf.info().items == 510
    for p in range(2):
        assert redis_client.hget(keys.state_key(KEY, p), ring) is not None


def test_an_unknown_window_is_an_error_naming_the_windows(redis_client: redis.Redis) -> None:
    bf = named(redis_client)
    with pytest.raises(UnknownWindow, match=r"no revisit window 'articles'.*'article', 'listing'"):
        bf.add(fingerprints(1)[0], "articles")
    plain = BloomFilter(redis_client, "t:plain", capacity=1000, error_rate=1e-3)
    with pytest.raises(UnknownWindow, match="has none"):
        plain.add(fingerprints(1)[0], "listing")
    assert plain.info().items == 0


def test_other_windows_are_a_mismatch_naming_both(redis_client: redis.Redis) -> None:
    named(redis_client)
    with pytest.raises(FilterMismatchError, match=r"windows: stored \(\('article', 0\), "
                                                  r"\('listing', 2\.0\)\), asked for \(\)"):
        named(redis_client, windows=None)
    with pytest.raises(FilterMismatchError, match="windows: stored"):
        named(redis_client, windows={"listing": 3.0, "article": 0})
    BloomFilter(redis_client, "t:plain", capacity=10_000, error_rate=1e-6)
    with pytest.raises(FilterMismatchError, match=r"windows: stored \(\), asked for"):
        BloomFilter(redis_client, "t:plain", capacity=10_000, error_rate=1e-6, windows=WINDOWS)


def test_a_lost_partition_state_finds_every_rings_generations(
        redis_client: redis.Redis) -> None:
    bf = named(redis_client, partitions=1)
    fps = fingerprints(600, "x")
    rings: list[str | None] = [None, "listing", "article"]
    for ring in rings:
        assert all(bf.add_many(fps, [ring] * 600))
    assert redis_client.delete(keys.state_key(KEY, 0)) == 1  # evicted, deleted
    for ring in rings:
        assert not any(bf.add_many(fps, [ring] * 600))
    assert bf.info().items == 1800
    assert sum(p.items for p in partition_fill(redis_client, KEY, bf.params)) == 1800


def test_clear_removes_every_ring(redis_client: redis.Redis) -> None:
    bf = named(redis_client)
    bf.add_many(fingerprints(100), ["listing", "article"] * 50)
    bf.add_many(fingerprints(100))
    bf.clear()
    assert redis_client.keys("*") == []


def test_the_frontier_queues_by_window(redis_client: redis.Redis) -> None:
    bf = named(redis_client, partitions=1)
    frontier = Frontier(redis_client, bf, FrontierKeys("t", partitions=1), queue_type="fifo",
                        lease_timeout=30, worker_id="w1", node="host")
    plain = outgoing("http://a.test/1", "http://a.test/2")
    listing = [Outgoing(e.fingerprint, False, e.score, e.payload, e.host, "b") for e in plain]
    assert frontier.exchange(plain, {}).queued == 2
    assert frontier.exchange(listing, {}).queued == 2  # a window of its own
    done = frontier.exchange(plain + listing, {})
    assert (done.queued, done.filtered) == (0, 4)


@pytest.mark.parametrize(("raw", "windows"), [
    ({"listing": "1h", "article": "never"}, (("article", 0.0), ("listing", 3600.0))),
    ('{"hourly": "60m", "daily": 86400}', (("daily", 86400.0), ("hourly", 3600.0))),
    ({}, ()),
])
def test_window_settings(raw: object, windows: tuple[tuple[str, float], ...]) -> None:
    config = FilterConfig.from_settings(Settings({"BLOOMFILTER_REVISIT_WINDOWS": raw}))
    assert config.windows == windows


@pytest.mark.parametrize(("raw", "message"), [
    ({"listing": "soon"}, "BLOOMFILTER_REVISIT_WINDOWS window 'listing': 'soon': expected"),
    ('["listing"]', "expected a dict of window name to duration"),
    ({"default": "1h"}, "'default' is BLOOMFILTER_REVISIT_AFTER's"),
    ({"bad name": "1h"}, "a revisit window's name is 1-40 letters"),
    ({"w%d" % i: 60 for i in range(27)}, "at most 26 named revisit windows"),
])
def test_bad_window_settings_are_named(raw: object, message: str) -> None:
    with pytest.raises(SettingError, match=message):
        FilterConfig.from_settings(Settings({"BLOOMFILTER_REVISIT_WINDOWS": raw}))
    with pytest.raises(SettingError, match="needs the bitmap backend"):
        FilterConfig.from_settings(Settings({"BLOOMFILTER_REVISIT_WINDOWS": {"a": 60},
                                             "BLOOMFILTER_BACKEND": "redisbloom"}))


class Listings(Spider):
    name = "listings"
    revisit_window = "listing"


def test_a_request_chooses_its_window_and_the_spider_sets_the_default(
        redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    params = named(redis_client).params
    fp = fingerprints(1)[0]
    windows = RevisitWindows(params, Listings())
    assert windows.fingerprint(fp, Request("http://a.test/")) == (
        window_fingerprint(fp, "listing"), "b", "listing")
    assert windows.fingerprint(fp, Request("http://a.test/", meta={"revisit": "article"})) == (
        window_fingerprint(fp, "article"), "a", "article")
    assert windows.fingerprint(fp, Request("http://a.test/", meta={"revisit": "default"})) == (
        fp, "0", "default")
    # a name the filter does not have: logged once, and the request is not dropped
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            assert windows.of(Request("http://a.test/", meta={"revisit": "daily"})) == (
                "b", "listing")
    assert windows.unknown == 3
    assert len([r for r in caplog.records if "no revisit window 'daily'" in r.message]) == 1
    plain = RevisitWindows(params, Spider("other"))
    assert plain.fingerprint(fp, Request("http://a.test/")) == (fp, "0", "default")


def test_a_spider_naming_no_window_does_not_open(redis_client: redis.Redis) -> None:
    plain = BloomFilter(redis_client, "t:plain", capacity=1000, error_rate=1e-3)
    with pytest.raises(SettingError, match="spider 'listings': revisit_window = 'listing'"):
        RevisitWindows(plain.params, Listings())


def test_windows_on_a_redis_cluster(clean_cluster: RedisClusterProcesses) -> None:
    """Every ring's keys keep their partition's hash tag: each call is one slot's."""
    client = clean_cluster.cluster_client()
    bf = named(client, partitions=12, revisit_after=LISTING)
    fps = fingerprints(1200, "cluster")
    rings: list[str | None] = [None, "listing", "article"] * 400
    assert all(bf.add_many(fps, rings))
    added = redis_now(client)
    assert not any(bf.add_many(fps, rings))
    masters = clean_cluster.masters()
    assert all(any(clean_cluster.node_client(m).scan_iter(match="*:w*g*:state"))
               for m in masters)  # the partitions, rings and all, are spread out
    wait_for_redis_time(client, added + BOUND + 0.05)
    # the default window and "listing" forgot; "article" never does
    again = bf.add_many(fps, rings)
    assert again == [ring != "article" for ring in rings]
    assert bf.info().items == 1200
    bf.clear()
    assert all(clean_cluster.node_client(m).dbsize() == 0 for m in masters)
