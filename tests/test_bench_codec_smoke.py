"""``bench/codec.py --quick`` runs end to end and prints every case beside today's JSON.

A check that the benchmark works, not a timing: no speed is asserted.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kit import ROOT

pytestmark = pytest.mark.slow


def test_codec_bench_prints_every_case_with_both_paths() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "codec.py"), "--quick"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for case in ("(a) link request", "(b) Item + datetime + dataclass",
                 "(c) CrawlSpider rule request"):
        line = next((ln for ln in out.splitlines() if ln.startswith(case)), None)
        assert line is not None, out
        # legacy and codec timings, and the round trip kept values and types
        assert line.count("x") >= 2 and "same values and types" in line, line
