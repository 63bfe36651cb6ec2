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
"""

from __future__ import annotations

from collections.abc import Iterable

#: the bytes of a fingerprint the cache keys on: those the request's host leaves alone
KEY_BYTES = 16


class SeenCache:
    def __init__(self, capacity: int) -> None:
        #: 0: nothing is remembered
        self.capacity = capacity
        self._seen: set[bytes] = set()
        self._generation = 0

    def __contains__(self, fingerprint: bytes) -> bool:
        """Whether ``fingerprint`` (the request's own or the filter's) was sent."""
        return fingerprint[:KEY_BYTES] in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, fingerprints: Iterable[bytes], sent: int) -> None:
        """``fingerprints`` went through the filter in one exchange of ``sent`` requests."""
        if not self.capacity:
            return
        if len(self._seen) + sent > self.capacity:
            self._seen.clear()
        self._seen.update(fp[:KEY_BYTES] for fp in fingerprints)

    def forget(self) -> None:
        self._seen.clear()

    def follow(self, generation: int) -> bool:
        """The filter's generation now; True (and forgotten) when it was created again."""
        if generation == self._generation:
            return False
        self._seen.clear()
        self._generation = generation
        return True
