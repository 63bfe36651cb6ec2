"""A revisit window (BLOOMFILTER_REVISIT_AFTER) against a real redis-server.

W of 2 s in 2 generations (P = 1 s): a URL added less than 2 s ago is a
duplicate, one added more than 3 s ago is new again. Times are Redis's.
"""

from __future__ import annotations

import math

import pytest
import redis
from scrapy.settings import Settings

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.errors import FilterMismatchError, InvalidFilterParameters, SettingError
from bloomcrawl.core.frontier import Frontier
from bloomcrawl.core.keys import FrontierKeys
from bloomcrawl.core.sizing import FilterParams
from bloomcrawl.crawl import seen
from bloomcrawl.crawl.config import FilterConfig, parse_duration
from bloomcrawl.crawl.seen import SeenCache
from bloomcrawl.ops.inspection import partition_fill

from kit.data import fingerprints, outgoing
from kit.redis import redis_now, wait_for_redis_time
from kit.wait import wait_until

WINDOW = 2.0
GENERATIONS = 2
BOUND = WINDOW * (1 + 1 / GENERATIONS)
KEY = "t:bloomfilter"


def windowed(client: redis.Redis, partitions: int = 2, **options: object) -> BloomFilter:
    settings: dict[str, object] = dict(capacity=10_000, error_rate=1e-6, partitions=partitions,
                                       revisit_after=WINDOW, generations=GENERATIONS)
    settings.update(options)
    return BloomFilter(client, KEY, **settings)  # type: ignore[arg-type]




def generation_of(client: redis.Redis, bf: BloomFilter) -> int:
    return math.floor(redis_now(client) * 1000 / bf.params.period_ms)


def generation_keys(client: redis.Redis, partitions: int) -> set[bytes]:
    return {key for p in range(partitions)
            for key in client.scan_iter(match=keys.generation_pattern(KEY, p))}


def test_a_url_added_within_the_window_is_a_duplicate_until_w_at_least(
        redis_client: redis.Redis) -> None:
    bf = windowed(redis_client)
    period = bf.params.period_ms / 1000
    # added at the very end of a generation: the earliest it could be forgotten
    wait_until(lambda: period - 0.2 <= redis_now(redis_client) % period < period - 0.1,
               timeout=5, what="the last 200 ms of a generation")
    fps = fingerprints(200, "late")
    added = redis_now(redis_client)
    assert bf.add_many(fps) == [True] * 200
    wait_for_redis_time(redis_client, added + WINDOW - 0.15)
    assert bf.add_many(fps) == [False] * 200
    assert all(bf.contains_many(fps))


def test_a_url_added_more_than_the_bound_ago_is_new_again(redis_client: redis.Redis) -> None:
    bf = windowed(redis_client)
    period = bf.params.period_ms / 1000
    # added at the very start of a generation: the latest it could be forgotten
    wait_until(lambda: redis_now(redis_client) % period < 0.1, timeout=5,
               what="the first 100 ms of a generation")
    fps = fingerprints(200, "early")
    assert bf.add_many(fps) == [True] * 200
    added = redis_now(redis_client)
    assert bf.add_many(fps) == [False] * 200
    wait_for_redis_time(redis_client, added + BOUND + 0.05)
    assert not any(bf.contains_many(fps))
    assert bf.add_many(fps) == [True] * 200
    assert bf.add_many(fps) == [False] * 200


def test_retiring_a_generation_unlinks_its_state_and_chunks(redis_client: redis.Redis) -> None:
    bf = windowed(redis_client)
    first = generation_of(redis_client, bf)
    bf.add_many(fingerprints(2000, "old"))  # several slices per partition
    old = generation_keys(redis_client, 2)
    assert keys.generation_state_key(KEY, 0, first).encode() in old
    assert any(b":s1:c0" in key for key in old)
    # out of the window, it is kept one period more (to tell revisits), then retired
    wait_until(lambda: generation_of(redis_client, bf) == first + GENERATIONS + 1, timeout=10,
               what="generation %d out of the window" % first)
    bf.add_many(fingerprints(10, "now"))
    assert keys.generation_state_key(KEY, 0, first).encode() in generation_keys(redis_client, 2)
    wait_until(lambda: generation_of(redis_client, bf) > first + GENERATIONS + 1, timeout=10,
               what="generation %d a period out of the window" % first)
    bf.add_many(fingerprints(10, "later"))
    assert generation_keys(redis_client, 2).isdisjoint(old)
    for p in range(2):
        gens = redis_client.hget(keys.state_key(KEY, p), "gens")
        assert gens is not None
        live = [int(g) for g in gens.split()]
        assert live and all(g >= live[-1] - GENERATIONS - 1 for g in live)


