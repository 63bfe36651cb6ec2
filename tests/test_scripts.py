"""The one Lua runner's partial-failure policy, against a real redis-server."""

from __future__ import annotations

import hashlib

import pytest
import redis

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts


def fp(text: str) -> bytes:
    return hashlib.sha1(text.encode()).digest()


def test_only_the_calls_redis_did_not_run_are_sent_again(redis_client: redis.Redis) -> None:
    bf = BloomFilter(redis_client, "t:bloomfilter", capacity=1000, error_rate=0.01, partitions=1,
                     backend="bitmap")
    add = Script.for_backend("bitmap", "bloom_add.lua")
    contains = Script.for_backend("bitmap", "bloom_contains.lua")
    state = [keys.state_key("t:bloomfilter", 0)]
    redis_client.script_flush()
    redis_client.script_load(add.source)  # as after a restart where one script came back
    calls = [ScriptCall(add, state, [fp("a")]), ScriptCall(contains, state, [fp("a")])]
    added, contained = bf.run_scripts(calls)
    # the add ran once: sent again it would have answered "seen" ("0")
    assert (added, contained) == (b"1", b"1")
    assert bf.info().items == 1


def test_a_deleted_filter_is_created_again_and_only_its_calls_resent(
        redis_client: redis.Redis) -> None:
    bf = BloomFilter(redis_client, "t:bloomfilter", capacity=1000, error_rate=0.01, partitions=1,
                     backend="bitmap")
    bf.add(fp("old"))
    bf.clear()
    answers = bf.run_scripts(
        [ScriptCall(Script.for_backend("bitmap", "bloom_add.lua"),
                    [keys.state_key("t:bloomfilter", 0)], [fp("old") + fp("new")])],
        also=lambda pipe: pipe.incr("t:other"))
    assert answers == [b"11"]  # a new, empty filter: both are new
    assert redis_client.get("t:other") == b"1"  # the plain commands ran once
    assert bf.info().items == 2


def test_a_missing_partition_is_an_error_when_no_filter_can_be_made(
        redis_client: redis.Redis) -> None:
    add = Script.for_backend("bitmap", "bloom_add.lua")
    with pytest.raises(redis.ResponseError, match="BLOOMCRAWL_NOFILTER"):
        run_scripts(redis_client, [ScriptCall(add, ["t:nofilter"], [fp("a")]),
                                   ScriptCall(add, ["t:nofilter2"], [fp("b")])])


def test_a_single_call_that_loads_its_script_then_finds_no_filter_makes_it_again(
        redis_client: redis.Redis) -> None:
    """One call without a pipeline, after a restart that lost both the script cache and
    the partition: the script is loaded, the filter made again, the call answered."""
    bf = BloomFilter(redis_client, "t:restarted", capacity=1000, error_rate=0.01,
                     partitions=1, backend="bitmap")
    bf.add(fp("old"))
    redis_client.script_flush()
    redis_client.delete(keys.state_key("t:restarted", 0))
    # the partition's state is made again; its bits, in the chunks, were kept
    assert bf.contains_many([fp("old")]) == [True]
    assert bf.add(fp("new")) is True
    assert bf.add(fp("new")) is False
    assert bf.info().capacity == 1000
