"""Fixtures of the fault suite, and its summary: one row per scenario run.

``run_scenario("rollback")`` runs one scenario of :mod:`faults.scenarios`
(a crawl by real workers through the fault proxy, the fault injected) in
the test's ``tmp_path`` and returns its :class:`~faults.harness.Outcome`;
``fault_run(...)`` builds a :class:`~faults.harness.FaultRun` for a test of
its own and stops everything it started when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.harness import REPORTS, FaultRun, Outcome, format_table
from faults.scenarios import SCENARIOS


@pytest.fixture
def run_scenario(tmp_path: Path) -> Callable[..., Outcome]:
    def run(key: str, **options: Any) -> Outcome:
        return SCENARIOS[key].run(tmp_path / key, **options)

    return run


@pytest.fixture
def fault_run(tmp_path: Path) -> Iterator[Callable[..., FaultRun]]:
    runs: list[FaultRun] = []

    def make(scenario: str, **options: Any) -> FaultRun:
        run = FaultRun(tmp_path / scenario, scenario, **options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORTS:
        return
    terminalreporter.section("fault suite: what each fault cost")
    terminalreporter.write_line(format_table([outcome.row() for outcome in REPORTS]))
    terminalreporter.write_line(
        "pages lost: never fetched; items lost: fetched, no item stored; stats error:"
        " |pages - responses served| + |items - pages served|; recover s: from the end of"
        " the fault until 17 more pages (or the last one) were served")
