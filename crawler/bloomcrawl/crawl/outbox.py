"""What a worker owes Redis, and the one exchange at a time that sends it.

The scheduler's parts buffer here what the worker must tell Redis: new
requests, acks of finished leases, shared stats, start-URL leases to ack.
:meth:`Outbox.send` takes the whole buffer as one :class:`Batch` and runs
one :meth:`~bloomcrawl.core.frontier.Frontier.exchange` on the I/O thread
(optionally leasing the next request in the same round trip); the
:class:`Reply` comes back on the reactor. A batch that fails goes back in
front of the buffer, nothing of it lost; when to try again is the exchange
loop's decision. Shared stats travel numbered, so a resent exchange counts
once (:class:`~bloomcrawl.crawl.stats_book.StatsBook` keeps them).
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.connection import ServerChangedError, ServerWatch, server_infos
from bloomcrawl.core.errors import FilterFullError
from bloomcrawl.core.frontier import Exchanged, Frontier, Outgoing
from bloomcrawl.core.leases import Lease
from bloomcrawl.core.politeness import Feedback
from bloomcrawl.crawl.stats_book import StatsBook

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    from bloomcrawl.crawl.duplicates import DuplicateLog
    from bloomcrawl.crawl.redis_io import RedisIO

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
    dropped: list[Any]
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
    #: requests left out of ``outgoing``: their fingerprint came earlier in it or in the
    #: last exchange, whose reply the worker's seen cache had not yet when they were made
    duplicates: int = 0
    #: (fingerprint, URL) of the start URLs' requests among them (see Outbox.watch_seeds)
    seeds: list[tuple[bytes, str]] = field(default_factory=list)
    #: how many more to lease from ``lease_from``'s hosts without a delay
    ahead: int = 0
    #: a host with a delay ready within this many seconds is leased for then
    horizon: float = 0.0
    #: its Reply once it ran in Redis (set on the I/O thread; see Outbox.settle)
    ran: Any = None


@dataclass
class Reply:
    """What the I/O thread brings back from one exchange."""

    batch: Batch
    done: Exchanged
    leases: list[Lease] = field(default_factory=list)
    #: requests, leases and start URLs anywhere (asked when ``check_idle`` found no lease)
    frontier_size: int | None = None
    #: partitions leased from that gave fewer than asked, and those the exchange only
    #: acked, queued or reported to -> seconds until one of their hosts is ready (None:
    #: none waits for a time); those that gave all asked are absent (maybe more now)
    ready_in: dict[int, float | None] = field(default_factory=dict)


def filtered_seeds(batch: Batch, queued: list[bytes]) -> list[str]:
    """The URLs of ``batch``'s start requests the filter did not queue (seen before)."""
    if not batch.seeds:
        return []
    left = set(queued)
    filtered = []
    for fp, url in batch.seeds:
        if fp in left:
            left.discard(fp)  # the same fingerprint twice: one of them was queued
        else:
            filtered.append(url)
    return filtered


def count_decisions(outbox: Outbox, stats: StatsCollector, batch: Batch,
                    done: Exchanged) -> None:
    """What the filter decided of ``batch``'s requests, counted in the worker's stats
    and, shared, with a later exchange (requests queued only with stats that go anyway)."""
    if done.queued:
        outbox.count_later("queued", done.queued)
    if done.revisited:
        stats.inc_value("bloomcrawl/revisited", done.revisited)
        outbox.count_later("revisited", done.revisited)
    if done.filtered:
        stats.inc_value("dupefilter/filtered", done.filtered)
        stats.inc_value("bloomfilter/filtered", done.filtered)
        outbox.count("filtered", done.filtered)
    if batch.duplicates:  # counted shared by the outbox when it left them out
        stats.inc_value("dupefilter/filtered", batch.duplicates)
        stats.inc_value("bloomcrawl/filtered_locally", batch.duplicates)