def test_stats_count_the_items_of_the_live_generations_exactly(
        redis_client: redis.Redis) -> None:
    bf = windowed(redis_client)
    wait_until(lambda: redis_now(redis_client) % (bf.params.period_ms / 1000) < 0.5,
               timeout=5, what="the first half of a generation")
    first = generation_of(redis_client, bf)
    bf.add_many(fingerprints(300, "a"))
    bf.add_many(fingerprints(300, "a"))
    info = bf.info()
    assert (info.items, info.filtered) == (300, 300)
    wait_until(lambda: generation_of(redis_client, bf) == first + 1, timeout=5,
               what="the next generation")
    bf.add_many(fingerprints(200, "b") + fingerprints(100, "a"))
    info = bf.info()
    assert (info.items, info.filtered) == (500, 400)
    # the first generation leaves the window: read from Redis's clock, before any call
    wait_until(lambda: generation_of(redis_client, bf) == first + GENERATIONS + 1, timeout=5,
               what="generation %d out of the window" % first)
    info = bf.info()
    assert (info.items, info.filtered) == (200, 400)
    bf.add_many(fingerprints(200, "b"))
    assert (bf.info().items, bf.info().filtered) == (200, 600)


def test_a_window_mismatch_is_an_error_naming_what_differs(redis_client: redis.Redis) -> None:
    windowed(redis_client)
    with pytest.raises(FilterMismatchError, match=r"revisit_after: stored 2\.0, asked for 3"):
        windowed(redis_client, revisit_after=3)
    with pytest.raises(FilterMismatchError, match="generations: stored 2, asked for 4"):
        windowed(redis_client, generations=4)
    with pytest.raises(FilterMismatchError, match="revisit_after"):
        BloomFilter(redis_client, KEY, capacity=10_000, error_rate=1e-6, partitions=2)
    BloomFilter(redis_client, "t:plain", capacity=10_000, error_rate=1e-6)
    with pytest.raises(FilterMismatchError, match="revisit_after: stored 0"):
        BloomFilter(redis_client, "t:plain", capacity=10_000, error_rate=1e-6,
                    revisit_after=WINDOW)


def test_generations_share_the_error_rate_and_redisbloom_is_refused(
        redis_client: redis.Redis) -> None:
    params = windowed(redis_client).params
    single = FilterParams(capacity=10_000, error_rate=1e-6 / (GENERATIONS + 1),
                          partitions=2, initial_capacity=params.initial_capacity,
                          partition_by="host", hashing=2)
    assert params.plan() == single.plan()
    assert params.plan() != FilterParams(**{**single.__dict__, "error_rate": 1e-6}).plan()
    with pytest.raises(InvalidFilterParameters, match="bitmap backend"):
        BloomFilter(redis_client, "t:rb", backend="redisbloom", revisit_after=WINDOW)


def test_clear_removes_every_generation(redis_client: redis.Redis) -> None:
    bf = windowed(redis_client)
    bf.add_many(fingerprints(100))
    assert generation_keys(redis_client, 2)
    bf.clear()
    assert redis_client.keys("*") == []


def test_the_frontier_queues_a_url_again_after_the_window(redis_client: redis.Redis) -> None:
    bf = windowed(redis_client, partitions=1)
    frontier = Frontier(redis_client, bf, FrontierKeys("t", partitions=1), queue_type="fifo",
                        lease_timeout=30, worker_id="w1", node="host")
    urls = ["http://a.test/%d" % i for i in range(5)]
    assert frontier.exchange(outgoing(*urls), {}).queued == 5
    added = redis_now(redis_client)
    done = frontier.exchange(outgoing(*urls, "http://a.test/new"), {})
    assert (done.queued, done.filtered) == (1, 5)
    wait_for_redis_time(redis_client, added + BOUND + 0.05)
    assert frontier.exchange(outgoing(*urls), {}).queued == 5


