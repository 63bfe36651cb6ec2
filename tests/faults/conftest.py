"""Fixtures of the fault suite: one row of its summary per scenario run.

``run_scenario("rollback")`` runs one scenario of :mod:`faults.scenarios`
(a crawl by real workers through the fault proxy, the fault injected) in
the test's ``tmp_path`` and returns its :class:`~faults.harness.Outcome`;
``fault_run(...)`` builds a :class:`~faults.harness.FaultRun` for a test of
its own and stops everything it started when the test ends.

Each outcome's row goes into the test's report (``user_properties``, as
:data:`faults.harness.SUMMARY_PROPERTY`), so the summary table that
``tests/conftest.py`` prints holds every run, in whichever process it ran.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.harness import SUMMARY_PROPERTY, FaultRun, Outcome
from faults.scenarios import SCENARIOS


@pytest.fixture
def run_scenario(tmp_path: Path, request: pytest.FixtureRequest) -> Callable[..., Outcome]:
    def run(key: str, **options: Any) -> Outcome:
        outcome = SCENARIOS[key].run(tmp_path / key, **options)
        request.node.user_properties.append((SUMMARY_PROPERTY, outcome.row()))
        return outcome

    return run


@pytest.fixture
def fault_run(tmp_path: Path, request: pytest.FixtureRequest
              ) -> Iterator[Callable[..., FaultRun]]:
    runs: list[FaultRun] = []

    def make(scenario: str, **options: Any) -> FaultRun:
        run = FaultRun(tmp_path / scenario, scenario, **options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()
        if run.outcome is not None:
            request.node.user_properties.append((SUMMARY_PROPERTY, run.outcome.row()))
