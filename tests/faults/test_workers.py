"""A worker stops answering for longer than its leases (issue 9, "What to build").

Two ``scrapy crawl site`` workers crawl a 200-page demo site through the
fault proxy; see :mod:`faults.harness` for what is measured and
:meth:`faults.harness.Outcome.problems` for the invariants.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from faults.harness import Outcome

pytestmark = pytest.mark.slow


def test_worker_sigstopped_past_its_lease(run_scenario: Callable[..., Outcome]) -> None:
    """At 1/3 one worker is SIGSTOPped for 8 s (leases last 3 s), then SIGCONT.

    The other worker takes over its expired leases; when the stopped one
    wakes it finishes what it had downloaded. Those pages are fetched twice,
    each covered by a requeued lease; its acks for leases it lost change
    nothing. Every invariant is checked.
    """
    outcome = run_scenario("worker-sigstop")
    assert outcome.requeued > 0, "the stopped worker held no lease: no fault"
    outcome.check()
