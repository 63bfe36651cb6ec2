"""The leases one worker holds, and the timers that keep them (renewal) and others' (reaping).

:class:`LeaseBook` is the one record of a worker's leases: taken from an
exchange's reply, handed to the engine, acked when the request's outcome is
final, given up when Redis says they expired or lost them. It knows nothing
of Redis; :class:`LeaseUpkeep` renews the book's leases and reaps every
worker's expired ones on the I/O thread, and puts the book's leases back on
close.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

from bloomcrawl.core import presence
from bloomcrawl.core.connection import REDIS_ERRORS, server_infos
from bloomcrawl.crawl.lease import LEASE_META_KEY, LeaseRef
from bloomcrawl.crawl.redis_io import create_looping_call, log_unexpected, redis_failed
from bloomcrawl.crawl.seeds import StartHolds, renew_start_leases

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector
    from twisted.python.failure import Failure

    from bloomcrawl.core.connection import RedisErrorPolicy, ServerWatch
    from bloomcrawl.core.frontier import Frontier
    from bloomcrawl.core.leases import Lease
    from bloomcrawl.crawl.readiness import PartitionReadiness
    from bloomcrawl.crawl.redis_io import RedisIO

logger = logging.getLogger(__name__)


class Room(NamedTuple):
    """What a paced lease's host allows (:class:`~bloomcrawl.core.frontier.Lease`): how
    late its request may leave unreported, how long after the lease the host's next one
    may come, its delay (s)."""

    slack: float
    room: float
    delay: float

    @property
    def one_slot(self) -> bool:
        """The host's next lease waits for this one's ack and counts from its end."""
        return self.slack == math.inf


NO_ROOM = Room(0.0, 0.0, 0.0)


class LeaseBook:
    """Every lease this worker holds, from its lease to its ack."""

    def __init__(self) -> None:
        # token -> partition: every lease held (renewed, acked or released)
        self._held: dict[str, int] = {}
        # token -> time.monotonic() the lease was asked for: leases of hosts with a delay
        # (Lease.paced) not sent out yet
        self._leased_at: dict[str, float] = {}
        # token -> the room of a paced lease whose host's room is known
        self._room: dict[str, Room] = {}
        # token -> when its response came (sent with the ack)
        self._responded_at: dict[str, float] = {}
        # token -> when its request (or a retry of it) last went out: paced leases
        self._sent_at: dict[str, float] = {}
        # leased requests not handed to the engine yet
        self._ready: deque[tuple[LeaseRef, Request]] = deque()
        # leased for later (Lease.due): (due, order, ref, request), moved to _ready when due
        self._later: list[tuple[float, int, LeaseRef, Request]] = []
        self._taken = 0

    def __len__(self) -> int:
        return len(self._held)

    def take(self, lease: Lease, request: Request | None) -> None:
        """A lease came; ``request`` is made of it (None: its entry was unreadable)."""
        self._held[lease.token] = lease.partition
        if lease.paced:
            # late from its time, not from when it was leased ahead of it
            self._leased_at[lease.token] = max(lease.at, lease.due)
            if lease.room:
                self._room[lease.token] = Room(lease.slack, lease.room, lease.delay)
        if request is None:
            return
        ref = LeaseRef(lease.partition, lease.token)
        if lease.due > time.monotonic():
            self._taken += 1
            heapq.heappush(self._later, (lease.due, self._taken, ref, request))
        else:
            self._ready.append((ref, request))

    def ready(self) -> int:
        """Leased requests waiting to be handed to the engine (those leased for later,
        once their time came)."""
        later = self._later
        if later:
            now = time.monotonic()
            while later and later[0][0] <= now:
                _, _, ref, request = heapq.heappop(later)
                self._ready.append((ref, request))
        return len(self._ready)

    def waiting(self) -> int:
        """Leased requests whose time has not come (:attr:`Lease.due`)."""
        return len(self._later)

    def next_due(self) -> float:
        """When the first of them may leave (time.monotonic(); inf: none waits)."""
        return self._later[0][0] if self._later else math.inf

    def pop_ready(self) -> Request:
        """The next leased request, carrying its lease in meta (call :meth:`ready` first)."""
        ref, request = self._ready.popleft()
        request.meta[LEASE_META_KEY] = ref
        return request

    def put_back(self, ref: LeaseRef, request: Request) -> None:
        """A leased request handed to the engine came back to the scheduler: it goes next,
        unless its lease was given up meanwhile (:meth:`lost`, :meth:`forget`): Redis
        hands it out again when the lease expires, and fetched here too it would be
        fetched twice."""
        if ref[1] in self._held:
            self._ready.append((ref, request))

    def finish(self, ref: LeaseRef | tuple[int, str]) -> str | None:
        """The lease's request is done: the ack to send (None: the lease is not ours).

        The ack carries when the response came: the host's next lease counts
        from no earlier. A host of one slot is told no late send
        (:class:`~bloomcrawl.core.leases.Lease`): its ack carries now when no
        response came to the last send (a failed download, a retry that failed),
        which is no earlier than that send.
        """
        token = ref[1]
        self._leased_at.pop(token, None)
        room = self._room.pop(token, NO_ROOM)
        responded = self._responded_at.pop(token, None)
        sent = self._sent_at.pop(token, None)
        if self._held.pop(token, None) is None:
            return None
        if room.one_slot and (responded is None or (sent is not None and sent > responded)):
            # no response to its last send (a failed download, or a retry that failed)
            responded = time.monotonic()
        return token if responded is None else "%s|%r" % (token, responded)

    def leased_at(self, token: str) -> float | None:
        """When the lease was asked for, while its request has not been reported sent
        (None for a host without a delay: when its request leaves moves nothing)."""
        return self._leased_at.get(token)

    def room(self, token: str) -> Room:
        """The room of a paced lease; NO_ROOM when not known (a host without a delay, or
        none known): any lag may matter, and a report or an ack is due soon."""
        return self._room.get(token, NO_ROOM)

    def sending(self, token: str, when: float) -> None:
        """A paced lease's request (or a retry of it) went out at ``when``."""
        if when > self._sent_at.get(token, 0.0):
            self._sent_at[token] = when

    def went_out(self, token: str, when: float) -> None:
        """The lease's request was reported sent at ``when``."""
        self._leased_at[token] = when

    def responded(self, token: str, when: float) -> None:
        self._responded_at[token] = when

    def held(self) -> dict[str, int]:
        """token -> partition of every lease held (a copy, for the I/O thread)."""
        return dict(self._held)

    def lost(self, tokens: list[str]) -> None:
        """Redis no longer holds these leases for us: never renewed or acked again."""
        gone = set(tokens)
        # not fetched yet, and never here: a worker gets them again from Redis
        if self._later and any(ref[1] in gone for _, _, ref, _ in self._later):
            self._later = [e for e in self._later if e[2][1] not in gone]
            heapq.heapify(self._later)
        if self._ready and any(ref[1] in gone for ref, _ in self._ready):
            self._ready = deque(e for e in self._ready if e[0][1] not in gone)
        for token in tokens:
            self._held.pop(token, None)
            self._leased_at.pop(token, None)
            self._room.pop(token, None)
            self._responded_at.pop(token, None)
            self._sent_at.pop(token, None)

    def forget(self) -> int:
        """Give up every lease (Redis lost state): they expire; returns how many.

        The requests of those not handed to the engine yet are dropped with them:
        each is crawled once, when Redis hands it out again (its lease expired, or
        the lease itself was lost and the request is back in the queue), not here
        now and there again."""
        count = len(self._held)
        self._held.clear()
        self._leased_at.clear()
        self._room.clear()
        self._responded_at.clear()
        self._sent_at.clear()
        self._ready.clear()
        self._later.clear()
        return count

    def clear(self) -> None:
        """Closing: the leases went back to the queue, the ready requests with them."""
        self.forget()


