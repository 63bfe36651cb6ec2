"""The exchange loop: one exchange with Redis at a time, and what to do with its reply.

An exchange (:meth:`Outbox.send`) sends all that the worker owes Redis and,
when the engine wants work, leases requests in the same round trip. The
loop decides when one starts (the engine is starved, acks piled up, a
partition's host is ready, a poll, a retry after a failure) and which
partitions it leases from, and acts on its :class:`Reply`: leased requests
go to the :class:`LeaseBook` and the engine, the seen cache and the
partitions' readiness are updated, the next exchange is started or timed.

Nothing here blocks the reactor: the exchange itself runs on the I/O thread.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.connection import ServerChangedError
from bloomcrawl.core.errors import FilterFullError
from bloomcrawl.crawl.duplicates import DuplicateLog
from bloomcrawl.crawl.idle import IDLE_RECHECK_S
from bloomcrawl.crawl.lease import ENTRY_META_KEY, LOCAL_META_KEY
from bloomcrawl.crawl.outbox import count_decisions, filtered_seeds
from bloomcrawl.crawl.redis_io import call_later, log_unexpected, redis_failed
from bloomcrawl.crawl.serialization import entry_id, request_from_json
from bloomcrawl.crawl.timing import Pace, SoonestCall, lease_demand

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.statscollectors import StatsCollector
    from twisted.python.failure import Failure

    from bloomcrawl.core.connection import RedisErrorPolicy
    from bloomcrawl.core.frontier import Frontier
    from bloomcrawl.core.leases import Lease
    from bloomcrawl.crawl.engine import EngineInterface
    from bloomcrawl.crawl.idle import IdleCloser
    from bloomcrawl.crawl.lease import LeaseRef
    from bloomcrawl.crawl.lease_book import LeaseBook
    from bloomcrawl.crawl.outbox import Outbox, Reply
    from bloomcrawl.crawl.readiness import PartitionReadiness
    from bloomcrawl.crawl.recovery import Recovery
    from bloomcrawl.crawl.seeds import StartUrls
    from bloomcrawl.crawl.seen import SeenCache
    from bloomcrawl.crawl.serialization import ClassAllowList

logger = logging.getLogger(__name__)

#: requests buffered that start an exchange by themselves
MAX_BATCH = 500
MAX_POLL_DELAY = 1.0
FIRST_POLL_DELAY = 0.05
#: a worker that got leases this recently has work: it reads start URLs once a
#: MAX_POLL_DELAY, not at every poll
FLOWING_S = 0.25
#: an ack of a host with a delay waits at most this long for an exchange to ride with:
#: the host's next lease may wait on the slot it frees
ACK_DELAY = 0.05
#: an ack of a host without one waits longer, for a lease to ride with: each exchange
#: costs Redis a wake-up, and a worker with requests ready does not lease for a while
ACK_DELAY_UNPACED = 0.15
#: a lease takes a host with a delay and one slot that is ready this soon too, for then
#: (the request waits in the lease book): workers that all learnt when a host is ready
#: would each ask for it then, and all but one find nothing. At most a quarter of the
#: lease timeout
LEASE_LATER_S = 0.5
#: an exchange that goes anyway (acks, links, reports) while the engine still has leased
#: requests leases, in the same call, what the pace wants ahead (LEASE_AHEAD_S) when that
#: is at least this many: from hosts without a delay only (``want`` 0). Else the engine,
#: dry a moment later, starts an exchange of its own: Redis woken once more for the same
#: work
MIN_TOP_UP = 4


class ExchangeLoop:
    """Starts exchanges and acts on their replies; owns the :class:`Outbox`."""

    def __init__(self, *, outbox: Outbox, frontier: Frontier, book: LeaseBook,
                 readiness: PartitionReadiness, seen: SeenCache, recovery: Recovery,
                 start_urls: StartUrls, idle: IdleCloser, engine: EngineInterface,
                 spider: Spider, allowed: ClassAllowList | None, stats: StatsCollector,
                 errors: RedisErrorPolicy, requeue: Callable[[Request], bool],
                 concurrency: int, prefetch: int, debug_duplicates: bool = False) -> None:
        self.outbox = outbox
        self.io = outbox.io
        self.frontier = frontier
        self.book = book
        self.readiness = readiness
        self.seen = seen
        self.recovery = recovery
        self.idle = idle
        self.engine = engine
        self.spider = spider
        self.allowed = allowed
        self.stats = stats
        self.errors = errors
        #: enqueue_request: requests Redis may have lost go through it again
        self.requeue = requeue
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.log_extra = {"spider": spider}
        self.duplicates = DuplicateLog(debug_duplicates, spider)
        outbox.duplicate_log = self.duplicates
        #: the engine asked for a request and got none: the next lease must wake it
        self.starved = False
        #: requests, leases and start URLs anywhere in the cluster, as last seen (None: unknown)
        self.frontier_size: int | None = None
        self.started = False
        self.closing = False
        self.poller = Poller(self, start_urls)
        #: under revisit windows every leased request carries its queue entry's id, else
        #: only one fetched again on purpose (``dont_filter``, or a start request: once
        #: per crawl): its items are stored once per visit, not once per page
        #: (ENTRY_META_KEY)
        self.by_visit = frontier.bloom.params.windowed
        #: what is owed leaves by then at the latest (ack and feedback timer)
        self._flush_call = SoonestCall(self._exchange_owed)
        #: starved: when the soonest host is ready
        self._wake_call = SoonestCall(self._exchange_owed)
        #: after a failed exchange, once its back-off passed (none starts meanwhile)
        self._retry_call = SoonestCall(self._exchange_owed)
        #: a request leased for later is due: the engine gets it
        self._due_call = SoonestCall(self._due)
        self.horizon = min(LEASE_LATER_S, frontier.lease_ms / 4000)
        self.pace = Pace()

    # -- starting and stopping -----------------------------------------------------------

    def start(self) -> None:
        """Poll for start URLs and work from now on (the I/O thread runs)."""
        self.started = True
        self.poller.start()

    def stop(self) -> None:
        """No more timers or retries: the scheduler is closing."""
        self.closing = True
        self.poller.stop()
        for timer in (self._flush_call, self._wake_call, self._retry_call, self._due_call):
            timer.cancel()

    def busy_here(self) -> bool:
        """Leased requests wait (for the engine or their time), or Redis is owed or busy."""
        return bool(self.book.ready() or self.book.waiting() or self.outbox.owes()
                    or self.outbox.exchanging)

    # -- what the scheduler and its parts ask for ----------------------------------------

    def ack(self, ref: LeaseRef | tuple[int, str]) -> None:
        """The request of lease ``ref`` is done: its ack goes with the next exchange, within
        ACK_DELAY (a host with a delay) or ACK_DELAY_UNPACED (one without, or one of a
        single slot whose delay is at least twice that: its next lease counts from the
        request's end the ack carries, and cannot come before half its delay is over)."""
        paced = self.book.leased_at(ref[1]) is not None
        room = self.book.room(ref[1])
        ack = self.book.finish(ref)
        if ack is not None:
            self.pace.done += 1
            self.outbox.ack(int(ref[0]), ack)
            unpaced = not paced or (room.one_slot and room.delay >= 2 * ACK_DELAY_UNPACED)
            self.flush_soon(ACK_DELAY_UNPACED if unpaced else ACK_DELAY)

    def flush_soon(self, delay: float) -> None:
        """Send what is owed within ``delay`` s (with the next lease, if one comes first)."""
        if self.started:
            self._flush_call.within(delay)

    def flush_pending(self) -> bool:
        """What is owed leaves by a timer already set."""
        return self._flush_call.pending()

    def exchange(self, *, lease: bool = True, check_idle: bool = False) -> None:
        """Start an exchange of all that is owed, leasing when this worker wants work.
        Nothing starts while one is under way (its reply starts the next) or while a retry
        waits out its back-off (it will)."""
        if self.outbox.exchanging or self._retry_call.pending():
            return
        if self.recovery.needed():
            # the stats Redis lost go first, in order, before any newer number
            d = self.recovery.restate()
            if d is not None:
                d.addCallbacks(self._recovered, self.redis_failed)
                d.addErrback(log_unexpected, logger, self.log_extra)
            return
        lease_from = None
        probe: list[int] = []
        want, ahead = self._demand()
        ready = self.readiness.ready_now()
        empty = not self.book.ready()
        if lease and want and empty and ready:
            order = self.readiness.lease_order(ready, first=self.outbox.ack_partition())
            lease_from, probe = order[0], order[1:]
        elif lease and want and empty:
            self._wake_when_ready()  # no host is ready yet: ask when the first one is
        elif ahead >= MIN_TOP_UP and ready and self.outbox.owes() and not self.closing:
            # an exchange that goes anyway tops up the engine's requests (MIN_TOP_UP)
            lease_from = self.readiness.lease_order(ready, first=self.outbox.ack_partition())[0]
            want, ahead = 0, want + ahead
        if (lease_from is None and not ready and not check_idle and self.flush_pending()
                and not self.readiness.waiting_for_others() and not self.outbox.has_feedback()
                and self.outbox.requests() < MAX_BATCH):
            # every partition waits for a known time: owed goes by its timer, a lease then
            self._wake_when_ready()
            return
        self._send(lease_from, want=want, ahead=ahead, check_idle=check_idle, probe=probe)

    def send_now(self) -> None:
        """Send until nothing is owed, inline (the I/O thread is stopped or never ran).

        Raises the Redis error; what was not sent stays owed.
        """
        assert not self.io.threaded, "the I/O thread is running"
        for _ in range(3):  # an exchange can owe a little more (its duplicates count)
            if not self.outbox.owes():
                return
            failures: list[Failure] = []
            self._send(None, want=1, ahead=0, check_idle=False, probe=[], failures=failures)
            if failures:
                failures[0].raiseException()

    def _send(self, lease_from: int | None, *, want: int, ahead: int, check_idle: bool,
              probe: list[int], failures: list[Failure] | None = None) -> None:
        horizon = self.horizon if self.io.threaded else 0.0
        d = self.outbox.send(lease_from, want=want, ahead=ahead, horizon=horizon,
                             check_idle=check_idle, probe=probe)
        if d is None:
            return
        self._flush_call.cancel()  # all owed left: the next ack sets it from its own time
        d.addCallbacks(self._exchanged, self._failed if failures is None else failures.append)
        d.addErrback(log_unexpected, logger, self.log_extra)

    def _demand(self) -> tuple[int, int]:
        """How many to lease, and how many more from hosts without a delay (lease_demand)."""
        active = self.engine.active_downloads() if self.io.threaded else None
        if active is None:  # inline, or no engine (yet)
            return self.prefetch, 0
        return lease_demand(self.concurrency - active, self.book.ready(), self.book.waiting(),
                            self.prefetch, self.pace.per_second(time.monotonic()))

    # -- replies ---------------------------------------------------------------------------

    def _exchanged(self, reply: Reply) -> None:
        self.errors.ok()
        batch, done = reply.batch, reply.done
        if self.seen.follow(self.frontier.filter_generation):
            logger.warning("the Bloom filter %s was deleted; it was created again",
                           self.frontier.keys.filter, extra=self.log_extra)
        if self.seen.expires:  # a revisit window: only what began its time in the filter now
            self.seen.remember(done.queued_fingerprints, sent=len(batch.outgoing))
        else:
            self.seen.remember((e.fingerprint for e in batch.outgoing if not e.dont_filter),
                               sent=len(batch.outgoing))
        count_decisions(self.outbox, self.stats, batch, done)
        if done.filtered and self.duplicates.active:
            self.duplicates.filtered(batch, done.queued_fingerprints)
        for url in filtered_seeds(batch, done.queued_fingerprints):
            self.poller.start_urls.filtered(url)
        if reply.frontier_size is not None:
            self.frontier_size = reply.frontier_size
            if reply.frontier_size == 0 and self.starved:
                self.idle.recheck_in(IDLE_RECHECK_S)
        got = self._take(reply.leases)
        if self.book.waiting():
            self._due_call.within(max(0.0, self.book.next_due() - time.monotonic()))
        # a partition that gave all it was asked for may have more; one that gave less,
        # or that the exchange acked, queued or reported to, is ready when its soonest
        # host is, as its call found it after doing all that (an ack frees its host's
        # slot, a new request may make its host ready: the call saw it)
        for p, wait in reply.ready_in.items():
            self.readiness.ready_in(p, wait)
        if got:
            self.frontier_size = None
            self.poller.found()
            self._wake_engine()
        # a starved engine gets its next lease now (with what piled up meanwhile: acks,
        # new links), unless requests leased for later fill its free slots; else what
        # piled up rides with the next lease, or the ack timer's exchange. After an
        # empty lease, looking for work again is the poller's job.
        if not self.closing and (
                (self.starved and self.readiness.ready_now() and not self.book.ready()
                 and self._demand()[0] > 0)
                or self.outbox.requests() >= MAX_BATCH):
            self.exchange()
        elif not self.closing and self.outbox.has_feedback():
            # what holds a host back (a late request, a 429) goes now, not with the next lease
            self.exchange(lease=self.starved)
        elif not self.book.ready():
            self._wake_when_ready()

    def _take(self, leases: list[Lease]) -> int:
        """Turn leases into requests in the lease book; returns how many."""
        got = 0
        for lease in leases:
            try:
                request = request_from_json(lease.payload, self.spider, self.allowed)
            except Exception as exc:  # a corrupt or hostile entry must not stop the crawl
                logger.error("dropping an unreadable queue entry %r: %s", lease.payload[:200],
                             exc, extra=self.log_extra)
                self.stats.inc_value("bloomcrawl/unreadable_requests")
                self.outbox.count("errors")
                self.book.take(lease, None)
                self.ack((lease.partition, lease.token))
                continue
            if self.by_visit or request.dont_filter or "is_start_request" in request.meta:
                request.meta[ENTRY_META_KEY] = entry_id(lease.payload)
            self.book.take(lease, request)
            got += 1
        return got

    def _wake_engine(self) -> None:
        """Hand one leased request to the engine through its public crawl()."""
        if not self.io.threaded or not self.book.ready() or not self.starved:
            return
        if not self.engine.available():
            return
        request = self.book.pop_ready()
        request.meta[LOCAL_META_KEY] = True
        self.engine.crawl(request)

    def _due(self) -> None:
        """Requests leased for later are due: to the engine, as a lease's are."""
        if not self.closing:
            self._wake_engine()
            if self.book.waiting():
                self._due_call.within(max(0.0, self.book.next_due() - time.monotonic()))

    def _failed(self, failure: Failure) -> None:
        """The exchange failed; its batch is back in the buffers."""
        if isinstance(failure.value, FilterFullError):
            self._filter_full(failure.value)
            return
        if isinstance(failure.value, ServerChangedError):
            # nothing of the batch was sent: send it again at once; the retry first
            # decides what no longer holds on the new server (Recovery)
            if self.closing:
                return
            if self.io.threaded:
                self._retry_call.within(0)
            else:
                self._exchange_owed()
            return
        delay = redis_failed(failure, self.stats, self.errors)
        if not self.closing and self.io.threaded:
            self._retry_call.within(delay)

    def _exchange_owed(self) -> None:
        """The timers' exchange: what is owed, and a lease if the engine is starved."""
        self.exchange(lease=self.starved)

    def redis_failed(self, failure: Failure) -> None:
        redis_failed(failure, self.stats, self.errors)

    def _recovered(self, dropped: list[Request]) -> None:
        for request in dropped:
            self.requeue(request)
        self._exchange_owed()

    def _filter_full(self, exc: FilterFullError) -> None:
        """The filter refuses new items: stop the crawl, loudly, rather than drop URLs."""
        self.stats.inc_value("bloomcrawl/filter_full")
        logger.error("%s; stopping the crawl (%d new requests of this worker were not"
                     " queued)", exc, self.outbox.drop_requests(), extra=self.log_extra)
        if not self.closing:
            self.engine.close_spider("bloomfilter_full")

    # -- timers: polling and waking ----------------------------------------------------------

    def _wake_when_ready(self) -> None:
        """Starved and no partition ready now: lease when the soonest host is ready."""
        if self.closing or not self.starved or not self.io.threaded:
            return
        soonest = self.readiness.soonest()
        if soonest != float("inf"):
            self._wake_call.within(max(0.0, soonest - time.monotonic()), slack=0.001)


class Poller:
    """Reads start URLs and, when the engine is starved, looks for work.

    Other workers' new requests and acks are not seen by this worker: it
    asks every 50 ms while it finds something, backing off to
    MAX_POLL_DELAY while it does not.
    """

    def __init__(self, loop: ExchangeLoop, start_urls: StartUrls) -> None:
        self.loop = loop
        self.start_urls = start_urls
        self._delay = FIRST_POLL_DELAY
        self._call: Any = None
        self._stopped = False
        self._read_at = float("-inf")
        self._found_at = float("-inf")

    def start(self) -> None:
        self._schedule(0)

    def stop(self) -> None:
        self._stopped = True
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def found(self) -> None:
        """Work was found: poll often again."""
        self._delay = FIRST_POLL_DELAY
        self._found_at = time.monotonic()

    def look_soon(self) -> None:
        """Others are crawling and may queue more: poll now, and often for a while."""
        if self._delay > 0.2:
            self._delay = FIRST_POLL_DELAY
            if self._call is not None:
                self._call.cancel()
            self._schedule(0)

    def _schedule(self, delay: float) -> None:
        if not self._stopped:
            self._call = call_later(delay, self._poll)

    def _poll(self) -> None:
        self._call = None
        loop = self.loop
        loop.readiness.may_have_work(loop.readiness.waiting_for_others())
        # a worker with work reads new start URLs once a MAX_POLL_DELAY (a round trip
        # each); one with start URLs to ack, or starved with no lease for FLOWING_S, at
        # every poll. While leases flow the engine is "starved" for a moment after each
        # page, which is not a reason to read the start list again.
        now = time.monotonic()
        # starved with leased requests ready: the engine has not asked since they came
        # (it is busy with responses); it gets them when it asks, no exchange needed
        starved = loop.starved and not loop.book.ready()
        # a partition whose host is ready at a known time has requests queued: the frontier
        # is not empty, and the wake timer leases then; no need to ask Redis its size
        timed = loop.readiness.waiting_for_time()
        if starved and timed:
            loop.frontier_size = None
        dry = starved and now - self._found_at >= FLOWING_S
        if dry or loop.outbox.has_start_acks() or now - self._read_at >= MAX_POLL_DELAY:
            self._read_at = now
            d = self.start_urls.read()
            d.addCallbacks(self._read, loop.redis_failed)
            d.addErrback(log_unexpected, logger, loop.log_extra)
        # a worker with work sends its acks and reports by the ack timer or with its next
        # lease, and its counts with whichever exchange comes next: a poll's exchange would
        # only wake Redis once more. What no timer will send (links, acks, reports) goes.
        outbox = loop.outbox
        writes = outbox.requests() or outbox.ack_partition() is not None or outbox.has_feedback()
        ask = starved and (not timed or bool(loop.readiness.ready_now()))
        if ask or (writes and not loop.flush_pending()):
            loop.exchange(lease=starved, check_idle=starved and not timed)
        elif starved:
            loop._wake_when_ready()  # the lease when the soonest host is ready
        self._schedule(self._delay)
        self._delay = min(MAX_POLL_DELAY, self._delay * 2)

    def _read(self, entries: int) -> None:
        if entries:
            self.loop.errors.ok()
            self._delay = FIRST_POLL_DELAY
            self.loop.exchange(lease=self.loop.starved)
