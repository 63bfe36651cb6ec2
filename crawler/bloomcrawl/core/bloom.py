"""A scalable, blocked Bloom filter kept in plain Redis.

No Scrapy import here: the exporter and outside tools use this module alone.

Layout (key names in :mod:`bloomcrawl.core.keys`, sizing in
:mod:`bloomcrawl.core.sizing`):

* The filter is split into ``partitions`` by fingerprint bytes 17-20. Each
  partition is an independent scalable Bloom filter in one hash slot, so a
  check-and-set is one Lua call on one slot, also on Redis Cluster.
* Each partition is a list of slices, added as it fills. Slice ``i`` holds
  ``initial_capacity * growth**i`` items, so memory follows the items held;
  the slices that hold ``capacity`` share the error rate, later ones tighten
  (:mod:`bloomcrawl.core.sizing`): the compound false-positive rate stays
  below ``error_rate`` however many slices are added.
* Within a slice, all k bits of an item lie in one block of
  :data:`~bloomcrawl.core.sizing.BLOCK_BITS` bits (a blocked Bloom filter),
  one bit in each of k lanes of the block: one read and at most one write
  per item instead of k.
* Slices are stored in chunks of at most ``chunk_bytes`` (well below Redis's
  512 MiB string limit). ``bits_set`` is counted exactly by the same call.

Creating or opening a filter (its metadata and partitions) is
:mod:`bloomcrawl.core.bloom_creation`; reading its size and fill is
:mod:`bloomcrawl.core.bloom_info`. :class:`BloomFilter` is the one handle on
all of it.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.bloom_creation import (
    create_or_open,
    has_redisbloom,
    parse_stored_params,
    resolve_auto_backend,
)
from bloomcrawl.core.bloom_info import BloomInfo, filter_info
from bloomcrawl.core.connection import describe_redis, redis_errors
from bloomcrawl.core.errors import BloomFilterError, InvalidFilterParameters, RedisUnavailableError
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.core.sizing import (
    BACKENDS,
    DEFAULT_CHUNK_BYTES,
    FINGERPRINT_BYTES,
    HASHING,
    REDISBLOOM_TIGHTENING,
    FilterParams,
)

__all__ = [
    "BloomFilter",
    "BloomInfo",
    "has_redisbloom",
    "normalise_fingerprint",
    "partition_of",
]


def normalise_fingerprint(fp: bytes | str) -> bytes:
    """20 bytes for any fingerprint: SHA-1 digests pass through unchanged.

    Hex strings (scrapy-redis, old fingerprinters) are decoded; anything else
    is hashed with SHA-1, so custom fingerprinters of any length work.
    """
    if isinstance(fp, str):
        try:
            raw = bytes.fromhex(fp)
        except ValueError:
            raw = fp.encode()
        fp = raw
    if len(fp) == FINGERPRINT_BYTES:
        return fp
    return hashlib.sha1(fp).digest()


def partition_of(fp: bytes, partitions: int) -> int:
    return int.from_bytes(fp[16:20], "big") % partitions

#: by (backend, windowed): a filter with a revisit window runs the window's prelude too
_ADD = {(b, w): Script.for_backend(b, "bloom_add.lua", windowed=w)
        for b in BACKENDS for w in (False, True)}
_CONTAINS = {(b, w): Script.for_backend(b, "bloom_contains.lua", windowed=w)
             for b in BACKENDS for w in (False, True)}


class BloomFilter:
    """A Bloom filter in Redis shared by every worker.

    ``BloomFilter(client, "spider:bloomfilter", capacity=..., error_rate=...)``
    creates the filter or opens the existing one, with the parameters stored
    with it: other sizing is logged; other partitions, partitioning, bit layout
    or backend (any difference, with ``strict_params``) raise
    :class:`FilterMismatchError`.
    ``initial_capacity`` (None: the default, or what an existing filter has)
    is what the first slice of each partition holds.
    ``revisit_after`` (seconds; 0: never) forgets an item W to W (1 + 1/g) after it
    was added, g being ``generations``: a URL is new again after its revisit window.
    ``windows`` (``{name: seconds}``, 0: never) are named windows of their own: an
    item added in one is a duplicate only of what was added in the same one.
    """

    #: set by :meth:`record_calls`: the name its call records go under
    caller: str | None = None

    def __init__(
        self,
        server: redis.Redis,
        key: str,
        capacity: int = defaults.FILTER_CAPACITY,
        error_rate: float = defaults.FILTER_ERROR_RATE,
        *,
        partitions: int = defaults.FILTER_PARTITIONS,
        growth: float = defaults.FILTER_GROWTH,
        tightening: float = defaults.FILTER_TIGHTENING,
        bit_exponent: int | None = None,
        hashes: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        backend: str = "bitmap",
        partition_by: str | None = None,
        initial_capacity: int | None = None,
        strict_params: bool = defaults.FILTER_STRICT_PARAMS,
        revisit_after: float = defaults.FILTER_REVISIT_AFTER,
        generations: int = defaults.FILTER_GENERATIONS,
        windows: Mapping[str, float] | None = None,
    ) -> None:
        keys.check_key(key)
        if backend not in (*BACKENDS, "auto"):
            raise InvalidFilterParameters(
                "backend must be bitmap, redisbloom or auto, got %r" % (backend,))
        concrete = "bitmap" if backend == "auto" else backend
        if concrete == "redisbloom":
            tightening = REDISBLOOM_TIGHTENING
        # None: what an existing filter has, "host" for a new one
        self._adopt_partition_by = partition_by is None
        self._adopt_initial_capacity = initial_capacity is None
        self._strict_params = strict_params
        named = tuple(sorted((windows or {}).items()))
        if (revisit_after or named) and backend == "redisbloom":
            raise InvalidFilterParameters(
                "a revisit window (BLOOMFILTER_REVISIT_AFTER=%r, BLOOMFILTER_REVISIT_WINDOWS"
                "=%r) needs the bitmap backend: RedisBloom's filters cannot forget"
                % (revisit_after, dict(named)))
        if not revisit_after and not named:
            # without a window the generations mean nothing: never a mismatch
            generations = defaults.FILTER_GENERATIONS
        common = dict(partitions=partitions, growth=growth, tightening=tightening,
                      chunk_bytes=chunk_bytes, backend=concrete,
                      partition_by=partition_by or "host", hashing=HASHING,
                      revisit_after=revisit_after, generations=generations,
                      windows=named)
        if bit_exponent is not None or hashes is not None:
            if bit_exponent is None or hashes is None:
                raise InvalidFilterParameters(
                    "BLOOMFILTER_BIT and BLOOMFILTER_HASH_NUMBER go together: set both or neither")
            # the seeds' sizing is an allocation the user asked for: kept as it was
            params = FilterParams.fixed(bit_exponent, hashes, **common)
        else:
            if initial_capacity is None:
                initial_capacity = defaults.FILTER_INITIAL_CAPACITY
            params = FilterParams(capacity=capacity, error_rate=error_rate,
                                  initial_capacity=initial_capacity,
                                  **common)  # type: ignore[arg-type]
        self.server = server
        self.key = key
        # whether check_redisbloom ran: once a handle, not at every recreate
        self._redisbloom_checked = False
        if backend == "auto":
            params, self._redisbloom_checked = resolve_auto_backend(server, key, params)
        self.params = self._open(params)

    @classmethod
    def open(cls, server: redis.Redis, key: str) -> BloomFilter:
        """Open an existing filter with whatever parameters it was created with.

        Read-only: writes nothing (the exporter and ``bloomcrawl status`` use it).
        """
        keys.check_key(key)
        with redis_errors(server):
            raw, ready = server.hmget(keys.meta_key(key), ["params", "ready"])
        if raw is None:
            raise BloomFilterError("no Bloom filter %r at %s" % (key, describe_redis(server)))
        if ready != b"1":
            raise BloomFilterError("Bloom filter %r at %s is still being created"
                                   % (key, describe_redis(server)))
        self = cls.__new__(cls)
        self.server = server
        self.key = key
        self.params = parse_stored_params(server, key, raw)
        return self

    def _open(self, params: FilterParams, rewrite_partitions: bool = False) -> FilterParams:
        # a handle made by open() has no _adopt_*: it adopts nothing (and asks for
        # what is stored)
        stored = create_or_open(
            self.server, self.key, params,
            adopt_partition_by=getattr(self, "_adopt_partition_by", False),
            adopt_initial_capacity=getattr(self, "_adopt_initial_capacity", False),
            strict=getattr(self, "_strict_params", False),
            rewrite_partitions=rewrite_partitions,
            redisbloom_checked=getattr(self, "_redisbloom_checked", False))
        self._redisbloom_checked = stored.backend == "redisbloom"
        return stored

    # -- operations -----------------------------------------------------

    def add(self, fp: bytes | str, window: str | None = None) -> bool:
        """Add one fingerprint; True if it was new (or maybe new: a call whose connection
        failed is sent once more, see :meth:`_check_and_set`). Atomic (one EVALSHA, no
        pipeline).

        ``window``: the named revisit window (BLOOMFILTER_REVISIT_WINDOWS) it goes
        in; None, the default one. :class:`UnknownWindow` for a name the filter
        does not have.
        """
        fp = normalise_fingerprint(fp)
        p = partition_of(fp, self.params.partitions)
        flag = self.params.window_flag(window) if window is not None else None
        call = self._call(_ADD[self.params.backend, self.params.windowed], p, fp, flag,
                          self._token())
        replies, unsure = self._check_and_set([call])
        return unsure or replies[0] == b"1"

    def record_calls(self) -> None:
        """Answer an add call sent again after its reply was lost (by this filter, or by a
        cluster client on its own) as its first send decided: each partition keeps this
        caller's last call and answer (``{<key>:<P>}:call:<caller>``, 10 minutes)."""
        self.caller = os.urandom(6).hex()
        self._tokens = itertools.count(1)

    def _token(self) -> str | None:
        return str(next(self._tokens)) if self.caller is not None else None

    def _call(self, script: Script, p: int, blob: bytes, flags: str | None,
              token: str | None = None) -> ScriptCall:
        """The call of ``script`` on partition ``p``; with ``token``, an add call that
        keeps this caller's record."""
        state = keys.state_key(self.key, p)
        if token is None or self.caller is None:
            return ScriptCall(script, [state], [blob] if flags is None else [blob, flags])
        return ScriptCall(script, [state, keys.call_record_key(self.key, p, self.caller)],
                          [blob, flags or "", token])

    def _check_and_set(self, calls: Sequence[ScriptCall]) -> tuple[list[Any], bool]:
        """:meth:`run_scripts` for calls that add. One whose connection failed may have
        reached Redis all the same (its reply lost, or a timeout while Redis was busy):
        it is sent once more. With call records (:meth:`record_calls`) the second send
        answers what the first decided; without, what it finds seen may be the first
        send's own adding, so the caller answers every item new (True: crawled twice at
        most, never dropped as seen). A Redis still unreachable raises as before."""
        try:
            return self.run_scripts(calls), False
        except RedisUnavailableError:
            return self.run_scripts(calls), self.caller is None

    def run_scripts(self, calls: Sequence[ScriptCall], **options: Any) -> list[Any]:
        """:func:`~bloomcrawl.core.scripts.run_scripts` for calls that touch this filter.

        A call that finds its partition missing (another client cleared the
        filter) makes the filter be created again, and only that call is
        sent again.
        """
        options.setdefault("recreate_filter", self.recreate)
        with redis_errors(self.server):
            return run_scripts(self.server, calls, **options)

    def recreate(self) -> None:
        """Create the filter again with the same parameters (after it or a partition was lost).

        The metadata may still say "ready" when only a partition's state was
        lost (evicted, deleted): the partitions are written again anyway;
        that is idempotent, since the plans follow from the parameters.
        """
        self.params = self._open(self.params, rewrite_partitions=True)

    def add_many(self, fps: Sequence[bytes | str],
                 windows: Sequence[str | None] | None = None) -> list[bool]:
        """Add fingerprints; one atomic call per partition touched, in one round trip.
        ``windows``: each one's named revisit window (see :meth:`add`)."""
        return self._batched(_ADD[self.params.backend, self.params.windowed], fps, windows,
                             token=self._token(), adds=True)

    def __contains__(self, fp: bytes | str) -> bool:
        return self.contains_many([fp])[0]

    def contains_many(self, fps: Sequence[bytes | str],
                      windows: Sequence[str | None] | None = None) -> list[bool]:
        """Whether each fingerprint is (probably) in the filter (in its window's ring)."""
        return self._batched(_CONTAINS[self.params.backend, self.params.windowed], fps,
                             windows)

    def _batched(self, script: Script, fps: Sequence[bytes | str],
                 windows: Sequence[str | None] | None = None, token: str | None = None,
                 adds: bool = False) -> list[bool]:
        if not fps:
            return []
        parts = self.params.partitions
        groups: dict[int, list[int]] = {}
        blobs: dict[int, list[bytes]] = {}
        for i, raw in enumerate(fps):
            fp = normalise_fingerprint(raw)
            p = partition_of(fp, parts)
            if p in groups:
                groups[p].append(i)
                blobs[p].append(fp)
            else:
                groups[p] = [i]
                blobs[p] = [fp]
        order = list(groups)
        flags: list[str] | None = None
        if windows is not None:
            flags = [self.params.window_flag(name) for name in windows]
        calls = [self._call(script, p, b"".join(blobs[p]),
                            "".join(flags[i] for i in groups[p]) if flags is not None else None,
                            token)
                 for p in order]
        if adds:
            results, unsure = self._check_and_set(calls)
            if unsure:
                return [True] * len(fps)
        else:
            results = self.run_scripts(calls)
        out = [False] * len(fps)
        for p, answer in zip(order, results, strict=True):
            for i, flag in zip(groups[p], answer, strict=True):
                out[i] = flag == 49  # ord("1")
        return out

    def info(self) -> BloomInfo:
        """Size and fill from the exact counters (no BITCOUNT), summed over partitions;
        estimates on the redisbloom backend (:mod:`bloomcrawl.core.bloom_info`)."""
        return filter_info(self.server, self.key, self.params)

    def clear(self) -> None:
        """Delete the filter's bits, counters, call records and metadata."""
        with redis_errors(self.server):
            for p in range(self.params.partitions):
                for pattern in (keys.chunk_pattern(self.key, p),
                                keys.call_record_pattern(self.key, p),
                                keys.generation_pattern(self.key, p),
                                keys.generation_pattern(self.key, p, None)):
                    batch = list(self.server.scan_iter(match=pattern, count=1000))
                    if batch:
                        self.server.unlink(*batch)
                self.server.unlink(keys.state_key(self.key, p), keys.redisbloom_key(self.key, p))
            self.server.unlink(keys.meta_key(self.key))

    def __repr__(self) -> str:
        return "BloomFilter(%r, capacity=%d, error_rate=%g, partitions=%d)" % (
            self.key, self.params.capacity, self.params.error_rate, self.params.partitions)

