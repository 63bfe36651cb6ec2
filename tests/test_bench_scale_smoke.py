"""``bench/scale.py --quick`` runs end to end and prints every target's row.

A real run (one Redis, Redis Clusters of 1, 2 and 3 masters, real crawls),
not a timing: no rate is asserted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kit import ROOT

BENCH = ROOT / "bench" / "scale.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                       reason="redis-server and redis-cli are not installed"),
]

#: (label, masters column) of each row of the main table
TARGETS = [("1 Redis", "-"), ("cluster", "1"), ("cluster", "2"), ("cluster", "3")]


@pytest.mark.long
def test_quick_run_prints_every_target(tmp_path: Path, env_no_state: dict[str, str]) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        cwd=tmp_path, env=env_no_state, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()

    header = next(i for i, line in enumerate(lines) if line.startswith("target   "))
    rows = [line.split() for line in lines[header + 2:header + 2 + len(TARGETS)]]
    # label (two words for "1 Redis"), masters, partitions, decisions/s, ...
    found = [(" ".join(r[:2]), r[2]) if r[0] == "1" else (r[0], r[1]) for r in rows]
    assert found == TARGETS, proc.stdout
    assert "FAIL" not in "\n".join(lines[header:header + 2 + len(TARGETS)])
    for name in ("MEASURED here", "* PROJECTED, not measured", "PROJECTED (arithmetic",
                 "stats slot:", "partition script call", "queue memory:",
                 "exporter snapshot", "exchange floor", "FLOOR, the same page",
                 "the plan's page (1 new link)", "measured on a filter sized up front",
                 "TARGET: at most 400 us a page", "sized: the median of 3 turns;"):
        assert any(name in line for line in lines), (name, proc.stdout)
    # the target's line says whether this machine could meet it at all: its floor there
    target = next(line for line in lines if "TARGET: at most 400 us a page" in line)
    found = re.search(r": ([\d,]+) us, (PASS|MISS); its floor on this machine ([\d,]+) us: the"
                      r" target is (reachable|NOT reachable) here$", target)
    assert found is not None, target
    estimate, floor_us = (int(found.group(i).replace(",", "")) for i in (1, 3))
    assert 0 < floor_us < estimate, target
    assert (found.group(4) == "reachable") == (floor_us <= 400), target

    numbers = json.loads(out.read_text())
    targets = [(t["target"], t["masters"], t["partitions"]) for t in numbers["targets"]]
    assert targets == [("redis", 1, 4), ("cluster", 1, 8), ("cluster", 2, 16),
                       ("cluster", 3, 24)]
    for target in numbers["targets"]:
        assert target["failures"] == []
        new, seen = target["decisions"]
        # every fingerprint is new: the filter says so but for its false positives (0.1 %)
        assert new["phase"] == "new" and new["decisions"] > 0, new
        assert 0.99 * new["decisions"] <= new["new"] <= new["decisions"], new
        assert seen["phase"] == "seen" and seen["new"] == 0, seen  # all found again
        assert new["decisions_per_second"] > 0 and new["redis_us_per_decision"] > 0
        # the synthetic pages queue their new links: 10 a page, and the plan's page 1 (its
        # other 19 in the filter first); only a false positive (0.1 %) is not queued
        for pages, new_links in (("host_exchanges", 10), ("plan_exchanges", 1),
                                 ("plan_sized_exchanges", 1)):
            done = target[pages]
            expected = done["exchanges"] * new_links
            assert 0.98 * expected <= done["queued"] <= expected, (pages, done)
        # sized up front, every partition has one slice: a link is looked up in it alone
        sized = target["plan_sized_exchanges"]
        assert sized["new_depth"] == sized["seen_depth"] == 1.0, sized
        # measured in turns, the median kept: the estimate's verdict rests on it
        turns = sized["turns_redis_us"]
        assert len(turns) == 3 and turns == sorted(turns), sized
        assert sized["redis_us_per_exchange"] == turns[1], sized
    crawled = {(t["target"], t["masters"]): t["crawls"] for t in numbers["targets"]
               if t["crawls"]}
    assert set(crawled) == {("redis", 1), ("cluster", 3)}
    for crawls in crawled.values():
        assert [c["workers"] for c in crawls] == [1]
        for crawl in crawls:
            assert crawl["missing"] == 0 and crawl["duplicates"] == 0, crawl
            assert crawl["pages_per_second"] > 0 and crawl["round_trips_per_page"] > 0
    assert numbers["queue_memory"]["zset_bytes"] > numbers["queue_memory"]["payload_bytes"]
    floor = numbers["exchange_floor"]
    # a new link is read, written and queued: more than a seen link's one read
    assert floor["new_us"] > floor["seen_us"] > 0 and floor["call_us"] > 0, floor
    call = numbers["script_call"]
    # a seen fingerprint is looked up and nothing is written: cheaper than a new one
    assert 0 < call["per_seen_fingerprint_us"] < call["per_fingerprint_us"], call
