"""One spider's shared frontier in Redis: enqueue-if-new, lease, ack, renew, reap, release.

No Scrapy and no engine here: requests are opaque JSON payloads with a fingerprint and
a score. The Scrapy scheduler (:mod:`bloomcrawl.crawl.scheduler`) buffers and polls.

* Enqueue-if-new is one atomic call per partition: the Bloom check-and-set
  and the push into the hosts' queues happen together, so no crash can
  leave a request seen but not queued.
* A lease takes requests only from hosts that may be fetched now, under one
  delay and concurrency per host for the whole cluster
  (:mod:`bloomcrawl.core.politeness`), and moves each into the partition's
  lease hash with a deadline from Redis's clock; it stays in Redis until its
  token is acked, which frees the host's slot. Renewal extends a held lease
  (never recreates a lost one); the reaper puts expired leases back into
  their hosts' queues.
* :meth:`Frontier.exchange` sends a worker's new requests, its acks, the
  next lease and the shared stats in one round trip.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import partition_of
from bloomcrawl.core.connection import ServerWatch, describe_redis, is_cluster
from bloomcrawl.core.errors import SettingError
from bloomcrawl.core.leases import Lease, RequeueCounts, parse_leases
from bloomcrawl.core.politeness import BUSY_RETRY_S, Feedback, Politeness
from bloomcrawl.core.scripts import Script, ScriptCall, load_scripts, transactions_allowed
from bloomcrawl.core.sizing import BACKENDS

if TYPE_CHECKING:
    from bloomcrawl.core.bloom import BloomFilter

QUEUE_TYPES = ("priority", "fifo", "lifo")
REAP_BATCH = 1000

#: requests moved per call from a partition's queue of before per-host queues
MIGRATE_BATCH = 5000

#: a partition's exchange with requests (the filter's prelude first) and without
_ENQUEUE = {(b, w): Script.for_backend(b, "polite_common.lua", "frontier_enqueue.lua",
                                       windowed=w)
            for b in BACKENDS for w in (False, True)}
_LEASE = Script("polite_common.lua", "frontier_lease.lua")
_PEEK = Script("frontier_peek.lua")
RENEW = Script("frontier_renew.lua")
_REAP = Script("polite_common.lua", "frontier_reap.lua")
_MIGRATE = Script("polite_common.lua", "frontier_migrate.lua")
_STATS = Script("frontier_stats.lua")
_START_LEASE = Script("start_lease.lua")
#: an enqueue's decisions: ord("1") queued, ord("2") queued again after its revisit window
_QUEUED = (49, 50)


@dataclass(frozen=True)
class Outgoing:
    """A request on its way into the queue.

    ``fingerprint`` is the filter's (:func:`~bloomcrawl.core.politeness.filter_fingerprint`):
    its partition is the host's.
    """

    fingerprint: bytes
    dont_filter: bool
    score: float
    payload: str
    host: str
    #: the revisit window's flag (:meth:`~bloomcrawl.core.sizing.FilterParams.window_flag`):
    #: "0" the default window
    window: str = "0"
    #: only recorded in the filter (its default window), never queued: a start request's
    #: own fingerprint, beside the entry that queues it once per crawl
    record_only: bool = False


@dataclass
class Exchanged:
    """What one :meth:`Frontier.exchange` did."""

    queued: int = 0
    filtered: int = 0
    #: of those queued, how many the filter had held before their revisit window passed
    revisited: int = 0
    leases: list[Lease] = field(default_factory=list)
    #: seconds until a host of the leased partition may be fetched (None: nothing
    #: queued; BUSY_RETRY_S: every host with work has all its slots in flight)
    ready_in: float | None = None
    #: the same for each partition ``peek`` named
    peeked: dict[int, float | None] = field(default_factory=dict)
    #: the same for every other partition the exchange had a call for (acks, requests,
    #: what this worker saw of hosts), after that call
    waits: dict[int, float | None] = field(default_factory=dict)
    #: the fingerprints the filter queued (not those of dont_filter requests)
    queued_fingerprints: list[bytes] = field(default_factory=list)


def wait_seconds(ms: int) -> float | None:
    """A script's "ms until the next host is ready" as :attr:`Exchanged.ready_in`.

    -2: every host with work is at its concurrency; its slot frees with an
    ack this worker does not see: ask again soon, so every worker gets a turn.
    """
    return None if ms == -1 else BUSY_RETRY_S if ms == -2 else ms / 1000


def ack_args(acks: Sequence[str]) -> list[str]:
    """Ack tokens as the scripts take them.

    An ack may be ``"token|<time.monotonic() of its response>"``: it goes as
    ``"token|<ms ago>"``, computed now, just before it is sent (so it errs
    short: the response looks later than it was, the safe way for the host).
    """
    now = time.monotonic()
    out = []
    for ack in acks:
        token, bar, when = ack.partition("|")
        out.append("%s|%d" % (token, max(0, (now - float(when)) * 1000)) if bar else ack)
    return out


def sent_key(entry: Outgoing) -> bytes:
    """A dont_filter entry's key in the enqueue script, in place of the fingerprint the
    filter skips: its payload's digest, with the entry's own id (random, or its visit's)."""
    payload = entry.payload
    return hashlib.sha1(payload.encode() if isinstance(payload, str) else payload).digest()


def stats_call(f: keys.FrontierKeys, worker: str, node: str,
               stats: Sequence[tuple[int, Mapping[str, int]]]) -> ScriptCall:
    """One call for all of a batch's numbered counts, lowest number first: in one call per
    number, a NOSCRIPT reply to one (after a restart or failover, another client loading
    the script in between) would let a higher number apply before a lower one, which the
    script then refuses. It also tells whether the worker is alone (Frontier.alone)."""
    args: list[Any] = [worker, node]
    for number, counts in stats:
        args += [number, len(counts)]
        for name, value in counts.items():
            args += [name, value]
    return ScriptCall(_STATS, [f.stats, f.pages_by_node, f.stats_applied, f.workers], args)


class Frontier:
    """The Redis protocol of one spider's frontier, shared by every worker.

    ``worker_id`` names this worker's leases; ``node`` is the host name its
    pages are counted under in ``<spider>:pages_by_node``.
    """

    def __init__(self, server: redis.Redis, bloom: BloomFilter, frontier_keys: keys.FrontierKeys,
                 *, queue_type: str, lease_timeout: float, worker_id: str, node: str,
                 politeness: Politeness | None = None) -> None:
        if queue_type not in QUEUE_TYPES:
            raise ValueError("queue_type must be one of %s, got %r" % (QUEUE_TYPES, queue_type))
        self.server = server
        self.bloom = bloom
        self.keys = frontier_keys
        self.queue_type = queue_type
        self.lease_ms = int(lease_timeout * 1000)
        self.worker_id = worker_id
        self.node = node
        self.politeness = politeness or Politeness()
        #: bumped each time the filter had to be created again (it was deleted):
        #: a worker's memory of fingerprints it sent is stale from then on
        self.filter_generation = 0
        self.requeue_counts = RequeueCounts()
        #: an exchange's calls go in one MULTI/EXEC (see open_exchanges)
        self.whole = True
        #: the scheduler's watch of ``server``: its epoch is in lease tokens (a rolled
        #: back counter gives tokens again: an old one's ack must not end a new lease)
        self.watch: ServerWatch | None = None
        #: the only worker alive, as the last stats call found: it may lease all free slots
        self.alone = False

    @property
    def partitions(self) -> int:
        return self.keys.partitions

    def describe(self) -> str:
        return "%s (%s, %d partitions) at %s" % (
            self.keys.queue, self.queue_type, self.partitions, describe_redis(self.server))

    # -- layout ---------------------------------------------------------------

    def record_layout(self) -> None:
        """Tell the exporter and CLI where this spider's keys are; refuse a queue-type change."""
        f = self.keys
        raw: bytes | None = self.server.hget(f.meta, "queue_type")  # type: ignore[assignment]
        stored = raw.decode() if raw is not None else None
        if stored is not None and stored != self.queue_type and self.size() > 0:
            raise SettingError(
                "SCHEDULER_QUEUE_CLASS: the queue %r holds a %s queue, asked for %s; finish or"
                " flush it first (SCHEDULER_FLUSH_ON_START)" % (f.queue, stored, self.queue_type))
        self.server.hset(f.meta, mapping={
            "spider": f.spider, "queue": f.queue, "queue_type": self.queue_type,
            "stats": f.stats, "start_urls": f.start_urls, "items": f.items,
            "pages_by_node": f.pages_by_node,
            "politeness": json.dumps(self.politeness.to_meta(), sort_keys=True),
        })

    def _cfg(self, partition: int) -> str:
        return self.politeness.config(self.keys, partition)

    def migrate(self) -> int:
        """Move requests of the single queues of before per-host queues into the hosts' queues.

        Run when a worker opens; returns how many moved. Leases of before are
        requeued by :meth:`reap` into their hosts' queues when they expire.
        """
        f = self.keys
        moved = 0
        todo = list(range(f.partitions))
        while todo:
            calls = [ScriptCall(_MIGRATE, [f.queue_part(p), *f.polite_keys(p)],
                                [self._cfg(p), self.queue_type, MIGRATE_BATCH]) for p in todo]
            counts = self.bloom.run_scripts(calls)
            moved += sum(int(n) for n in counts)
            todo = [p for p, n in zip(todo, counts, strict=True) if int(n) == MIGRATE_BATCH]
        return moved

    def apply_slots(self) -> None:
        """Write the DOWNLOAD_SLOTS entries as the hosts' setting-level overrides."""
        from bloomcrawl.core.politeness import host_partition, policy_call

        calls = []
        for host, delay, conc in self.politeness.slots:
            p = (host_partition(host, self.partitions)
                 if self.bloom.params.partition_by == "host"
                 else None)
            targets = [p] if p is not None else range(self.partitions)
            calls += [policy_call(self.keys, self.politeness, q, host, source="s",
                                  delay=delay, concurrency=conc) for q in targets]
        if calls:
            self.bloom.run_scripts(calls)

    def reverify(self) -> None:
        """After Redis may have lost or rolled back state: filter and layout exist again."""
        self.bloom.recreate()
        self.record_layout()

    def _recreate_filter(self) -> None:
        """The filter was deleted under a running crawl: create it and the layout again."""
        self.bloom.recreate()
        self.record_layout()
        self.filter_generation += 1

    # -- the protocol -----------------------------------------------------------

    def exchange(self, outgoing: Sequence[Outgoing], acks: Mapping[int, Sequence[str]],
                 stats: Sequence[tuple[int, Mapping[str, int]]] = (), *,
                 lease_from: int | None = None, want: int = 1, ahead: int = 0,
                 horizon: float = 0.0,
                 feedback: Mapping[int, Feedback] | None = None,
                 peek: Sequence[int] = ()) -> Exchanged:
        """One round trip: enqueue-if-new, acks, shared stats and, optionally, a lease.

        With ``lease_from``, that partition's acks ride in the same script call
        as the lease of up to ``want`` requests from it (and ``ahead`` more from hosts
        without a delay, which may wait in the worker; both 0: acks only). ``stats`` are
        ``(number, counts)`` of this worker's exchanges, numbered 1, 2, 3...:
        each number is added to the shared stats once, however often it is
        sent (resend the counts of a failed exchange under its own number).
        ``feedback`` is what this worker saw of hosts, by partition. ``peek``:
        partitions to tell when a host of theirs may be leased
        (:attr:`Exchanged.peeked`), read in the same round trip. ``horizon`` (s):
        a host with a delay ready that soon is leased too, for then
        (:attr:`Lease.due`). Every call may be sent again safely.
        """
        f = self.keys
        by_partition: dict[int, list[Outgoing]] = defaultdict(list)
        for entry in outgoing:
            by_partition[partition_of(entry.fingerprint, f.partitions)].append(entry)
        seen = {p: args for p, fb in (feedback or {}).items()
                if (args := fb.args(self.politeness.autothrottle))}
        touched = [*seen, *by_partition, *(p for p, tokens in acks.items() if tokens)]
        # one call per partition: what it saw of hosts first (an ack may free a host),
        # then its requests, its acks and, last in the pipeline, the lease
        partitions = [p for p in dict.fromkeys(touched) if p != lease_from]
        calls = [self._partition_call(p, seen.get(p), by_partition.get(p, ()),
                                      acks.get(p, ()), 0) for p in partitions]
        stats_at = len(calls) if stats else None
        if stats:
            calls.append(stats_call(f, self.worker_id, self.node, stats))
        calls += [ScriptCall(_PEEK, [f.polite(p, "ready"), f.polite(p, "queued")], [])
                  for p in peek]
        if lease_from is not None:
            partitions.append(lease_from)
            calls.append(self._partition_call(lease_from, seen.get(lease_from),
                                              by_partition.get(lease_from, ()),
                                              acks.get(lease_from, ()), want, ahead,
                                              horizon))
        if not calls:
            return Exchanged()
        sent = time.monotonic()
        # whole: a snapshot with a page's ack and not its links would lose them for good
        results = self.bloom.run_scripts(calls, recreate_filter=self._recreate_filter,
                                         whole=self.whole)
        received = time.monotonic()
        if stats_at is not None:
            self.alone = int(results[stats_at][1]) == 1
        replies = [r for i, r in enumerate(results) if isinstance(r, list) and i != stats_at]
        revisited = sum(reply[0].count(b"2") for reply in replies)
        queued = sum(reply[0].count(b"1") for reply in replies) + revisited
        done = Exchanged(queued, sum(not e.record_only for e in outgoing) - queued, revisited)
        # the filter's fingerprints each partition queued (its decisions, in the order sent)
        call_of = {p: i for i, p in enumerate(partitions[:len(partitions) - (lease_from
                                                                           is not None)])}
        if lease_from is not None:
            call_of[lease_from] = len(calls) - 1
        for p, i in call_of.items():
            if p != lease_from:
                done.waits[p] = wait_seconds(int(results[i][1]))
        for p, entries in by_partition.items():
            decisions = results[call_of[p]][0]
            done.queued_fingerprints += [e.fingerprint for e, d in zip(entries, decisions,
                                                                       strict=True)
                                         if d in _QUEUED and not e.dont_filter]
        if peek:
            at = len(calls) - len(peek) - (lease_from is not None)
            done.peeked = {p: wait_seconds(int(ms))
                           for p, ms in zip(peek, results[at:at + len(peek)], strict=True)}
        if lease_from is not None:
            reply = results[-1]
            done.ready_in = wait_seconds(int(reply[1]))
            done.leases = parse_leases(lease_from, reply[2:], sent, received)
        return done

    def _partition_call(self, partition: int, seen: Sequence[Any] | None,
                        outgoing: Sequence[Outgoing], acks: Sequence[str],
                        want: int, ahead: int = 0, horizon: float = 0.0) -> ScriptCall:
        """The one call of an exchange on ``partition``: what this worker saw of its hosts
        (:meth:`Feedback.args`), requests, acks, lease."""
        f = self.keys
        seen = seen or []
        args: list[Any] = [self._cfg(partition), self.queue_type, len(seen) // 3, len(acks),
                           want, self.lease_ms,
                           # tokens: "<worker>/<epoch>:<partition>:<number from Redis>"
                           "%s%d:" % (self._token_prefix(), partition), repr(random.random()),
                           "%d:%d:%d" % (ahead, horizon * 1000, 1 if self.alone else 2),
                           *seen, *ack_args(acks)]
        script = _LEASE
        partition_keys = [f.state(partition), f.leases(partition), f.deadlines(partition),
                          f.lease_counter(partition), *f.polite_keys(partition)]
        if outgoing:
            script = _ENQUEUE[self.bloom.params.backend, self.bloom.params.windowed]
            partition_keys.append(f.sent(partition))
            args += [b"".join(sent_key(e) if e.dont_filter else e.fingerprint
                              for e in outgoing),
                     "".join("-" if e.record_only else "1" if e.dont_filter else e.window
                             for e in outgoing)]
            for e in outgoing:
                args += [repr(e.score), e.host, e.payload]
        return ScriptCall(script, partition_keys, args)

    def _token_prefix(self) -> str:
        return "%s/%d:" % (self.worker_id, self.watch.epoch if self.watch is not None else 0)

    def applied_stats_number(self) -> int:
        """The number of this worker's last exchange the shared stats hold."""
        raw = self.server.hget(self.keys.stats_applied, self.worker_id)
        return int(raw) if raw is not None else 0

    def lease(self, partition: int, want: int) -> list[Lease]:
        """Lease up to ``want`` requests from one partition."""
        return self.exchange((), {}, lease_from=partition, want=want).leases

    def renew(self, held: Mapping[str, int]) -> list[str]:
        """Extend the deadlines of the leases ``held`` (token -> partition).

        Returns the tokens that were lost: their leases had expired and were
        reaped (their requests may be crawled twice).
        """
        if not held:
            return []
        by_partition: dict[int, list[str]] = defaultdict(list)
        for token, p in held.items():
            by_partition[p].append(token)
        calls = [ScriptCall(RENEW, [self.keys.deadlines(p)], [self.lease_ms, *tokens])
                 for p, tokens in by_partition.items()]
        return [token.decode() for lost in self.bloom.run_scripts(calls) for token in lost]

    def reap(self, most: int = REAP_BATCH) -> int:
        """Put expired leases back into their queues; returns how many (also counted shared:
        :class:`~bloomcrawl.core.leases.RequeueCounts`)."""
        f = self.keys
        epoch = self.requeue_counts.epoch
        calls = [ScriptCall(_REAP, [f.leases(p), f.deadlines(p), *f.polite_keys(p),
                                    f.requeued(p)], [self._cfg(p), self.queue_type, most, epoch])
                 for p in range(f.partitions)]
        replies = self.bloom.run_scripts(calls)
        self.requeue_counts.add(self.bloom, f, replies)
        return sum(int(r[0]) for r in replies)

    def release(self, held: Mapping[str, int]) -> int:
        """Put the leases ``held`` back into the queue now (a worker closing)."""
        if not held:
            return 0
        pipe = self.server.pipeline(transaction=False)
        for token, partition in held.items():
            pipe.zadd(self.keys.deadlines(partition), {token: 0}, xx=True)
        pipe.execute()
        return self.reap()

    def size(self, with_leases: bool = False) -> int:
        """Requests queued (plus, ``with_leases``, leased and waiting as start URLs)."""
        f = self.keys
        pipe = self.server.pipeline(transaction=False)
        for p in range(f.partitions):
            pipe.get(f.polite(p, "queued"))
            if self.queue_type == "priority":  # the queue of before per-host queues
                pipe.zcard(f.queue_part(p))
            else:
                pipe.llen(f.queue_part(p))
            if with_leases:
                pipe.zcard(f.deadlines(p))
        if with_leases:
            pipe.llen(f.start_urls)
            pipe.zcard(f.start_deadlines)
        try:
            return int(sum(int(n or 0) for n in pipe.execute()))
        except redis.ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                return 1
            raise

    def take_start_entries(self, most: int, acks: Sequence[str] = (),
                           source: keys.FrontierKeys | None = None) -> list[tuple[str, bytes]]:
        """Lease up to ``most`` entries of ``<spider>:start_urls`` (``source``'s list when
        given): ``(token, entry)``.

        ``acks`` are tokens of entries whose requests are queued: they are
        done. An entry not acked within the lease goes back to the list (its
        worker died before queueing it); its requests, if they were queued
        after all, are then filtered as duplicates.
        """
        f = source or self.keys
        call = ScriptCall(_START_LEASE, [f.start_urls, f.start_leases, f.start_deadlines,
                                         f.start_counter],
                          [self._token_prefix(), self.lease_ms, most, *acks])
        reply = self.bloom.run_scripts([call])[0]
        return [(reply[i].decode(), reply[i + 1]) for i in range(0, len(reply), 2)]


def flush(frontier: Frontier) -> None:
    """Delete the queue, the leases and the filter's contents; the filter stays usable."""
    f = frontier.keys
    pipe = frontier.server.pipeline(transaction=False)
    for p in range(f.partitions):
        pipe.zrange(f.polite(p, "depth"), 0, -1)
    hosts = pipe.execute()
    doomed = []
    for p in range(f.partitions):
        doomed += [f.queue_part(p), f.leases(p), f.deadlines(p), f.sent(p), f.requeued(p),
                   *(f.polite(p, n) for n in keys.POLITE_KEY_NAMES if n != "policy"),
                   *(f.host_queue(p, h.decode()) for h in hosts[p])]
    for i in range(0, len(doomed), 1000):
        frontier.server.unlink(*doomed[i:i + 1000])
    frontier.bloom.clear()
    frontier.bloom.recreate()
    frontier.record_layout()


def open_exchanges(frontier: Frontier) -> bool:
    """Whether exchanges go whole (MULTI/EXEC) on this server, their scripts loaded first
    so that no NOSCRIPT sends a call apart; asked at start and after a server change
    (its ACL users and script cache are its own). False: one Redis whose user is refused
    MULTI or EXEC (:data:`~bloomcrawl.core.scripts.NO_TRANSACTIONS`)."""
    if is_cluster(frontier.server):  # no transaction spans slots: nothing to ask
        frontier.whole = False
        return True
    frontier.whole = transactions_allowed(frontier.server)
    if frontier.whole:
        params = frontier.bloom.params
        load_scripts(frontier.server, [_ENQUEUE[params.backend, params.windowed], _LEASE,
                                       _PEEK, _STATS])
    return frontier.whole


def live_leases(frontier: Frontier) -> int:
    """Requests and start URLs leased by live workers: expired leases are put back first
    (:meth:`Frontier.reap`)."""
    frontier.reap()
    f = frontier.keys
    pipe = frontier.server.pipeline(transaction=False)
    for p in range(f.partitions):
        pipe.zcard(f.deadlines(p))
    pipe.zcard(f.start_deadlines)
    return int(sum(int(n or 0) for n in pipe.execute()))
