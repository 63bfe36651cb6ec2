"""What a worker owes Redis, and the one exchange at a time that sends it.

The scheduler buffers here what it must tell Redis: new requests, acks of
finished leases, shared stats, start-URL leases to ack. :meth:`Outbox.send`
takes the whole buffer as one :class:`Batch` and runs one
:meth:`~bloomcrawl.core.frontier.Frontier.exchange` on the I/O thread
(optionally leasing the next request in the same round trip); the reply
comes back on the reactor. A batch that fails goes back in front of the
buffer, nothing of it lost, and the next try waits out the error policy's
back-off. Shared stats travel numbered, so a resent exchange counts once.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.connection import ServerChangedError, ServerWatch, server_infos
from bloomcrawl.core.errors import FilterFullError
from bloomcrawl.core.frontier import Exchanged, Frontier, Lease, Outgoing
from bloomcrawl.core.politeness import Feedback
from bloomcrawl.crawl.redis_io import call_later, log_unexpected

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector
    from twisted.python.failure import Failure

    from bloomcrawl.core.connection import RedisErrorPolicy
    from bloomcrawl.crawl.redis_io import RedisIO

logger = logging.getLogger(__name__)

#: counts Redis confirmed, kept this long (and this many) to be sent again if Redis
#: turns out to have lost them (a rollback, a restart without persistence)
STATS_HISTORY_S = 900.0
STATS_HISTORY_MAX = 100_000
#: requests of confirmed exchanges kept this long before the last confirmed one (and at
#: most this many), to be sent again when Redis may have lost them: what a failover can
#: drop is what the promoted replica had not received when its master died
REPLAY_S = 30.0
REPLAY_MAX = 100_000


@dataclass
class Batch:
    """What one exchange carries; given back to the buffer if it fails."""

    outgoing: list[Outgoing]
    acks: dict[int, list[str]]
    stats: list[tuple[int, dict[str, int]]]
    #: start URL leases whose requests are in ``outgoing``: acked once it is sent
    start_tokens: list[str]
    #: requests dropped against the worker's seen cache since the last exchange: given
    #: back if the server turns out to have changed (their fingerprints may be lost)
    held: list[Any]
    lease_from: int | None
    #: how many requests to lease (from ``lease_from``, then from ``probe`` in order)
    want: int
    check_idle: bool
    #: the server epoch (ServerWatch) the batch was made for
    epoch: int = 0
    #: other partitions to lease from while fewer than ``want`` came back
    probe: list[int] = field(default_factory=list)
    #: what the worker saw of hosts, by partition (best effort: not resent on failure)
    feedback: dict[int, Feedback] = field(default_factory=dict)


@dataclass
class Reply:
    """What the I/O thread brings back from one exchange."""

    done: Exchanged
    leases: list[Lease] = field(default_factory=list)
    #: requests, leases and start URLs anywhere (asked when ``check_idle`` found no lease)
    frontier_size: int | None = None
    #: partitions leased from that gave fewer than asked -> seconds until one of their
    #: hosts is ready (None: none waits for a time); those that gave all asked are absent
    ready_in: dict[int, float | None] = field(default_factory=dict)


class Outbox:
    def __init__(self, io: RedisIO, errors: RedisErrorPolicy, stats: StatsCollector,
                 watch: ServerWatch, *, on_reply: Callable[[Reply, Batch], None],
                 on_retry: Callable[[], None], on_full: Callable[[FilterFullError], None],
                 log_extra: dict[str, Any] | None = None) -> None:
        self.io = io
        self.watch = watch
        self.errors = errors
        self.stats = stats
        self.on_reply = on_reply
        self.on_retry = on_retry
        self.on_full = on_full
        self.log_extra = log_extra
        self.frontier: Frontier | None = None
        self.outgoing: list[Outgoing] = []
        self.acks: dict[int, list[str]] = defaultdict(list)
        self.feedback: dict[int, Feedback] = {}
        self.counts: dict[str, int] = defaultdict(int)
        # counts of failed exchanges, resent under their own numbers
        self.unconfirmed_stats: list[tuple[int, dict[str, int]]] = []
        # counts Redis confirmed lately: (when, number, counts)
        self.confirmed_stats: deque[tuple[float, int, dict[str, int]]] = deque()
        # start URL leases: requests made, not sent yet / sent, to be acked
        self.start_waiting: list[str] = []
        self.start_acks: list[str] = []
        self.held: list[Any] = []
        #: 0: keep nothing to :meth:`replay`; on Redis Cluster, REPLAY_S
        self.replay_s = 0.0
        # requests of confirmed exchanges: (when, requests), newest last
        self.sent: deque[tuple[float, list[Outgoing]]] = deque()
        self._sent_count = 0
        self.exchanging = False
        self.closing = False
        self._retry_call: Any = None
        self._verify_masters = False
        self._number = 0
        #: 0: counts go with every exchange, numbered (one Redis: the numbers tell
        #: a restarted server that lost writes). On Redis Cluster every exchange of
        #: every worker would hit the one stats slot, and any server change is
        #: handled as a loss anyway: counts go at most this often (and on close)
        self.stats_interval = 0.0
        self._stats_sent_at = float("-inf")
        #: the number of the last exchange whose stats Redis confirmed
        self.confirmed_number = 0

    def owes(self) -> bool:
        """Requests, acks or stats are waiting to be sent."""
        return bool(self.outgoing or self.acks or self.counts or self.unconfirmed_stats
                    or self.feedback)

    def busy(self) -> bool:
        """An exchange is under way or a retry is waiting out its back-off."""
        return self.exchanging or self._retry_call is not None

    def ack_partition(self) -> int | None:
        """A partition with acks to send: a lease from it carries them in the same call."""
        return next((p for p, tokens in self.acks.items() if tokens), None)

    def send(self, lease_from: int | None = None, *, want: int = 1, check_idle: bool = False,
             probe: list[int] | None = None, errors: list[Failure] | None = None) -> None:
        """Start one exchange with all that is owed, unless one is under way.

        ``errors``: the failure is appended there instead of being retried
        (inline callers that must know).
        """
        frontier = self.frontier
        if frontier is None or self.busy():
            return
        if not (self.owes() or lease_from is not None or check_idle):
            return
        stats, self.unconfirmed_stats = self.unconfirmed_stats, []
        now = time.monotonic()
        if self.stats_interval:
            due = bool(self.counts) and (now - self._stats_sent_at >= self.stats_interval
                                         or not self.io.threaded)
        else:
            # numbered even without counts: the number is how a restarted server
            # tells whether it kept this worker's writes
            due = bool(self.counts or self.outgoing or self.acks)
        if due:
            self._number += 1
            stats.append((self._number, dict(self.counts)))
            self.counts = defaultdict(int)
            self._stats_sent_at = now
        batch = Batch(self.outgoing, self.acks, stats, self.start_waiting, self.held,
                      lease_from, want, check_idle, self.watch.epoch, probe or [], self.feedback)
        self.outgoing, self.acks, self.feedback = [], defaultdict(list), {}
        self.start_waiting, self.held = [], []
        self.exchanging = True
        d = self.io.run(self._in_thread, frontier, batch)
        d.addCallbacks(self._done, self._failed, callbackArgs=(batch,),
                       errbackArgs=(batch, errors))
        d.addErrback(log_unexpected, logger, self.log_extra)

    def send_now(self) -> None:
        """Send until nothing is owed, inline (the I/O thread is stopped or never ran).

        Raises the Redis error; what was not sent stays owed.
        """
        assert not self.io.threaded, "the I/O thread is running"
        for _ in range(3):  # an exchange can owe a little more (its duplicates count)
            if not self.owes():
                return
            failure: list[Failure] = []
            self.send(errors=failure)
            if failure:
                failure[0].raiseException()

    def restate(self, applied: int) -> int:
        """Redis lost state: send again the counts it confirmed beyond number ``applied``.

        ``applied`` is the number of this worker's last exchange the shared
        stats hold now; each number is still added once.
        """
        again = [(number, counts) for _, number, counts in self.confirmed_stats
                 if number > applied]
        self.unconfirmed_stats[:0] = again  # lower numbers first, as the script needs
        return len(again)

    def replay(self) -> int:
        """Redis may have lost requests: queue again those of the recent exchanges.

        Enqueue-if-new drops what Redis kept; returns how many go again (none
        unless :attr:`replay_s` kept them).
        """
        again = [entry for _, outgoing in self.sent for entry in outgoing]
        self.sent.clear()
        self._sent_count = 0
        self.outgoing[:0] = again
        return len(again)

    def settle(self) -> None:
        """The I/O thread stopped: the exchange under way has run in Redis.

        Its reply reaches the reactor later (callFromThread), after a closing
        scheduler sent what is still owed; until then :meth:`send` would find
        an exchange under way and send nothing, and what was owed meanwhile
        (counts, acks, links) would never go.
        """
        self.exchanging = False

    def cancel(self) -> None:
        """Closing: no more retries."""
        self.closing = True
        if self._retry_call is not None:
            self._retry_call.cancel()
            self._retry_call = None

    def _in_thread(self, frontier: Frontier, batch: Batch) -> Reply:
        """The Redis side of an exchange (on the I/O thread: touches no buffer)."""
        if self._verify_masters:
            # after a failure on a cluster, the masters are asked before anything is
            # written: redis-py may reach a promoted replica over an old connection,
            # and a count applied there first would hide the counts it lost
            self.watch.check_masters(server_infos(frontier.server))
            self._verify_masters = False
        if self.watch.epoch != batch.epoch:
            # another call on this thread met a new server since the batch was made:
            # its acks may be for work the old state got; the scheduler decides first
            raise ServerChangedError("Redis changed server before this exchange was sent")
        done = frontier.exchange(batch.outgoing, batch.acks, batch.stats,
                                 lease_from=batch.lease_from, want=batch.want,
                                 feedback=batch.feedback)
        reply = Reply(done, list(done.leases))
        if batch.lease_from is not None:
            if len(done.leases) < batch.want:
                reply.ready_in[batch.lease_from] = done.ready_in
            # fewer than asked: lease the rest from the other partitions one at a
            # time, so a worker never holds more than it asked for (a lease it
            # cannot fetch at once would break its host's delay)
            for p in batch.probe:
                if len(reply.leases) >= batch.want:
                    break
                more = frontier.exchange((), {}, lease_from=p,
                                         want=batch.want - len(reply.leases))
                reply.leases += more.leases
                if len(reply.leases) < batch.want:
                    reply.ready_in[p] = more.ready_in
        if batch.check_idle and not reply.leases:
            reply.frontier_size = frontier.size(with_leases=True)
        return reply

    def _done(self, reply: Reply, batch: Batch) -> None:
        self.exchanging = False
        self.errors.ok()
        self.start_acks += batch.start_tokens
        now = time.monotonic()
        history = self.confirmed_stats
        history.extend((now, number, counts) for number, counts in batch.stats)
        if batch.stats:
            self.confirmed_number = max(self.confirmed_number, batch.stats[-1][0])
        while history and (len(history) > STATS_HISTORY_MAX
                           or history[0][0] < now - STATS_HISTORY_S):
            history.popleft()
        if batch.outgoing and self.replay_s:
            self.sent.append((now, batch.outgoing))
            self._sent_count += len(batch.outgoing)
        while self.sent and (self._sent_count > REPLAY_MAX
                             or self.sent[0][0] < now - self.replay_s):
            self._sent_count -= len(self.sent.popleft()[1])
        self.on_reply(reply, batch)

    def _failed(self, failure: Failure, batch: Batch, errors: list[Failure] | None) -> None:
        self.exchanging = False
        # nothing of the batch is lost: it goes back in front of what came since
        self.outgoing[:0] = batch.outgoing
        for p, tokens in batch.acks.items():
            self.acks[p][:0] = tokens
        self.unconfirmed_stats[:0] = batch.stats
        self.start_waiting[:0] = batch.start_tokens
        self.held[:0] = batch.held
        if errors is not None:
            errors.append(failure)
            return
        if isinstance(failure.value, FilterFullError):
            self.on_full(failure.value)
            return
        if isinstance(failure.value, ServerChangedError):
            # nothing of the batch was sent: send it again at once, through on_retry,
            # which first decides what no longer holds on the new server
            if self.closing:
                return
            if self.io.threaded:
                self._retry_call = call_later(0, self._retry)
            else:
                self.on_retry()
            return
        self.stats.inc_value("bloomcrawl/redis_errors")
        self._verify_masters = self.watch.cluster
        delay = self.errors.failed(failure.value or RuntimeError(failure))
        if not self.closing and self.io.threaded:
            self._retry_call = call_later(delay, self._retry)

    def _retry(self) -> None:
        self._retry_call = None
        self.on_retry()
