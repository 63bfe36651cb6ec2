"""``bench/dedup.py --quick`` runs end to end and prints every row.

A check that the benchmark works, not a timing: no rate is asserted.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.scripts import load_lua
from bloomcrawl.ops.cluster.processes import redisbloom_module

from kit import ROOT

BENCH = ROOT / "bench" / "dedup.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None,
                       reason="redis-server is not installed"),
]

PLAIN_ROWS = [
    "scrapy-redis set (SADD)",
    "seeds' recipe (exists+insert)",
    "bloomcrawl add, bitmap",
    "bloomcrawl add_many, bitmap",
    "same again (all duplicates)",
    "bloomcrawl request_seen, bitmap",
    "requests_seen, batches of",
    "scrapy-redis RFPDupeFilter (SADD)",
    "rate floor: fingerprint + the probe",
    "scrapy-redis SADD, in turns with it",
    "request_seen, bitmap, in turns",
    "its floor script (",
    "seeds' recipe RFPDupeFilter",
    "bloomcrawl's filter bits/item",
    "m/n = 10 (DESIGN.md)",
]
MODULE_ROWS = [
    "RedisBloom BF.ADD",
    "RedisBloom BF.MADD",
    "bloomcrawl add, redisbloom",
    "bloomcrawl add_many, redisbloom",
    "bloomcrawl request_seen, redisbloom",
    "request_seen, redisbloom, in turns",
    "its floor script, in turns",
    "BF.ADD, in turns",
]
TARGETS = [
    "add_many, bitmap: Redis CPU per decision",
    "add_many, bitmap: decisions/s, one process",
    "add, bitmap: rate / BF.ADD rate",
    "add_many, redisbloom: rate / BF.MADD rate",
    "request_seen, bitmap: rate / recipe",
    "request_seen, redisbloom: rate / recipe",
]


def run_bench(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[str, dict]:
    out = tmp_path / "dedup.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def assert_targets_printed(stdout: str) -> None:
    for name in TARGETS:
        line = next((x for x in stdout.splitlines() if x.startswith(name)), None)
        assert line is not None, name
        assert line.split()[-1] in ("PASS", "MISS", "n/a"), line


def test_quick_run_prints_every_contender(tmp_path: Path, env_no_state: dict[str, str]) -> None:
    stdout, numbers = run_bench(tmp_path, env_no_state)
    expected = PLAIN_ROWS + (MODULE_ROWS if redisbloom_module()[0] else [])
    missing = [row for row in expected if row not in stdout]
    assert not missing, stdout
    assert_targets_printed(stdout)
    keys = {row["key"] for row in numbers["contenders"]}
    assert {"set", "recipe", "add", "add_many", "add_many_dup"} <= keys
    seen_keys = {row["key"] for row in numbers["request_seen"]}
    assert {"bloomcrawl", "bloomcrawl_batched", "set", "recipe", "floor", "set_turns",
            "turns"} <= seen_keys
    # the rate floor of a one-at-a-time script dupefilter, beside SADD's: every request new
    by_key = {row["key"]: row for row in numbers["request_seen"]}
    assert by_key["floor"]["requests_per_second"] > 0
    assert by_key["set_turns"]["seen"] == 0, by_key["set_turns"]
    rate = next(t for t in numbers["targets_cpu"]
                if t["name"] == "request_seen, bitmap: rate / scrapy-redis SADD's")
    assert rate["floor"] == pytest.approx(by_key["floor"]["requests_per_second"]
                                          / by_key["set_turns"]["requests_per_second"])
    if redisbloom_module()[0]:
        assert {"bf_add", "bf_madd", "bf_madd_dup", "add_rb", "add_many_rb",
                "add_many_rb_dup"} <= keys
        assert {"bloomcrawl_rb", "bloomcrawl_rb_batched", "turns_rb", "turns_bf_add",
                "turns_floor", "turns_floor_rb"} <= seen_keys
        # a single request_seen's Redis CPU targets and their floors: each backend and its
        # floor script measured in turns with BF.ADD, on new requests (seen: false
        # positives only, at an error rate of 0.001)
        for key in ("turns", "turns_rb", "turns_bf_add", "turns_floor", "turns_floor_rb"):
            assert by_key[key]["seen"] <= by_key[key]["requests"] // 100, by_key[key]
        # ... and judged by the median of each round's ratio to BF.ADD in that round
        turns = len(by_key["turns_bf_add"]["redis_cpu_to_bf_add_by_round"])
        assert turns >= 3
        assert by_key["turns_bf_add"]["redis_cpu_to_bf_add_by_round"] == [1.0] * turns
        for backend, key in (("bitmap", "turns"), ("redisbloom", "turns_rb")):
            target = next(t for t in numbers["targets_cpu"]
                          if t["name"] == f"request_seen, {backend}: Redis CPU / BF.ADD's")
            floor = key.replace("turns", "turns_floor")
            for name, row in (("value", key), ("floor", floor)):
                rounds = by_key[row]["redis_cpu_to_bf_add_by_round"]
                assert len(rounds) == turns and all(x > 0 for x in rounds), rounds
                assert target[name] == pytest.approx(statistics.median(rounds))
        # the duplicates target: add_many beside BF.MADD in turns, the median round
        dup = next(t for t in numbers["targets_cpu"]
                   if t["name"] == "add_many, bitmap, duplicates: Redis CPU / BF.MADD's")
        rounds = next(r for r in numbers["contenders"]
                      if r["key"] == "add_many_dup")["extra"]["to_bf_madd_in_turns"]
        assert len(rounds) >= 3 and all(x > 1 for x in rounds), rounds
        assert dup["value"] == pytest.approx(statistics.median(rounds))
        # the lookups at the largest size: beside BF.MADD on a filter holding the same URLs,
        # in turns, each target the median of the rounds' ratios
        now = numbers["growth"]["schemes"]["now"]
        for kind in ("duplicates", "pages", "new"):
            rounds = now["to_bf_madd_by_round"][kind]
            assert len(rounds) >= 3 and all(x > 0 for x in rounds), rounds
            target = next(t for t in numbers["growth"]["targets_cpu"]
                          if t["name"] == f"{kind}: Redis CPU / BF.MADD's")
            assert target["value"] == pytest.approx(statistics.median(rounds))
            assert now["bf_madd_redis_cpu_us_per_decision"][kind] > 0
        # one RedisBloom filter all along: a scaled-out one would be another filter
        assert now["bf_madd_filter"]["filters"] == 1, now["bf_madd_filter"]
        assert now["bf_madd_filter"]["items"] <= now["bf_madd_filter"]["capacity"]
        # the bit layout's own cost, beside BF.MADD: bloomcrawl's script on one slice
        assert all(x > 1 for x in numbers["layout_x_bf_madd"].values()), numbers
        assert "the bit layout itself" in stdout
        # the new items' floor is the least Lua found for the layout, with the table of
        # what other block sizes would cost in bits
        new = next(t for t in numbers["targets_cpu"]
                   if t["name"] == "add_many, bitmap, new: Redis CPU / BF.MADD's")
        assert new["floor"] is not None and new["floor"] > 1, new
        assert "least Lua found for this bit layout" in stdout
        assert "64 bits " in stdout and "(bloomcrawl's)" in stdout
    # its probe added every item once and found each one again
    added, found = numbers["one_slice_counts"]
    assert added == found > 0, numbers["one_slice_counts"]
    for row in numbers["contenders"]:
        assert row["decisions_per_second"] > 0, row
        if row["key"].endswith("_dup"):
            assert row["new"] == 0, row  # the same fingerprints again: all seen


def test_quick_run_without_the_module_says_why(tmp_path: Path,
                                               env_no_state: dict[str, str]) -> None:
    stdout, numbers = run_bench(tmp_path, env_no_state, "--no-redisbloom")
    assert "skipped: --no-redisbloom given" in stdout
    assert not [row for row in MODULE_ROWS if row in stdout]
    assert [row for row in PLAIN_ROWS if row not in stdout] == []
    assert_targets_printed(stdout)
    assert [t["verdict"] for t in numbers["targets"] if "redisbloom" in t["name"]] == ["n/a"] * 2
    # every target measured beside RedisBloom says so, at a million and at the largest size
    beside = [t for t in numbers["targets_cpu"] + numbers["growth"]["targets_cpu"]
              if "BF.MADD's" in t["name"] or "BF.ADD's" in t["name"]]
    assert len(beside) == 7 and all(t["verdict"] == "n/a" for t in beside), beside
    assert numbers["redisbloom_skipped"] == "--no-redisbloom given"


def test_quick_window_run_prints_the_window_rows(tmp_path: Path,
                                                 env_no_state: dict[str, str]) -> None:
    # g = 2: the shortest run (W x (2 + 3/g)) that still reaches the bound
    stdout, numbers = run_bench(tmp_path, env_no_state, "--window", "--window-generations", "2")
    for row in ("windowed filter", "plain filter, the window's URLs",
                "today's filter, the same stream"):
        assert row in stdout, stdout
    for name in ("bits per window URL vs a plain filter", "Redis CPU per decision vs today's",
                 "false negatives within W"):
        line = next((x for x in stdout.splitlines() if x.startswith(name)), None)
        assert line is not None and line.split()[-1] in ("PASS", "MISS"), stdout
    window = numbers["window"]
    assert window["generations"] == 2
    assert window["duplicates_checked"] > 0 and window["false_negatives"] == 0
    assert window["live_items"] >= window["window_urls"] > 0
    assert window["windowed_redis_us"] > 0 and window["today_redis_us"] > 0


def layout_floor() -> Any:
    spec = importlib.util.spec_from_file_location("_layout_floor",
                                                  BENCH.parent / "_layout_floor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layout_floor_probe_finds_what_it_wrote(redis_client: redis.Redis) -> None:
    """The floor probe of a new item (bench/_layout_floor.py) builds a real write: each
    new item's bits are written into its block without moving the others, so the same
    items coming again are all found, by it and by the duplicate's probe, which finds
    none of them before and writes nothing."""
    probe = layout_floor()
    blocks = 64
    fps = b"".join(hashlib.sha1(b"item-%d" % i).digest() for i in range(300))
    for k in (7, 13, 20):
        source = probe.layout_probe(k, 256, blocks)
        seen = probe.layout_probe(k, 256, blocks, write=False)
        redis_client.set("{probe}:c", bytes(blocks * 256))
        assert redis_client.eval(seen, 1, "{probe}:c", fps) == 0
        assert redis_client.eval(source, 1, "{probe}:c", fps) == 300
        written = redis_client.get("{probe}:c")
        assert redis_client.eval(source, 1, "{probe}:c", fps) == 0
        assert redis_client.eval(seen, 1, "{probe}:c", fps) == 300
        assert redis_client.get("{probe}:c") == written
        assert redis_client.strlen("{probe}:c") == blocks * 256


def test_the_floor_reads_slices_whole_by_the_scripts_rule() -> None:
    """The block-read floor (bench/_layout_floor.py) and bloom_common.lua read an older
    slice whole below the same bytes per expected lookup."""
    found = re.search(r"^local WHOLE_READ_BYTES = (\d+)$", load_lua("bloom_common.lua"),
                      re.MULTILINE)
    assert found is not None
    assert int(found.group(1)) == layout_floor().WHOLE_READ_BYTES


def getranges(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0))


def test_the_block_reads_floor_counts_what_the_script_reads(redis_client: redis.Redis) -> None:
    """The floors' block reads (bench/_layout_floor.py) follow the script's own lookups: a
    grown filter decided one item a call (no slice read whole) makes as many GETRANGEs as
    they count, for new items over its filling and for duplicates after."""
    floor = layout_floor()
    bf = BloomFilter(redis_client, "bench:reads", capacity=100_000, error_rate=0.001,
                     partitions=2, initial_capacity=16)
    fps = [hashlib.sha1(b"reads-%d" % i).digest() for i in range(1500)]
    redis_client.config_resetstat()
    assert all(bf.add(fp) for fp in fps)
    new_reads = getranges(redis_client)
    redis_client.config_resetstat()
    assert not any(bf.add(fp) for fp in fps)
    dup_reads = getranges(redis_client)
    # batch 0: every slice is larger than what such a call reads whole
    reads = floor.block_reads(redis_client, bf.key, 2, 0)
    assert bf.info().slices >= 6
    assert new_reads == round(reads.new * len(fps))
    # a false positive in a slice looked in before the item's own stops the lookup early
    assert dup_reads <= round(reads.duplicate * len(fps))
    assert dup_reads >= round(reads.duplicate * len(fps)) - 3
    assert 1.5 < reads.duplicate < reads.new, (reads, new_reads, dup_reads)
