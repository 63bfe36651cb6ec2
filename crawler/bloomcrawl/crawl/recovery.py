"""After Redis changed under a worker (a restart, a failover): what still holds.

:class:`~bloomcrawl.core.connection.ServerWatch` notices another server
behind the client (its ``run_id``) and fails the first call to it before
it is sent. No exchange starts until the new server said which of this
worker's numbered exchanges it holds (:meth:`Recovery.restate`): all of
them, and nothing changes; fewer (a rollback, a lagging replica, no
persistence), and the worker forgets what may be lost (:meth:`Recovery._rolled_back`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.connection import describe_redis
from bloomcrawl.core.frontier import open_exchanges
from bloomcrawl.core.scripts import NO_TRANSACTIONS
from bloomcrawl.crawl.pages import leases_with_items_sent
from bloomcrawl.crawl.redis_io import log_unexpected, redis_failed

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

    from bloomcrawl.core.connection import RedisErrorPolicy, ServerWatch
    from bloomcrawl.core.frontier import Frontier
    from bloomcrawl.crawl.lease_book import LeaseBook
    from bloomcrawl.crawl.outbox import Outbox
    from bloomcrawl.crawl.pages import PageTracker
    from bloomcrawl.crawl.pipelines import StoredMark
    from bloomcrawl.crawl.readiness import PartitionReadiness
    from bloomcrawl.crawl.redis_io import RedisIO
    from bloomcrawl.crawl.seen import SeenCache

logger = logging.getLogger(__name__)

#: how long a restate waits for a call of the item pipeline whose reply is being read
ITEM_CALL_WAIT_S = 1.0


class Recovery:
    def __init__(self, io: RedisIO, server: redis.Redis, frontier: Frontier, outbox: Outbox,
                 book: LeaseBook, pages: PageTracker, seen: SeenCache,
                 readiness: PartitionReadiness, watch: ServerWatch, stats: StatsCollector,
                 errors: RedisErrorPolicy, log_extra: dict[str, Any],
                 stored_mark: Callable[[], StoredMark | None] = lambda: None) -> None:
        self.io = io
        #: the last item RedisItemsPipeline wrote (None: not enabled)
        self.stored_mark = stored_mark
        self.server = server
        self.frontier = frontier
        self.outbox = outbox
        self.book = book
        self.pages = pages
        self.seen = seen
        self.readiness = readiness
        self.watch = watch
        self.stats = stats
        self.errors = errors
        self.log_extra = log_extra
        self._epoch_seen = 0
        self._needed = False
        self._restating = False

    def needed(self) -> bool:
        """Whether exchanges must wait for :meth:`restate` (the server changed)."""
        if self.watch.epoch != self._epoch_seen:
            self._server_changed()
        return self._needed

    def _server_changed(self) -> None:
        """The first call to the new server failed (ServerChangedError) before it was
        sent; its batch is back in the buffers."""
        self._epoch_seen = self.watch.epoch
        self._needed = True
        self.stats.inc_value("bloomcrawl/redis_restarts")
        d = self.io.run(self.frontier.reverify)
        d.addErrback(redis_failed, self.stats, self.errors)
        d.addErrback(log_unexpected, logger, self.log_extra)

    def restate(self) -> Deferred[list[Request]] | None:
        """Ask the new server what it holds of ours and forget what it lost.

        Fires with the requests dropped against the seen cache since, to be
        enqueued again (their fingerprints may be lost); None while a restate
        is under way. On failure the next exchange asks again.
        """
        if self._restating:
            return None
        self._restating = True
        d = self.io.run(self._ask)
        d.addCallbacks(self._restate, self._restate_failed)
        return d

    def _ask(self) -> tuple[int, bool]:
        """(On the I/O thread.) The new server has ACL users of its own (whether MULTI is
        allowed is asked again) and an empty script cache: the scripts go first, so that
        no exchange is split by a NOSCRIPT reply (see run_scripts). Then: the number of
        this worker's last exchange it holds, and whether it holds the last item the
        item pipeline wrote (a call whose reply is being read waits for it, as what it
        stored leads to acks)."""
        frontier = self.frontier
        was_whole = frontier.whole
        if not open_exchanges(frontier) and was_whole:
            logger.warning(NO_TRANSACTIONS, extra=self.log_extra)
        return frontier.applied_stats_number(), self._items_kept()

    def _items_kept(self) -> bool:
        mark = self.stored_mark()
        if mark is None:
            return True
        deadline = time.monotonic() + ITEM_CALL_WAIT_S
        while mark.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        if mark.in_flight:
            return False  # a call's reply not read yet: what it stored is not known
        return mark.kept_on(self.server, self.watch.run_id)

    def _restate(self, held: tuple[int, bool]) -> list[Request]:
        """The new server holds this worker's exchanges up to number ``applied``, and the
        items its pipeline stored, or not (``items_kept``)."""
        self._needed = self._restating = False
        applied, items_kept = held
        if applied >= self.outbox.confirmed_number and not self.watch.cluster:
            if items_kept:
                # a restart or failover that kept every write of ours (AOF, a caught-up
                # replica): what this worker remembers still holds
                logger.warning("Redis at %s is another server now (run_id %s) and kept this"
                               " worker's writes", describe_redis(self.server),
                               self.watch.run_id, extra=self.log_extra)
                self.outbox.take_dropped()
                return []
            return self._kept_but_items()
        # on Redis Cluster the stats' slot may have kept everything while the
        # promoted master of other partitions lost what it had not replicated
        return self._rolled_back(applied)

    def _kept_but_items(self) -> list[Request]:
        """A restart or failover that kept every exchange of ours and lost items stored
        after the last one (AOF everysec, a replica a moment behind): what this
        worker remembers holds, but a page whose items may be lost must not be acked
        (its lease expires; crawled again, its items are stored once).

        The item pipeline stores items on a connection of its own, and which of them
        the server lost is not known: the acks not sent yet are dropped, and the
        leases of the pages in hand whose items were sent are given up.
        """
        given_up = leases_with_items_sent(self.pages)
        self.book.lost(given_up)
        dropped_acks = self.outbox.drop_acks()
        logger.warning("Redis at %s is another server now (run_id %s) and kept this worker's"
                       " exchanges, not all its items: leaving the leases of %d pages in hand"
                       " and of %d done to expire",
                       describe_redis(self.server), self.watch.run_id, len(given_up),
                       dropped_acks, extra=self.log_extra)
        self.outbox.take_dropped()
        return []

    def _rolled_back(self, applied: int) -> list[Request]:
        """Redis lost writes of ours (a rollback, a lagging replica, no persistence).

        * the seen cache may remember fingerprints Redis lost: forget it, and
          send again what was dropped against it since the last exchange (on
          one Redis, only what no leased page made: that page's ack was lost
          with the fingerprint, and the page is crawled again, see
          :meth:`~bloomcrawl.crawl.outbox.Outbox.dropped`);
        * on Redis Cluster, the requests of the exchanges confirmed in the
          last :data:`~bloomcrawl.crawl.outbox.REPLAY_S` seconds go again
          (the filter drops those Redis kept): a page's ack and its links
          live on different masters, and a failover may keep the ack and
          lose the links. (One Redis loses a suffix of what it was sent: a
          page whose links were lost lost its ack too, and is crawled again.)
        * the leases this worker holds, and the acks it has not sent, are for
          work whose items or links may have gone to the lost state: they are
          not acked; the leases that still exist expire and are crawled again;
          so are the start URL entries whose requests went in an exchange Redis
          may have lost: read again, their requests are queued unless the
          filter kept them;
        * the counts Redis lost go again, each once.
        """
        outbox = self.outbox
        dropped = outbox.take_dropped()
        again = outbox.restate(applied)
        replayed = outbox.replay()
        remembered = len(self.seen)
        given_up = self.book.forget() + outbox.drop_acks() + len(outbox.take_start_acks())
        logger.warning("Redis at %s is another server now (run_id %s) and may have lost writes"
                       " of this worker: forgetting the %d fingerprints it remembered, sending"
                       " %d requests (%d of them from the last %.0f s) and the counts of %d"
                       " exchanges again, leaving %d leases to expire",
                       describe_redis(self.server), self.watch.run_id, remembered,
                       len(dropped) + replayed, replayed, outbox.replay_s, again, given_up,
                       extra=self.log_extra)
        self.stats.inc_value("bloomcrawl/redis_rollbacks")
        self.seen.forget()
        self.readiness.may_have_work()
        return dropped

    def _restate_failed(self, failure: Failure) -> Failure:
        self._restating = False  # still needed: the next exchange asks again
        return failure
