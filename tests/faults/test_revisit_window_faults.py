"""The fault suite's Redis faults under a filter with a revisit window.

The same crawls and invariants as test_redis_state.py, the filter windowed
(W = 1 h in 4 generations: longer than the crawl, so a page fetched twice is
the fault's doing, not the window's). The window's scripts make and read the
current generation from Redis TIME through every fault.

Then the same faults with named windows (``BLOOMFILTER_REVISIT_WINDOWS``):
the fault suite's spider puts each request, the start URL's too, in
``listing`` (1 h) or ``article`` (never) by its canonical URL, so each
partition keeps a ring of generations per window through the fault.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from faults.harness import Outcome
from faults.spiders import WINDOWS_MARK

pytestmark = pytest.mark.slow

WINDOW = {"BLOOMFILTER_REVISIT_AFTER": "1h", "BLOOMFILTER_GENERATIONS": "4"}
NAMED = {**WINDOW,
         "BLOOMFILTER_REVISIT_WINDOWS": json.dumps({"listing": "1h", "article": "never"}),
         "FAULTS_REVISIT_WINDOWS": "listing,article", "SPIDER_MODULES": "faults.spiders"}


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


def links_per_window(outcome: Outcome) -> dict[str, int]:
    """What the workers' spiders put in each named window, summed."""
    total: dict[str, int] = {}
    for found in re.findall(re.escape(WINDOWS_MARK) + r" (\{.*\})", outcome.all_logs()):
        for name, count in json.loads(found).items():
            total[name] = total.get(name, 0) + count
    return total


@pytest.mark.parametrize("scenario", ["rollback", "state-key-deleted", "restart-aof"])
def test_named_windows_through_redis_faults(run_scenario: Callable[..., Outcome],
                                            scenario: str) -> None:
    """Requests in two named windows: no page lost, and none fetched twice but after a
    rollback (which forgets what the snapshot had not seen, in every window)."""
    outcome = run_scenario(scenario, extra_settings=NAMED)
    used = links_per_window(outcome)
    assert set(used) == {"listing", "article"} and min(used.values()) > 100, used
    assert outcome.shared.get("unknown_revisit_window", 0) == 0
    outcome.check(double_fetch=scenario != "rollback", stats=scenario != "rollback")