@pytest.mark.parametrize(("raw", "seconds"), [
    ("7d", 604800), ("12h", 43200), ("30m", 1800), ("90s", 90), ("45", 45), (2.5, 2.5),
    ("never", 0), (0, 0)])
def test_durations(raw: object, seconds: float) -> None:
    assert parse_duration(raw) == seconds
    config = FilterConfig.from_settings(Settings({"BLOOMFILTER_REVISIT_AFTER": raw}))
    assert config.revisit_after == seconds


@pytest.mark.parametrize(("settings", "message"), [
    ({"BLOOMFILTER_REVISIT_AFTER": "soon"}, "BLOOMFILTER_REVISIT_AFTER 'soon': expected"),
    ({"BLOOMFILTER_REVISIT_AFTER": "-3s"}, "BLOOMFILTER_REVISIT_AFTER '-3s'"),
    ({"BLOOMFILTER_REVISIT_AFTER": "7d", "BLOOMFILTER_GENERATIONS": 0},
     "BLOOMFILTER_GENERATIONS must be >= 1"),
    ({"BLOOMFILTER_REVISIT_AFTER": "7d", "BLOOMFILTER_BACKEND": "redisbloom"},
     "needs the bitmap backend"),
])
def test_bad_window_settings_are_named(settings: dict[str, object], message: str) -> None:
    with pytest.raises(SettingError, match=message):
        FilterConfig.from_settings(Settings(settings))


def test_a_lost_partition_state_finds_its_generations_again(redis_client: redis.Redis) -> None:
    bf = windowed(redis_client, partitions=1)
    wait_until(lambda: redis_now(redis_client) % (bf.params.period_ms / 1000) < 0.5,
               timeout=5, what="the first half of a generation")
    first = fingerprints(600, "first")  # several slices
    assert all(bf.add_many(first))
    wait_until(lambda: generation_of(redis_client, bf) > math.floor(
        (redis_now(redis_client) - 0.5) * 1000 / bf.params.period_ms), timeout=5,
        what="the next generation")
    second = fingerprints(600, "second")
    assert all(bf.add_many(second))
    assert redis_client.delete(keys.state_key(KEY, 0)) == 1  # evicted, deleted
    assert not any(bf.add_many(first + second))  # the generations are found again
    assert bf.info().items == 1200


def test_the_exporters_partition_fill_sums_the_live_generations(
        redis_client: redis.Redis) -> None:
    bf = windowed(redis_client)
    first = generation_of(redis_client, bf)
    bf.add_many(fingerprints(400, "a"))
    wait_until(lambda: generation_of(redis_client, bf) > first, timeout=5,
               what="the next generation")
    bf.add_many(fingerprints(300, "b"))
    fill = partition_fill(redis_client, KEY, bf.params)
    info = bf.info()
    assert sum(p.items for p in fill) == info.items == 700
    assert sum(p.bits for p in fill) == info.bits
    assert sum(p.bits_set for p in fill) == info.bits_set > 0


def test_the_frontier_tells_which_fingerprints_it_queued(redis_client: redis.Redis) -> None:
    bf = windowed(redis_client, partitions=2)
    frontier = Frontier(redis_client, bf, FrontierKeys("t", partitions=2), queue_type="fifo",
                        lease_timeout=30, worker_id="w1", node="host")
    first = outgoing(*("http://h%d.test/a" % i for i in range(6)))
    assert sorted(frontier.exchange(first, {}).queued_fingerprints) == sorted(
        e.fingerprint for e in first)
    again = outgoing(*("http://h%d.test/%s" % (i, page) for i in range(6) for page in "ab"))
    done = frontier.exchange(again, {}, lease_from=0)
    assert sorted(done.queued_fingerprints) == sorted(
        e.fingerprint for e in again if e.fingerprint not in {f.fingerprint for f in first})


