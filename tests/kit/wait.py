"""The one polling loop of the tests and benchmarks: wait until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: seconds between two checks unless told otherwise
INTERVAL_S = 0.05


class WaitTimeout(AssertionError):
    """The condition did not hold in time; the message says what was waited for."""


def wait_until(condition: Callable[[], T], timeout: float, *, interval: float = INTERVAL_S,
               what: str | Callable[[], object] = "the condition") -> T:
    """Call ``condition()`` until it returns something true, and return that.

    After ``timeout`` seconds :class:`WaitTimeout` is raised, naming ``what``
    (called, when it is a function, for the state to show). An exception in
    ``condition`` is the test's failure: a condition that may raise before it
    holds (a server not listening yet) catches that itself.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = what() if callable(what) else what
            raise WaitTimeout("not true after %gs: %s" % (timeout, shown))
        time.sleep(interval)
