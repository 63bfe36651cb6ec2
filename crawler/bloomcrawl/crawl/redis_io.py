"""Blocking Redis work off the reactor: one thread, in order, results back on the reactor.

A Scrapy worker must never block its reactor on Redis: while Redis is
stalled, downloads, parsing and lease renewals would all stop for the socket
timeout. :class:`RedisIO` runs each piece of work on one thread (so calls
keep their order) and fires a Deferred on the reactor thread with its
result. Before :meth:`RedisIO.start` (a scheduler opened without a running
reactor: tools and tests) the work runs inline, with the same Deferreds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy.utils.log import failure_to_exc_info
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from bloomcrawl.core.connection import RedisErrorPolicy

try:
    from scrapy.utils.asyncio import call_later, create_looping_call
except ImportError:  # Scrapy < 2.14
    from twisted.internet.task import LoopingCall as create_looping_call  # type: ignore[assignment]

    def call_later(delay: float, func: Any, *args: Any) -> Any:  # type: ignore[misc]
        from twisted.internet import reactor  # the one Scrapy installed

        return reactor.callLater(delay, func, *args)  # type: ignore[arg-type]

__all__ = ["RedisIO", "call_later", "create_looping_call", "log_unexpected", "redis_failed"]


class _DaemonThread(threading.Thread):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.daemon = True


class _Pool(ThreadPool):
    """A thread pool whose thread never keeps the process alive: a worker told to stop
    before its engine started (Ctrl-C, scrapyd's cancel, as its spider opens) never closes
    its scheduler, and the process must end anyway (its leases expire)."""

    threadFactory = _DaemonThread


class RedisIO:
    def __init__(self, name: str = "bloomcrawl-redis") -> None:
        self.name = name
        self._pool: ThreadPool | None = None
        self._trigger: Any = None

    @property
    def threaded(self) -> bool:
        return self._pool is not None

    def start(self) -> None:
        if self._pool is None:
            from twisted.internet import reactor  # the one Scrapy installed

            self._pool = _Pool(1, 1, self.name)
            self._pool.start()
            # stopped with the reactor too, when nothing closed the scheduler
            self._trigger = reactor.addSystemEventTrigger(
                "during", "shutdown", self.stop)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Wait for the work under way, then run inline again."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            if self._trigger is not None:
                from twisted.internet import reactor

                trigger, self._trigger = self._trigger, None
                with contextlib.suppress(ValueError, KeyError):  # it is the one firing
                    reactor.removeSystemEventTrigger(trigger)  # type: ignore[call-arg,misc]
            pool.stop()

    def run(self, func: Callable[..., Any], *args: Any) -> Deferred[Any]:
        if self._pool is None:
            return maybeDeferred(func, *args)
        from twisted.internet import reactor

        return deferToThreadPool(reactor, self._pool, func, *args)


def log_unexpected(failure: Failure, logger: logging.Logger,
                   extra: dict[str, Any] | None = None) -> None:
    """Errback ending every chain: a bug in a callback is logged, never left to the GC."""
    logger.error("bloomcrawl error: %s", failure.getErrorMessage(),
                 exc_info=failure_to_exc_info(failure), extra=extra)


def redis_failed(failure: Failure, stats: StatsCollector, errors: RedisErrorPolicy) -> float:
    """A Redis call failed: counted, and logged once per kind by the one error policy.

    Returns the back-off before the next try.
    """
    stats.inc_value("bloomcrawl/redis_errors")
    return errors.failed(failure.value or RuntimeError(failure))
