"""``bench/crawl.py --quick`` runs end to end and prints every contender's row.

A check that the benchmark works, not a timing: no rate is asserted.
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

BENCH = ROOT / "bench" / "crawl.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None,
                       reason="redis-server is not installed"),
]

CONTENDERS = {
    "memory": "Scrapy in-memory (ceiling)",
    "bloomcrawl": "bloomcrawl",
    "scrapy_redis": "scrapy-redis (SADD dupefilter)",
    "recipe": "scrapy-redis + bloomfilter recipe",
}
TARGETS = [
    "pages/s / in-memory ceiling",
    "round trips per page",
    "Redis CPU per page (us)",
    "every page exactly once",
]


@pytest.mark.long
def test_quick_run_prints_every_contender(tmp_path: Path, env_no_state: dict[str, str]) -> None:
    out = tmp_path / "crawl.json"
    proc = subprocess.run(
        # fewer pages than --quick's 300: the smoke test checks that it works, not its numbers
        [sys.executable, str(BENCH), "--quick", "--pages", "150", "--json", str(out)],
        cwd=tmp_path, env=env_no_state, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()

    def rows(label: str) -> list[list[str]]:
        # a row is the label, then the process count
        found = []
        for line in lines:
            rest = line[len(label):].split() if line.startswith(label) else []
            if rest and rest[0].isdigit():
                found.append(rest)
        return found

    for key, label in CONTENDERS.items():
        found = rows(label)
        if key == "memory":
            assert [r[0] for r in found] == ["1"], found  # 2: separate crawls, below
        else:
            assert [r[0] for r in found] == ["1", "2"], (label, proc.stdout)
        assert "FAILED" not in " ".join(" ".join(r) for r in found)
    separate = [line.split() for line in lines if line.startswith("  in-memory, separate crawls")]
    assert [r[3] for r in separate] == ["2"], proc.stdout  # two processes, a crawl each
    assert "floor with 2 processes on this machine: 2 separate in-memory crawls" in proc.stdout
    # the workers' garbage collections, 1 and 2 processes, beside the in-memory scheduler's
    gc_lines = [x for x in lines if x.strip().startswith("garbage collection:")]
    assert len(gc_lines) == 2 and all("n/a" not in x for x in gc_lines), proc.stdout
    assert all(float(x.split()[2]) > 0 for x in gc_lines), gc_lines
    # the middle half of the crawl apart from its ends: bloomcrawl's, beside the in-memory
    # scheduler's (1 process) and the separate crawls' (2)
    middle = [x for x in lines if x.strip().startswith("the middle half of each worker's")]
    assert len(middle) == 2, proc.stdout
    assert "(the in-memory scheduler: " in middle[0], middle
    assert "(the separate in-memory crawls: " in middle[1], middle
    for line in middle:
        found = re.findall(r"([\d.]+) ms/page \(([\d.]+) of it in the kernel\), ([\d.]+)"
                           r" voluntary and ([\d.]+) involuntary", line)
        # the kernel's share may round to 0 over the few pages of a quick run (its
        # clock ticks in ms)
        assert len(found) == 2 and all(float(f[0]) > 0 and float(f[0]) >= float(f[1]) >= 0
                                       for f in found), line
    for name in TARGETS:
        line = next((x for x in lines if x.strip().startswith(name)), None)
        assert line is not None, name
        assert line.split()[-1] in ("PASS", "MISS", "n/a"), line

    numbers = json.loads(out.read_text())
    assert numbers["failures"] == []
    # the floor's exchanges also sent at the crawl's rate: its batching and twice it
    paced = {int(k): v for k, v in numbers["floor"]["paced_us"].items()}
    assert len(paced) == 2 and min(paced) * 2 == max(paced), paced
    assert all(us > 0 for us in paced.values()) and numbers["floor"]["paced_rate"] > 0
    assert "the same exchanges at this crawl's" in proc.stdout
    # the Redis CPU target's reachability is judged on the command floor (no Lua work),
    # printed beside bloomcrawl's own calls sent back to back
    line = next(x for x in lines if x.strip().startswith("command floor for this crawl (us)"))
    found = re.search(r"\(us\)\s+(\d+)\s+<= 60\s+(reachable|NOT reachable here)$", line)
    assert found is not None, line
    assert (found.group(2) == "reachable") == (int(found.group(1)) <= 60), line
    assert any(x.strip().startswith("bloomcrawl's calls, back to back (us)") for x in lines)
    commands = numbers["floor"]["command_floor"]
    assert commands["us"] > 0 and commands["exchanges"] > 0 and commands["new"] > 0, commands
    probe = numbers["floor"]["commands"]
    assert probe["new_us"] > 0 and probe["lease_ack_us"] > 0, probe
    runs = {(r["contender"], r["workers"]) for r in numbers["runs"]}
    assert runs == {("memory", 1), ("memory", 2), ("bloomcrawl", 1), ("bloomcrawl", 2),
                    ("scrapy_redis", 1), ("scrapy_redis", 2), ("recipe", 1), ("recipe", 2)}
    for run in numbers["runs"]:
        assert run["missing"] == 0, run  # every page reached, whoever crawled it
        # each of the separate crawls fetched every page; the shared ones, once
        assert run["separate_crawls"] == (run["contender"] == "memory" and run["workers"] == 2)
        if run["separate_crawls"]:
            assert run["duplicates"] == 150, run
        assert run["pages_per_second"] > 0, run
        if run["contender"] != "memory":
            assert run["round_trips_per_page"] > 0, run
        if run["contender"] == "bloomcrawl":
            # sampled at the start, at each quarter of the pages, and at the end
            phases = run["phases"]
            assert len(phases) == 5, phases
            assert [p["pages"] for p in phases] == sorted(p["pages"] for p in phases), phases
            assert phases[0]["pages"] == 0 and phases[-1]["pages"] == 150, phases
            assert phases[-1]["redis_cpu_s"] > phases[0]["redis_cpu_s"], phases
            # every page but the first was queued through the filter by some page's links
            assert phases[-1]["queued"] >= 149, phases
    quarters = [x for x in lines if x.startswith("  1 process: pages 0-")]
    assert len(quarters) == 1 and quarters[0].count("us a page") == 4, proc.stdout
    # Redis memory of the one-process crawls: the empty server, the end, the keys by kind
    for key in ("bloomcrawl", "scrapy_redis", "recipe"):
        run = next(r for r in numbers["runs"] if r["contender"] == key and r["workers"] == 1)
        assert 0 < run["empty_memory"] < run["used_memory"], run
        kinds = run["key_memory"]
        assert set(kinds) == {"filter", "queue", "other"}, kinds
        assert kinds["filter"]["keys"] > 0 and kinds["filter"]["bytes"] > 0, (key, kinds)
        start = next(i for i, x in enumerate(lines) if x.startswith("Redis memory, 1 process"))
        row = next(x for x in lines[start:] if x.startswith("  " + CONTENDERS[key] + "  "))
        assert "%.2f" % (run["used_memory"] / 2**20) in row.split(), row
    target = next(x for x in lines if x.startswith("Redis memory of the 1-process crawl <= 3 MB:"))
    assert target.split()[9] in ("PASS", "MISS"), target
    ceiling = next(x for x in lines if x.strip().startswith("pages/s / in-memory ceiling"))
    assert ">= 0.95" in ceiling, ceiling  # issue 20's, as the rounds of --repeat judge


@pytest.mark.long
def test_repeat_reports_every_round_and_the_median(tmp_path: Path,
                                                   env_no_state: dict[str, str]) -> None:
    """``--repeat 2``: a row per round, and each target judged on the rounds' median."""
    out = tmp_path / "crawl.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--pages", "40", "--repeat", "2",
         "--contenders", "memory,bloomcrawl", "--json", str(out)],
        cwd=tmp_path, env=env_no_state, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rounds = json.loads(out.read_text())["rounds"]
    assert len(rounds) == 2, rounds
    for r in rounds:
        assert r["once"] is True, r
        for key in ("ceiling", "rate_1", "rate_2", "cpu_1", "cpu_2", "redis_1",
                    "separate_rate", "separate_cpu"):
            assert r[key] is not None and r[key] > 0, (key, r)
    lines = proc.stdout.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("issue 20's crawl targets"))
    assert [x.split()[0] for x in lines[start + 3:start + 5]] == ["1", "2"], lines[start:]
    median = sorted(r["rate_1"] for r in rounds)
    line = next(x for x in lines if x.strip().startswith("1 process: pages/s x ceiling"))
    assert line.split()[5] == "%.2f" % ((median[0] + median[1]) / 2), line
    assert line.split()[-1] in ("PASS", "MISS"), line
    floor = next(x for x in lines if "2 processes: worker CPU x in-memory" in x)
    assert "2 separate in-memory crawls here" in floor, floor
