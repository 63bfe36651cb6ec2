"""A lease as a worker holds it, how the lease script's reply reads as leases, and
how the leases the reaps requeue are counted in the shared stats.

The partition scripts (``core/lua/polite_common.lua``, ``lease_ready``) answer
each leased request with three values: its token, its queue entry, and what
its host allows (``0``: no delay; ``1:<delay ms>:<room ms>:<not before ms>``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.scripts import Script, ScriptCall

if TYPE_CHECKING:
    from bloomcrawl.core.bloom import BloomFilter
    from bloomcrawl.core.keys import FrontierKeys

#: Lease.room of a host with one slot (the lease script's -1 ms)
ONE_SLOT = -0.001
_ADD_REQUEUED = Script("frontier_requeued.lua")


@dataclass(frozen=True)
class Lease:
    """A request leased from ``partition``; ``token`` acks, renews or releases it."""

    partition: int
    token: str
    payload: bytes
    #: time.monotonic() when the lease call was sent: the lease is no older
    at: float = 0.0
    #: the host had a delay when leased: when the request left matters to the host's next
    #: lease, so a request that leaves late is reported (a host without one: nothing to move)
    paced: bool = True
    #: a paced host's delay (s, jitter applied) and how long after this lease its next one
    #: may come at the earliest (the delay and its margin); 0.0 when not known; room
    #: ONE_SLOT for a host of one slot: its next lease counts from this one's ack
    delay: float = 0.0
    room: float = 0.0
    #: time.monotonic() before which the request may not leave (a paced host leased for
    #: when it is ready, within the call's horizon); 0.0: at once
    due: float = 0.0

    @property
    def slack(self) -> float:
        """How late the request may leave without coming too close to the host's next
        (inf for a host of one slot: the ack carries when the request ended)."""
        return math.inf if self.room == ONE_SLOT else max(0.0, self.room - self.delay)


def parse_leases(partition: int, reply: list[bytes], sent: float,
                 received: float = 0.0) -> list[Lease]:
    """The leases of one partition call's reply (after its decisions and wait); ``sent``
    and ``received``: time.monotonic() when the call left and its reply came (a lease's
    start counts from then: Redis leased before it)."""
    leases = []
    received = received or time.monotonic()
    for i in range(0, len(reply), 3):
        paced = reply[i + 2]
        if paced == b"0":
            leases.append(Lease(partition, reply[i].decode(), reply[i + 1], sent, False))
            continue
        # b"1:<delay ms>:<room ms>:<not before ms>" (b"1" alone: none known)
        _, delay, room, later = [*paced.split(b":"), b"", b"", b""][:4]
        due = received + int(later) / 1000 if later and later != b"0" else 0.0
        leases.append(Lease(partition, reply[i].decode(), reply[i + 1], sent, True,
                            int(delay or 0) / 1000, int(room or 0) / 1000, due))
    return leases


@dataclass
class RequeueCounts:
    """The shared stats' ``requeued``, fed from the partitions' own counts.

    Each reap counts what it requeues in its partition, in the same atomic step
    (``<queue>:{F:P}:requeued``: an epoch, set when the counter is made, and n), and
    answers the counter. The counters go to ``<spider>:stats`` by what they grew since
    they were last added there (``{<spider>:stats}:requeued`` keeps that per counter
    key and epoch), in another call: the stats lie in another Redis Cluster slot. A
    reap applied whose reply never came (a socket timeout while Redis was stopped, a
    connection closed under it) is counted by the next reap of any worker, once; a
    counter made again (its master lost it, a flush, a clear) has a new epoch, counted
    from 0, and a late value of its old life adds nothing more.
    """

    #: this worker's part of the epoch of a counter it makes (Redis TIME is the other)
    epoch: str = field(default_factory=lambda: os.urandom(6).hex())

    def add(self, bloom: BloomFilter, f: FrontierKeys, replies: Sequence[Sequence[Any]]
            ) -> None:
        """Send the counters of a reap's ``replies`` (one per partition, in order) that
        exist. Sent every time, not only when they moved since this worker last sent
        them: a Redis rolled back or restarted may have lost what was added."""
        args = []
        for p, reply in enumerate(replies):
            epoch, n = reply[1], int(reply[2])
            if n:
                args += [f.requeued(p), epoch, n]
        if args:
            bloom.run_scripts([ScriptCall(_ADD_REQUEUED, [f.stats, f.requeued_added], args)])
