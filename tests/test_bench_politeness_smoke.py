"""``bench/politeness.py --quick`` runs end to end: every scenario crawls its whole site.

A check that the benchmark works, not a timing: the gaps and rates it prints
are the benchmark's business (the politeness promises are asserted by
tests/test_politeness_crawl.py); here only that each scenario ran, crawled
every page once and printed its rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit import ROOT

BENCH = ROOT / "bench" / "politeness.py"

pytestmark = pytest.mark.slow

ROWS = ["min gap / delay", "peak rate / budget (10 gaps)", "span / (pages x delay)",
        "throughput / ideal", "domains with a gap < 0.9 x delay",
        "Redis: exchanges a page", "Redis: script calls a page",
        "Redis: main thread CPU us a page"]


@pytest.mark.long
def test_the_politeness_bench_runs_every_scenario(tmp_path: Path) -> None:
    out = tmp_path / "politeness.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--json", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for row in ROWS:
        assert row in proc.stdout, (row, proc.stdout[-3000:])
    results = json.loads(out.read_text())
    assert sorted(results) == ["a", "b", "c"]
    for name, run in results.items():
        assert run["failure"] == "", (name, run["failure"])
        assert run["distinct"] == run["domains"] * run["pages"], (name, run)
        assert run["duplicates"] == 0, (name, run)
        assert run["min_gap_s"] > 0, (name, run)
        # what the crawl cost its Redis: every contender's crawl makes commands
        redis_work = run["redis"]
        assert redis_work["cpu_s"] > 0, (name, run)
        if name != "c":  # bloomcrawl's: its exchanges, each a MULTI/EXEC of script calls
            assert 0 < redis_work["exchanges"] <= redis_work["script_calls"], (name, run)
