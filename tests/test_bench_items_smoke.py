"""``bench/items.py --quick`` runs end to end and prints both pipelines for each page size.

A check that the benchmark works, not a timing: no speed is asserted.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kit import ROOT

pytestmark = pytest.mark.slow


def test_items_bench_prints_both_pipelines_with_every_item_stored() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "items.py"), "--quick"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith(("bloomcrawl RedisItemsPipeline", "scrapy-redis RedisPipeline"))]
    assert len(rows) == 4, result.stdout
    assert [row[-1] for row in rows] == ["300/300"] * 4  # every item stored, once
    # bloomcrawl's calls an item: a few a page once batched, beside one an item
    calls = {(row[0], row[2]): float(row[-3]) for row in rows}
    assert calls[("bloomcrawl", "48")] < 0.2 < calls[("scrapy-redis", "48")], calls
