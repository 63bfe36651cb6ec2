"""A lease as a worker holds it, and how the lease script's reply reads as leases.

The partition scripts (``core/lua/polite_common.lua``, ``lease_ready``) answer
each leased request with three values: its token, its queue entry, and what
its host allows (``0``: no delay; ``1:<delay ms>:<room ms>:<not before ms>``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

#: Lease.room of a host with one slot (the lease script's -1 ms)
ONE_SLOT = -0.001


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
