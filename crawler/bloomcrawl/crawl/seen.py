"""Fingerprints this worker already sent through the filter.

The filter only grows, so a fingerprint sent once is in it for good: a
duplicate found here costs no round trip. The cache is bounded
(SCHEDULER_SEEN_CACHE), and forgotten whenever it may no longer hold: the
filter was deleted and created again, or Redis lost writes (a rollback).

It keys on a fingerprint's first :data:`KEY_BYTES` bytes. The filter's
fingerprint keeps them from the request's own
(:func:`bloomcrawl.core.politeness.filter_fingerprint` replaces bytes 17-20
with the host's hash), so a request is looked up before its host is parsed
out of its URL, and most links of a page, sent before, cost no more.
Sixteen bytes of SHA-1 are as unique as the twenty.

Under a revisit window (BLOOMFILTER_REVISIT_AFTER) the filter forgets, so the
cache may only answer for a URL that the filter would still call a duplicate:
it remembers only the fingerprints the filter queued (their time in the
filter began then), and for less than half the window, on this worker's
monotonic clock (two sets, the older one dropped every ``expire_after``
seconds).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

#: the bytes of a fingerprint the cache keys on: those the request's host leaves alone
KEY_BYTES = 16


class SeenCache:
    def __init__(self, capacity: int, expire_after: float | None = None) -> None:
        #: 0: nothing is remembered
        self.capacity = capacity
        #: a revisit window's: an entry is kept from ``expire_after`` to twice that long
        self.expire_after = expire_after
        self._seen: set[bytes] = set()
        self._older: set[bytes] = set()
        self._rotated = time.monotonic()
        self._generation = 0

    @property
    def expires(self) -> bool:
        """Whether entries expire (a revisit window): only queued fingerprints go in."""
        return self.expire_after is not None

    def _expire(self) -> None:
        if self.expire_after is None:
            return
        # the sets turn on fixed boundaries: an entry that went in during [R, R + E)
        # is answered until R + 2E, less than 2E after
        periods = int((time.monotonic() - self._rotated) // self.expire_after)
        if periods:
            self._older = self._seen if periods == 1 else set()
            self._seen = set()
            self._rotated += periods * self.expire_after

    def __contains__(self, fingerprint: bytes) -> bool:
        """Whether ``fingerprint`` (the request's own or the filter's) was sent."""
        self._expire()
        key = fingerprint[:KEY_BYTES]
        return key in self._seen or key in self._older

    def __len__(self) -> int:
        return len(self._seen) + len(self._older)

    def remember(self, fingerprints: Iterable[bytes], sent: int) -> None:
        """``fingerprints`` went through the filter in one exchange of ``sent`` requests
        (under a revisit window: those it queued)."""
        if not self.capacity:
            return
        self._expire()
        if len(self) + sent > self.capacity:
            self.forget()
        self._seen.update(fp[:KEY_BYTES] for fp in fingerprints)

    def forget(self) -> None:
        self._seen.clear()
        self._older.clear()

    def follow(self, generation: int) -> bool:
        """The filter's generation now; True (and forgotten) when it was created again."""
        if generation == self._generation:
            return False
        self.forget()
        self._generation = generation
        return True
