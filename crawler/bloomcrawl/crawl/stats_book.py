"""StatsBook: the shared stats a worker owes Redis, from counted to confirmed.

Counts go to ``<spider>:stats`` with an exchange, under the exchange's
number: ``frontier_stats.lua`` adds each number once, so a batch sent twice
counts once. Counts Redis confirmed are kept a while, to be sent again if a
new server behind the client turns out not to hold them
(:meth:`StatsBook.restate`). The :class:`~bloomcrawl.crawl.outbox.Outbox`
owns the book and puts its stats in each batch.
"""

from __future__ import annotations

from collections import defaultdict, deque

#: counts Redis confirmed, kept this long (and this many) to be sent again if Redis
#: turns out to have lost them (a rollback, a restart without persistence)
STATS_HISTORY_S = 900.0
STATS_HISTORY_MAX = 100_000

#: (exchange number, counts) as an exchange carries them
NumberedStats = list[tuple[int, dict[str, int]]]


class StatsBook:
    """Counts not sent yet, counts sent and not confirmed, and those confirmed lately.

    ``interval``: 0, counts go with every exchange, numbered (one Redis: the
    numbers tell a restarted server that lost writes). On Redis Cluster every
    exchange of every worker would hit the one stats slot, and any server
    change is handled as a loss anyway: counts go at most this often (and on
    close).
    """

    def __init__(self, interval: float = 0.0) -> None:
        self.interval = interval
        self._counts: dict[str, int] = defaultdict(int)
        # counts that ride with the next stats but do not call for an exchange of their own
        self._later: dict[str, int] = defaultdict(int)
        # counts of failed exchanges, resent under their own numbers
        self._unconfirmed: NumberedStats = []
        # counts Redis confirmed lately: (when, number, counts)
        self._confirmed: deque[tuple[float, int, dict[str, int]]] = deque()
        self._number = 0
        self._sent_at = float("-inf")
        #: the number of the last exchange whose stats Redis confirmed
        self.confirmed_number = 0

    def count(self, name: str, value: int = 1) -> None:
        self._counts[name] += value

    def count_later(self, name: str, value: int = 1) -> None:
        self._later[name] += value

    def owe_later_counts(self) -> None:
        for name, value in self._later.items():
            self._counts[name] += value
        self._later.clear()

    def owes(self) -> bool:
        """Counts are waiting to be sent (new ones, or those of a failed exchange)."""
        return bool(self._counts or self._unconfirmed)

    def take(self, now: float, *, writes: bool, at_once: bool) -> NumberedStats:
        """The stats of the next exchange: those of failed exchanges under their numbers,
        then the counts since, under a new number when they are due.

        ``writes``: the exchange sends requests or acks. ``at_once``: the
        interval does not hold (the I/O thread stopped: closing, tools).
        """
        stats, self._unconfirmed = self._unconfirmed, []
        if self.interval:
            due = bool(self._counts) and (now - self._sent_at >= self.interval or at_once)
        else:
            # numbered even without counts: the number is how a restarted server
            # tells whether it kept this worker's writes
            due = bool(self._counts) or writes
        if due:
            self._number += 1
            if self._later:
                self.owe_later_counts()
            stats.append((self._number, dict(self._counts)))
            self._counts = defaultdict(int)
            self._sent_at = now
        return stats

    def confirmed(self, stats: NumberedStats, now: float) -> None:
        """Redis applied ``stats``: kept for :meth:`restate` until they are old."""
        history = self._confirmed
        history.extend((now, number, counts) for number, counts in stats)
        if stats:
            self.confirmed_number = max(self.confirmed_number, stats[-1][0])
        while history and (len(history) > STATS_HISTORY_MAX
                           or history[0][0] < now - STATS_HISTORY_S):
            history.popleft()

    def failed(self, stats: NumberedStats) -> None:
        """An exchange carrying ``stats`` failed: they go first in the next one."""
        self._unconfirmed[:0] = stats

    def restate(self, applied: int) -> int:
        """Redis lost state: send again the counts it confirmed beyond number ``applied``.

        ``applied`` is the number of this worker's last exchange the shared
        stats hold now; each number is still added once.
        """
        again = [(number, counts) for _, number, counts in self._confirmed
                 if number > applied]
        self._unconfirmed[:0] = again  # lower numbers first, as the script needs
        return len(again)
