"""The test session: the kit's fixtures (:mod:`kit.fixtures`), Scrapy's reactor, the
Redis clients components built, closed when each test ends, and the fault suite's table.

The kit (``tests/kit``) holds everything the tests start, wait for and check;
see its package docstring.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import scrapy
from scrapy.utils.reactor import install_reactor

pytest_plugins = ["kit.fixtures"]

#: fixtures that start more than the session's one redis-server: crawls, scrapyd,
#: Redis Clusters, the demo site
PROCESS_FIXTURES = frozenset({
    "redis_cluster", "clean_cluster", "private_cluster", "redismod_server", "demo_site",
    "worker_pool", "scrapyd_node", "scrapyd_nodes",
})

if scrapy.version_info < (2, 14):
    # Scrapy 2.13's get_crawler() asks which reactor is installed, and fails when none is
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")


#: connection pools of Redis clients built inside components during the running test
_POOLS_TO_DISCONNECT: list[redis.ConnectionPool] = []


def disconnect_at_teardown(client: redis.Redis) -> None:
    """Close the sockets of ``client`` (one a component built) when the test ends.

    Such clients are never closed by the test (a Scheduler, say, also sits in
    reference cycles), and redis-py 5.0.0's close() would not close their
    sockets anyway: left to the garbage collector, a socket may be finalized
    before its connection, a ResourceWarning that ``filterwarnings = error``
    makes a failure.
    """
    _POOLS_TO_DISCONNECT.append(client.connection_pool)


@pytest.fixture(autouse=True)
def _disconnect_built_clients() -> Iterator[None]:
    yield
    while _POOLS_TO_DISCONNECT:
        _POOLS_TO_DISCONNECT.pop().disconnect()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault suite's table: one row per scenario run, from the tests' reports (so it
    holds the runs of every process the session ran tests in)."""
    rows: dict[str, list[list[str]]] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            found = [value for name, value in getattr(report, "user_properties", ())
                     if name == "fault_outcome"]
            if found and len(found) >= len(rows.get(report.nodeid, [])):
                rows[report.nodeid] = found  # a later phase's report holds the earlier rows
    if not rows:
        return
    from faults.harness import SUMMARY_NOTE, format_table

    terminalreporter.section("fault suite: what each fault cost")
    terminalreporter.write_line(format_table([row for found in rows.values() for row in found]))
    terminalreporter.write_line(SUMMARY_NOTE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The cheap tests first, so that a break shows in the suite's first minute: those
    marked ``slow`` or starting processes (:data:`PROCESS_FIXTURES`) run after the rest,
    the ones marked ``long`` first of them, so that the run does not end waiting on one
    of those; each group in the order collected."""
    def cost(item: pytest.Item) -> int:
        if item.get_closest_marker("long") is not None:
            return 1
        names = getattr(item, "fixturenames", ())
        costly = item.get_closest_marker("slow") is not None
        return 2 if costly or not PROCESS_FIXTURES.isdisjoint(names) else 0

    items.sort(key=cost)