class LeaseUpkeep:
    """Renews this worker's leases every lease/3 s; reaps expired leases of every worker."""

    def __init__(self, io: RedisIO, frontier: Frontier, book: LeaseBook,
                 readiness: PartitionReadiness, watch: ServerWatch, stats: StatsCollector,
                 errors: RedisErrorPolicy, start_holds: StartHolds, *, lease_timeout: float,
                 reap_interval: float, log_extra: dict[str, Any]) -> None:
        self.io = io
        self.frontier = frontier
        self.book = book
        self.readiness = readiness
        self.watch = watch
        self.stats = stats
        self.errors = errors
        self.start_holds = start_holds
        self.lease_timeout = lease_timeout
        self.reap_interval = reap_interval
        self.log_extra = log_extra
        self._loops: list[Any] = []

    def start(self) -> None:
        for func, interval in ((self.renew, self.lease_timeout / 3),
                               (self.reap, self.reap_interval)):
            loop = create_looping_call(func)
            loop.start(interval, now=False)
            self._loops.append(loop)

    @property
    def running(self) -> bool:
        return bool(self._loops)

    def stop(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()

    def renew(self) -> None:
        """Extend the deadlines of every lease this worker still holds, and its own: other
        workers count it as alive (:func:`~bloomcrawl.core.presence.here`)."""
        d = self.io.run(self._renew, self.book.held(), self.start_holds.tokens())
        d.addCallbacks(self._renewed, self.failed)
        d.addErrback(log_unexpected, logger, self.log_extra)

    def _renew(self, held: dict[str, int], start_tokens: list[str]) -> list[str]:
        presence.here(self.frontier)
        lost = renew_start_leases(self.frontier, start_tokens)
        if lost:  # their entries went back to the list: another worker may crawl them too
            logger.warning("%d start URL leases of requests this worker crawls itself"
                           " expired before renewal", len(lost), extra=self.log_extra)
        return self.frontier.renew(held)

    def _renewed(self, lost: list[str]) -> None:
        self.errors.ok()
        if lost:
            # renewals queued while Redis was away carry the leases held then: those acked
            # since are gone for that reason, and one reported by an earlier reply is no
            # longer held either (counted once)
            held = self.book.held()
            lost = [token for token in lost if token in held]
        self.book.lost(lost)
        if lost:
            self.stats.inc_value("bloomcrawl/leases_lost", len(lost))
            logger.warning("%d leases expired before renewal; their requests may be crawled"
                           " twice (raise SCHEDULER_LEASE_TIMEOUT?)", len(lost),
                           extra=self.log_extra)

    def reap(self) -> None:
        """Put expired leases (any worker's) back into the queue."""
        d = self.io.run(self._reap)
        d.addCallbacks(self.count_requeued, self.failed)
        d.addErrback(log_unexpected, logger, self.log_extra)

    def _reap(self) -> int:
        if self.watch.cluster:
            # a replica promoted over a connection opened before: see ServerWatch
            self.watch.check_masters(server_infos(self.frontier.server))
        return self.frontier.reap()

    def release(self) -> None:
        """Closing: the leases this worker did not finish go straight back to the queue."""
        try:
            self.count_requeued(self.frontier.release(self.book.held()))
            self.book.clear()
        except REDIS_ERRORS as exc:
            logger.error("could not put this worker's leases back on close (%s): they will be"
                         " requeued when they expire", exc, extra=self.log_extra)

    def count_requeued(self, requeued: int) -> None:
        if requeued:
            self.stats.inc_value("bloomcrawl/requeued", requeued)
            self.readiness.may_have_work()
            logger.info("requeued %d expired leases", requeued, extra=self.log_extra)

    def failed(self, failure: Failure) -> None:
        redis_failed(failure, self.stats, self.errors)