class Outbox:
    """The buffers of what this worker owes Redis, and the sending of one batch of them.

    Buffers change only through methods; an exchange's outcome (a
    :class:`Reply`, or the failure after the batch went back to the
    buffers) is the Deferred :meth:`send` returns: what to do next is the
    caller's (:class:`~bloomcrawl.crawl.exchanges.ExchangeLoop`).
    """

    def __init__(self, io: RedisIO, frontier: Frontier, watch: ServerWatch, *,
                 stats_interval: float = 0.0, replay_s: float = 0.0) -> None:
        self.io = io
        self.frontier = frontier
        self.watch = watch
        #: the shared stats owed, numbered, confirmed (``stats_interval``: see StatsBook)
        self.shared_stats = StatsBook(stats_interval)
        #: 0: keep nothing to :meth:`replay`; on Redis Cluster, REPLAY_S
        self.replay_s = replay_s
        self._outgoing: list[Outgoing] = []
        self._acks: dict[int, list[str]] = defaultdict(list)
        self._feedback: dict[int, Feedback] = {}
        # start URL leases: requests made, not sent yet / sent, to be acked
        self._start_waiting: list[str] = []
        # the start URLs' requests buffered: (fingerprint, URL), told apart when their
        # exchange returns (filtered_seeds)
        self._seeds: list[tuple[bytes, str]] = []
        self._start_acks: list[str] = []
        # the batch of the exchange under way
        self._inflight: Batch | None = None
        # requests dropped against the seen cache since the last exchange
        self._dropped: list[Any] = []
        # requests of confirmed exchanges: (when, requests), newest last
        self._sent: deque[tuple[float, list[Outgoing]]] = deque()
        self._sent_count = 0
        #: says which requests were left out as duplicates (DUPEFILTER_DEBUG)
        self.duplicate_log: DuplicateLog | None = None
        # fingerprints of the last exchange's requests (see Batch.duplicates)
        self._recent: set[bytes] = set()
        self.exchanging = False
        self._verify_masters = False

    # -- what is owed ------------------------------------------------------------------

    def add(self, entry: Outgoing) -> int:
        """A request to enqueue-if-new; returns how many are buffered."""
        self._outgoing.append(entry)
        return len(self._outgoing)

    def requests(self) -> int:
        """Requests buffered, not sent yet."""
        return len(self._outgoing)

    def drop_requests(self) -> int:
        """Forget the buffered requests (the filter is full); returns how many."""
        count = len(self._outgoing)
        self._outgoing.clear()
        return count

    def ack(self, partition: int, ack: str) -> None:
        """A lease of ``partition`` is done (:meth:`LeaseBook.finish`'s ack)."""
        self._acks[partition].append(ack)

    def drop_acks(self) -> int:
        """Forget the acks not sent (Redis lost state: their leases expire); how many."""
        count = sum(len(tokens) for tokens in self._acks.values())
        self._acks.clear()
        return count

    def count(self, name: str, value: int = 1) -> None:
        """Add to a shared stat (``<spider>:stats``), sent with the next exchange."""
        self.shared_stats.count(name, value)

    def count_later(self, name: str, value: int = 1) -> None:
        """:meth:`count`, sent with the next stats that go anyway: what an exchange's
        reply counts (requests queued, revisits) starts no exchange of its own. On close,
        :meth:`owe_later_counts` makes them owed."""
        self.shared_stats.count_later(name, value)

    def owe_later_counts(self) -> None:
        self.shared_stats.owe_later_counts()

    @property
    def confirmed_number(self) -> int:
        """The number of the last exchange whose stats Redis confirmed."""
        return self.shared_stats.confirmed_number

    def feedback_for(self, partition: int) -> Feedback:
        """What this worker saw of the hosts of ``partition``, sent with the next exchange."""
        return self._feedback.setdefault(partition, Feedback())

    def has_feedback(self) -> bool:
        return bool(self._feedback)

    def dropped(self, request: Any, of_leased_page: bool) -> None:
        """``request`` was dropped as already sent: kept until Redis answered from the
        same server (given back by :meth:`take_dropped` if it lost the fingerprint).
        On one Redis a leased page's link is not (and so not kept alive): its page's
        ack went after its fingerprint, a Redis loses a suffix of what it was sent,
        so losing the fingerprint lost the ack and the page is crawled again."""
        if not of_leased_page or self.watch.cluster:
            self._dropped.append(request)

    def take_dropped(self) -> list[Any]:
        """The requests dropped against fingerprints Redis may have lost; from now on
        nothing is dropped against the last exchange's either."""
        dropped, self._dropped = self._dropped, []
        self._recent = set()
        return dropped

    def watch_seeds(self, since: int, url: str) -> None:
        """The requests buffered from position ``since`` on are a start URL's (``url``):
        :func:`filtered_seeds` says whether the filter queued them."""
        self._seeds += [(e.fingerprint, url) for e in self._outgoing[since:]
                        if not e.dont_filter]

    def start_waiting(self, token: str) -> None:
        """A start URL lease whose request is buffered: acked once that is sent."""
        self._start_waiting.append(token)

    def start_done(self, token: str) -> None:
        """A start URL lease to ack now (its entry was bad, or its request not queued)."""
        if token in self._start_waiting:
            self._start_waiting.remove(token)
        self._start_acks.append(token)

    def take_start_acks(self) -> list[str]:
        acks, self._start_acks = self._start_acks, []
        return acks

    def has_start_acks(self) -> bool:
        return bool(self._start_acks)

    def give_back_start_acks(self, acks: list[str]) -> None:
        self._start_acks[:0] = acks

    def owes(self) -> bool:
        """Requests, acks or stats are waiting to be sent."""
        return bool(self._outgoing or self._acks or self._feedback) or self.shared_stats.owes()

    def ack_partition(self) -> int | None:
        """A partition with acks to send: a lease from it carries them in the same call."""
        return next((p for p, tokens in self._acks.items() if tokens), None)

    # -- sending -------------------------------------------------------------------------

    def send(self, lease_from: int | None = None, *, want: int = 1, ahead: int = 0,
             horizon: float = 0.0, check_idle: bool = False,
             probe: list[int] | None = None) -> Deferred[Reply] | None:
        """Start one exchange with all that is owed (None: nothing to do, or one is under
        way). The Deferred fires on the reactor with the :class:`Reply`, or with the
        failure once the batch went back in front of the buffers."""
        if self.exchanging:
            return None
        if not (self.owes() or lease_from is not None or check_idle):
            return None
        outgoing, duplicates = self._unique()
        if duplicates:
            self.shared_stats.count("filtered", duplicates)
        stats = self.shared_stats.take(time.monotonic(),
                                       writes=bool(self._outgoing or self._acks),
                                       at_once=not self.io.threaded)
        batch = Batch(outgoing, self._acks, stats, self._start_waiting, self._dropped,
                      lease_from, want, check_idle, self.watch.epoch, probe or [],
                      self._feedback, duplicates, self._seeds, ahead, horizon)
        self._outgoing, self._acks, self._feedback = [], defaultdict(list), {}
        self._start_waiting, self._dropped, self._seeds = [], [], []
        self.exchanging = True
        self._inflight = batch
        d = self.io.run(self._in_thread, self.frontier, batch)
        d.addCallbacks(self._done, self._failed, callbackArgs=(batch,), errbackArgs=(batch,))
        return d

    def _unique(self) -> tuple[list[Outgoing], int]:
        """The buffered requests, each fingerprint once, less those of the last exchange.

        Links a page yields while an exchange is under way are checked against
        the seen cache before that exchange's reply fills it: the filter would
        find them duplicates, at its cost. Left out here, they count as
        filtered as the filter's duplicates do; a ``dont_filter`` request
        always goes.
        """
        recent, kept, seen = self._recent, [], set()
        duplicates = 0
        for entry in self._outgoing:
            if not entry.dont_filter:
                if entry.fingerprint in recent or entry.fingerprint in seen:
                    if not entry.record_only:  # a record only queues nothing
                        duplicates += 1
                        if self.duplicate_log is not None and self.duplicate_log.active:
                            self.duplicate_log.entry(entry)
                    continue
                seen.add(entry.fingerprint)
            kept.append(entry)
        return kept, duplicates

    def restate(self, applied: int) -> int:
        """Redis lost state: send again the counts it confirmed beyond number ``applied``."""
        return self.shared_stats.restate(applied)

    def replay(self) -> int:
        """Redis may have lost requests: queue again those of the recent exchanges.

        Enqueue-if-new drops what Redis kept; returns how many go again (none
        unless :attr:`replay_s` kept them).
        """
        again = [entry for _, outgoing in self._sent for entry in outgoing]
        self._sent.clear()
        self._sent_count = 0
        self._outgoing[:0] = again
        return len(again)

    def settle(self) -> list[Lease]:
        """The I/O thread stopped: the exchange under way has run in Redis.

        Its reply reaches the reactor later (callFromThread), after a closing
        scheduler sent what is still owed; until then :meth:`send` would find
        an exchange under way and send nothing, and what was owed meanwhile
        (counts, acks, links) would never go. What it did is taken here
        instead: the start entries whose requests it carried are acked with
        the others, and the leases it took are returned, for the scheduler to
        give back with its own rather than leave them to expire.
        """
        self.exchanging = False
        batch, self._inflight = self._inflight, None
        if batch is None or batch.ran is None:
            return []
        self._start_acks += batch.start_tokens
        return list(batch.ran.leases)

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
        probe = batch.probe if batch.lease_from is not None else []
        done = frontier.exchange(batch.outgoing, batch.acks, batch.stats,
                                 lease_from=batch.lease_from, want=batch.want,
                                 ahead=batch.ahead, horizon=batch.horizon, peek=probe,
                                 feedback=batch.feedback)
        reply = Reply(batch, done, list(done.leases), ready_in=dict(done.waits))
        if batch.lease_from is not None:
            if len(done.leases) < (batch.want or batch.ahead):  # want 0: a top-up
                reply.ready_in[batch.lease_from] = done.ready_in
            # fewer than asked: lease the rest from the other partitions one at a
            # time, so a worker never holds more than it asked for (a lease it
            # cannot fetch at once would break its host's delay); only from those
            # the exchange found a host ready in (peek), each a round trip
            for p in probe:
                if done.peeked.get(p) != 0:
                    reply.ready_in[p] = done.peeked.get(p)
                    continue
                if len(reply.leases) >= batch.want:
                    break
                more = frontier.exchange((), {}, lease_from=p, horizon=batch.horizon,
                                         want=batch.want - len(reply.leases))
                reply.leases += more.leases
                if len(reply.leases) < batch.want:
                    reply.ready_in[p] = more.ready_in
        if batch.check_idle and not reply.leases:
            reply.frontier_size = frontier.size(with_leases=True)
        batch.ran = reply
        return reply

    def _done(self, reply: Reply, batch: Batch) -> Reply:
        self.exchanging = False
        self._inflight = None
        self._recent = {e.fingerprint for e in batch.outgoing if not e.dont_filter}
        self._start_acks += batch.start_tokens
        now = time.monotonic()
        self.shared_stats.confirmed(batch.stats, now)
        if batch.outgoing and self.replay_s:
            self._sent.append((now, batch.outgoing))
            self._sent_count += len(batch.outgoing)
        while self._sent and (self._sent_count > REPLAY_MAX
                              or self._sent[0][0] < now - self.replay_s):
            self._sent_count -= len(self._sent.popleft()[1])
        return reply

    def _failed(self, failure: Failure, batch: Batch) -> Failure:
        self.exchanging = False
        self._inflight = None
        # nothing of the batch is lost: it goes back in front of what came since
        self._outgoing[:0] = batch.outgoing
        for p, tokens in batch.acks.items():
            self._acks[p][:0] = tokens
        self.shared_stats.failed(batch.stats)
        self._start_waiting[:0] = batch.start_tokens
        self._dropped[:0] = batch.dropped
        self._seeds[:0] = batch.seeds
        if not isinstance(failure.value, FilterFullError | ServerChangedError):
            # after a failure on a cluster, the masters are asked first (see _in_thread)
            self._verify_masters = self.watch.cluster
        return failure