def test_a_windowed_seen_cache_answers_for_half_the_window_to_the_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On the cache's own clock, stepped by the test (binary fractions, exact): an
    entry is answered for at least E and less than 2E after it went in."""
    expire_after, step = 0.25, 1 / 64
    now = [1024.0]
    monkeypatch.setattr(seen.time, "monotonic", lambda: now[0])
    cache = SeenCache(100, expire_after=expire_after)
    fps = fingerprints(3)
    now[0] += expire_after / 4  # the entry goes in a quarter into the cache's period
    cache.remember(fps[:1], sent=1)
    answered = []
    for k in range(1, 65):
        now[0] += step
        answered.append((k * step, fps[0] in cache))
    kept = [after for after, yes in answered if yes]
    assert all(yes for after, yes in answered if after < expire_after), answered
    # until the end of the period after its own: 2E less the quarter it went in late
    assert max(kept) == 2 * expire_after - expire_after / 4 - step, answered
    assert not any(yes for after, yes in answered if after >= 2 * expire_after), answered
    cache.remember(fps[1:2], sent=1)
    assert fps[1] in cache
    forever = SeenCache(100)
    forever.remember(fps, sent=3)
    now[0] += 100.0
    assert all(fp in forever for fp in fps) and not forever.expires


def test_a_generation_is_sized_from_the_one_before(redis_client: redis.Redis) -> None:
    bf = windowed(redis_client, partitions=1)
    wait_until(lambda: redis_now(redis_client) % (bf.params.period_ms / 1000) < 0.3,
               timeout=5, what="the start of a generation")
    first = generation_of(redis_client, bf)
    assert all(bf.add_many(fingerprints(3000, "busy")))  # several of the template's slices
    busy = redis_client.hgetall(keys.generation_state_key(KEY, 0, first))
    assert int(busy[b"slices"]) > 2
    wait_until(lambda: generation_of(redis_client, bf) > first, timeout=5,
               what="the next generation")
    assert all(bf.add_many(fingerprints(3000, "steady")))
    gens = redis_client.hget(keys.state_key(KEY, 0), "gens")
    assert gens is not None
    state = redis_client.hgetall(keys.generation_state_key(KEY, 0, int(gens.split()[-1])))
    # its first slice holds what the one before held: the same load fits in one slice
    assert int(state[b"plan:0"].split()[0]) >= 3000 > int(busy[b"plan:0"].split()[0])
    assert int(state[b"slices"]) == 1
    assert int(state[b"max_slices"]) < int(busy[b"max_slices"])
    assert not any(bf.add_many(fingerprints(3000, "busy") + fingerprints(3000, "steady")))
    assert bf.info().items == 6000


def test_a_url_queued_again_after_its_window_counts_as_revisited(
        redis_client: redis.Redis) -> None:
    """The generation that left the window is kept one period: what it holds and is
    queued again then is a revisit; what was forgotten longer ago, or never queued, new."""
    bf = windowed(redis_client, partitions=1)
    frontier = Frontier(redis_client, bf, FrontierKeys("t", partitions=1), queue_type="fifo",
                        lease_timeout=30, worker_id="w1", node="host")
    period = bf.params.period_ms / 1000
    wait_until(lambda: redis_now(redis_client) % period < 0.3, timeout=5,
               what="the start of a generation")
    first = generation_of(redis_client, bf)
    soon = ["http://a.test/soon/%d" % i for i in range(5)]
    later = ["http://a.test/later/%d" % i for i in range(4)]
    done = frontier.exchange(outgoing(*soon, *later), {})
    assert (done.queued, done.revisited) == (9, 0)
    # first out of the window, kept: the URLs queued again are revisits, a new one is not
    wait_until(lambda: generation_of(redis_client, bf) == first + GENERATIONS + 1, timeout=10,
               what="generation %d just out of the window" % first)
    done = frontier.exchange(outgoing(*soon, "http://a.test/never-before"), {})
    assert (done.queued, done.revisited, done.filtered) == (6, 5, 0)
    assert int(redis_client.hget(keys.state_key(KEY, 0), "revisited") or 0) == 5
    # a period later the generation is retired: forgotten longer ago is new
    wait_until(lambda: generation_of(redis_client, bf) > first + GENERATIONS + 1, timeout=10,
               what="generation %d retired" % first)
    done = frontier.exchange(outgoing(*later), {})
    assert (done.queued, done.revisited) == (4, 0)
