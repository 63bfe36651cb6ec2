"""``bench/script_ab.py`` runs end to end, and refuses what would make its figures wrong.

A check that the benchmark works, not a timing: no speed is asserted.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kit import ROOT

pytestmark = pytest.mark.slow

BENCH = ROOT / "bench" / "script_ab.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True,
                          text=True, timeout=120)


def test_two_versions_are_timed_call_by_call_and_answer_alike() -> None:
    result = run("--old", "tree", "--items", "400", "--batch", "40", "--rounds", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "both answered every call alike" in out
    for phase in ("new", "seen"):
        row = next((ln for ln in out.splitlines() if ln.startswith(phase + " ")), None)
        assert row is not None, out
        figures = [float(x) for x in re.findall(r"\d+\.\d+", row)]
        assert len(figures) == 5 and all(f > 0 for f in figures), row


def test_calls_the_slowlog_missed_are_an_error_not_a_gap() -> None:
    result = run("--old", "tree", "--items", "20", "--batch", "1", "--rounds", "1",
                 "--threshold", "100000000")
    assert result.returncode != 0
    assert "SLOWLOG holds 0 of the 20 calls" in result.stderr


def test_an_unknown_revision_is_named() -> None:
    result = run("--old", "no-such-revision", "--rounds", "1")
    assert result.returncode != 0
    assert "no bloom_common.lua and bloom_add.lua at git revision 'no-such-revision'" \
        in result.stderr


def test_a_revision_whose_script_is_the_trees_is_still_told_apart() -> None:
    """HEAD against an unchanged tree: one script text, loaded under two SHAs (under one,
    SLOWLOG would hold each call twice for each version)."""
    result = run("--old", "HEAD", "--items", "200", "--batch", "40", "--rounds", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "both answered every call alike" in result.stdout
