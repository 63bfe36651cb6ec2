"""The fault suite's Redis faults under a filter with a revisit window.

The same crawls and invariants as test_redis_state.py, the filter windowed
(W = 1 h in 4 generations: longer than the crawl, so a page fetched twice is
the fault's doing, not the window's). The window's scripts make and read the
current generation from Redis TIME through every fault.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from faults.harness import Outcome

pytestmark = pytest.mark.slow

WINDOW = {"BLOOMFILTER_REVISIT_AFTER": "1h", "BLOOMFILTER_GENERATIONS": "4"}


def test_rollback_under_a_window(run_scenario: Callable[..., Outcome]) -> None:
    outcome = run_scenario("rollback", extra_settings=WINDOW)
    outcome.check(double_fetch=False, stats=False)


def test_partition_state_deleted_under_a_window(run_scenario: Callable[..., Outcome]) -> None:
    """The template and the list of generations are lost; the generations' bits are not:
    no page lost or fetched twice."""
    outcome = run_scenario("state-key-deleted", extra_settings=WINDOW)
    assert outcome.facts["deleted"] == 1
    outcome.check()


def test_restart_with_aof_under_a_window(run_scenario: Callable[..., Outcome]) -> None:
    outcome = run_scenario("restart-aof", extra_settings=WINDOW)
    assert outcome.facts["keys_after_restart"] > 0
    outcome.check()
