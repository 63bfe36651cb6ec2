"""A scalable, blocked Bloom filter kept in plain Redis.

No Scrapy import here: the exporter and outside tools use this module alone.

Layout (key names in :mod:`bloomcrawl.core.keys`, sizing in
:mod:`bloomcrawl.core.sizing`):

* The filter is split into ``partitions`` by fingerprint bytes 17-20. Each
  partition is an independent scalable Bloom filter in one hash slot, so a
  check-and-set is one Lua call on one slot, also on Redis Cluster.
* Each partition is a list of slices. Slice ``i`` holds ``capacity *
  growth**i`` items (per partition) at error ``error_rate * (1 - tightening) *
  tightening**i``; the compound false-positive rate stays below
  ``error_rate`` however many slices are added.
* Within a slice, all k bits of an item lie in one block of
  :data:`~bloomcrawl.core.sizing.BLOCK_BITS` bits (a blocked Bloom filter),
  one bit in each of k lanes of the block: one read and at most one write
  per item instead of k.
* Slices are stored in chunks of at most ``chunk_bytes`` (well below Redis's
  512 MiB string limit). ``bits_set`` is counted exactly by the same call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.connection import describe_redis, is_cluster, redis_errors
from bloomcrawl.core.errors import (
    BloomFilterError,
    FilterMismatchError,
    InvalidFilterParameters,
)
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.core.sizing import (
    BACKENDS,
    DEFAULT_CHUNK_BYTES,
    FINGERPRINT_BYTES,
    REDISBLOOM_TIGHTENING,
    FilterParams,
    SlicePlan,
    blocked_false_positive_rate,
)


@dataclass
class BloomInfo:
    """A filter's size and fill, summed over its partitions."""

    capacity: int
    error_rate: float
    hashes: int
    bits: int
    bits_set: int
    fill_ratio: float
    items: int
    estimated_false_positive_rate: float
    slices: int
    memory_bytes: int
    partitions: int = 1
    checked: int = 0
    filtered: int = 0
    slice_capacity: int = 0
    partition_slices: list[int] = field(default_factory=list)

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

_ADD = {b: Script.for_backend(b, "bloom_add.lua") for b in BACKENDS}
_CONTAINS = {b: Script.for_backend(b, "bloom_contains.lua") for b in BACKENDS}


def has_redisbloom(server: Any) -> bool:
    """True when the server (on a cluster: a master) has the bf module loaded."""
    try:
        # redis-py < 5.1 has no module_list on RedisCluster, nor a route for MODULE LIST
        route = {"target_nodes": server.get_primaries()[0]} if is_cluster(server) else {}
        modules = server.execute_command("MODULE LIST", **route)
    except redis.ResponseError:
        return False
    for module in modules:
        if not isinstance(module, dict):  # no reply callback: [name, value, ...]
            module = dict(zip(module[::2], module[1::2], strict=False))
        name = module.get(b"name", module.get("name"))
        if name in (b"bf", "bf"):
            return True
    return False


class BloomFilter:
    """A Bloom filter in Redis shared by every worker.

    ``BloomFilter(client, "spider:bloomfilter", capacity=..., error_rate=...)``
    creates the filter or opens the existing one; different stored parameters
    raise :class:`FilterMismatchError`.
    """

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
        common = dict(partitions=partitions, growth=growth, tightening=tightening,
                      chunk_bytes=chunk_bytes, backend=concrete,
                      partition_by=partition_by or "host")
        if bit_exponent is not None or hashes is not None:
            if bit_exponent is None or hashes is None:
                raise InvalidFilterParameters(
                    "BLOOMFILTER_BIT and BLOOMFILTER_HASH_NUMBER go together: set both or neither")
            params = FilterParams.fixed(bit_exponent, hashes, **common)
        else:
            params = FilterParams(capacity=capacity, error_rate=error_rate,
                                  **common)  # type: ignore[arg-type]
        self.server = server
        self.key = key
        if backend == "auto":
            params = self._resolve_auto(params)
        self.params = self._open(params)

    def _resolve_auto(self, params: FilterParams) -> FilterParams:
        """auto: an existing filter keeps its backend; a new one uses RedisBloom if loaded."""
        with redis_errors(self.server):
            raw = self.server.hget(keys.meta_key(self.key), "params")
            if raw is not None:
                try:
                    stored = json.loads(raw).get("backend", "bitmap")
                except (ValueError, AttributeError):
                    return params
            else:
                stored = "redisbloom" if has_redisbloom(self.server) else "bitmap"
        if stored == params.backend:
            return params
        changes: dict[str, Any] = {"backend": stored}
        if stored == "redisbloom":
            changes["tightening"] = REDISBLOOM_TIGHTENING
            if params.bit_exponent is not None or float(params.growth) != int(params.growth):
                return params  # cannot: stay on the bitmap backend
        else:
            changes["tightening"] = defaults.FILTER_TIGHTENING
        return dataclasses.replace(params, **changes)

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
        self.params = self._stored_params(raw)
        return self

    # -- creation -------------------------------------------------------

    def _stored_params(self, raw: bytes | str) -> FilterParams:
        """The parameters stored in the meta hash; unreadable ones are an error naming the key."""
        try:
            return FilterParams.from_json(raw)
        except (ValueError, TypeError) as exc:
            raise FilterMismatchError(
                "Bloom filter %r at %s has unreadable metadata (%s); it was not written by"
                " this version of bloomcrawl" % (self.key, describe_redis(self.server), exc)
            ) from exc

    def _open(self, params: FilterParams, rewrite_partitions: bool = False) -> FilterParams:
        meta = keys.meta_key(self.key)
        with redis_errors(self.server):
            self.server.hsetnx(meta, "params", params.to_json())
            stored_raw = self.server.hget(meta, "params")
        assert stored_raw is not None
        stored = self._stored_params(stored_raw)
        if getattr(self, "_adopt_partition_by", False):
            params = dataclasses.replace(params, partition_by=stored.partition_by)
        diffs = stored.differences(params)
        if diffs:
            raise FilterMismatchError(
                "Bloom filter %r at %s exists with other parameters (%s); its bits were left"
                " untouched. Use the stored parameters, another key, or clear the filter."
                % (self.key, describe_redis(self.server), "; ".join(diffs))
            )
        self._ensure_partitions(stored, force=rewrite_partitions)
        return stored

    def _ensure_partitions(self, params: FilterParams, force: bool = False) -> None:
        """Write each partition's plan; idempotent, since it follows from the parameters."""
        plan = params.plan()
        block_bytes = params.block_bits // 8
        fields: dict[str, Any] = {
            "block_bytes": block_bytes,
            "chunk_blocks": params.chunk_bytes // block_bytes,
            "max_slices": len(plan),
            "slices": 1,
            "filtered": 0,
        }
        for i, s in enumerate(plan):
            fields["plan:%d" % i] = "%d %d %d" % (s.capacity, s.hashes, s.blocks)
        with redis_errors(self.server):
            if not force and self.server.hget(keys.meta_key(self.key), "ready") == b"1":
                return
            if params.backend == "redisbloom" and not has_redisbloom(self.server):
                raise BloomFilterError(
                    "Bloom filter %r uses the redisbloom backend, but Redis at %s has no bf"
                    " module loaded" % (self.key, describe_redis(self.server)))
            pipe = self.server.pipeline(transaction=False)
            for p in range(params.partitions):
                state = keys.state_key(self.key, p)
                for name, value in fields.items():
                    pipe.hsetnx(state, name, value)
            pipe.execute()
            if params.backend == "redisbloom":
                first = plan[0]
                for p in range(params.partitions):
                    try:
                        self.server.execute_command(  # type: ignore[no-untyped-call]
                            "BF.RESERVE", keys.redisbloom_key(self.key, p),
                            repr(first.error_rate), first.capacity,
                            "EXPANSION", int(params.growth))
                    except redis.ResponseError as exc:
                        if "exists" not in str(exc).lower():
                            raise
            self.server.hset(keys.meta_key(self.key), "ready", 1)

    # -- operations -----------------------------------------------------

    def add(self, fp: bytes | str) -> bool:
        """Add one fingerprint; True if it was new. Atomic (one EVALSHA, no pipeline)."""
        fp = normalise_fingerprint(fp)
        p = partition_of(fp, self.params.partitions)
        call = ScriptCall(_ADD[self.params.backend], [keys.state_key(self.key, p)], [fp])
        return bool(self.run_scripts([call])[0] == b"1")

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

    def add_many(self, fps: Sequence[bytes | str]) -> list[bool]:
        """Add fingerprints; one atomic call per partition touched, in one round trip."""
        return self._batched(_ADD[self.params.backend], fps)

    def __contains__(self, fp: bytes | str) -> bool:
        return self.contains_many([fp])[0]

    def contains_many(self, fps: Sequence[bytes | str]) -> list[bool]:
        return self._batched(_CONTAINS[self.params.backend], fps)

    def _batched(self, script: Script, fps: Sequence[bytes | str]) -> list[bool]:
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
        calls = [ScriptCall(script, [keys.state_key(self.key, p)], [b"".join(blobs[p])])
                 for p in order]
        results = self.run_scripts(calls)
        out = [False] * len(fps)
        for p, answer in zip(order, results, strict=True):
            for i, flag in zip(groups[p], answer, strict=True):
                out[i] = flag == 49  # ord("1")
        return out

    def info(self) -> BloomInfo:
        """Size and fill from the exact counters (no BITCOUNT), summed over partitions."""
        if self.params.backend == "redisbloom":
            return self._redisbloom_info()
        params = self.params
        computed = params.plan()
        chunk_blocks = params.chunk_bytes // (params.block_bits // 8)

        def stored_plan(state: dict[bytes, bytes], s: int) -> SlicePlan:
            """The plan the scripts use is the one stored with the partition."""
            raw = state.get(b"plan:%d" % s)
            if raw is None:
                return computed[s]
            capacity, hashes, blocks = (int(x) for x in raw.split())
            return SlicePlan(capacity, computed[s].error_rate, hashes, blocks)

        with redis_errors(self.server):
            pipe = self.server.pipeline(transaction=False)
            for p in range(params.partitions):
                pipe.hgetall(keys.state_key(self.key, p))
            states = pipe.execute()
            pipe = self.server.pipeline(transaction=False)
            for p, state in enumerate(states):
                for s in range(int(state.get(b"slices", 1))):
                    for c in range(math.ceil(stored_plan(state, s).blocks / chunk_blocks)):
                        pipe.strlen(keys.chunk_key(self.key, p, s, c))
            memory = sum(pipe.execute())
        bits = bits_set = items = checked = filtered = 0
        fp_sum = 0.0
        slices_per_partition = []
        slice_capacity = 0
        for state in states:
            nslices = int(state.get(b"slices", 1))
            slices_per_partition.append(nslices)
            miss = 1.0
            for s in range(nslices):
                sp = stored_plan(state, s)
                s_items = int(state.get(b"items:%d" % s, 0))
                bits += sp.bits
                slice_capacity += sp.capacity
                bits_set += int(state.get(b"bits_set:%d" % s, 0))
                items += s_items
                if s_items:
                    miss *= 1 - blocked_false_positive_rate(sp.bits / s_items, sp.hashes,
                                                            params.block_bits)
            fp_sum += 1 - miss
            filtered += int(state.get(b"filtered", 0))
        checked = items + filtered
        return BloomInfo(
            capacity=params.capacity,
            error_rate=params.error_rate,
            hashes=stored_plan(states[0], 0).hashes,
            bits=bits,
            bits_set=bits_set,
            fill_ratio=bits_set / bits if bits else 0.0,
            items=items,
            estimated_false_positive_rate=fp_sum / params.partitions,
            slices=max(slices_per_partition),
            memory_bytes=memory,
            partitions=params.partitions,
            checked=checked,
            filtered=filtered,
            slice_capacity=slice_capacity,
            partition_slices=slices_per_partition,
        )

    def _redisbloom_info(self) -> BloomInfo:
        """BF.INFO per partition; bits set and false-positive rate are estimates here."""
        params = self.params
        first = params.plan()[0]
        k = max(1, math.ceil(math.log(2) * -math.log(first.error_rate) / math.log(2) ** 2))
        with redis_errors(self.server):
            pipe = self.server.pipeline(transaction=False)
            for p in range(params.partitions):
                pipe.hgetall(keys.state_key(self.key, p))
                pipe.execute_command("BF.INFO", keys.redisbloom_key(self.key, p))  # type: ignore[no-untyped-call]
            replies = pipe.execute()
        bits = bits_set = items = checked = filtered = memory = capacity = 0
        fp_sum = 0.0
        slices = []
        for state, raw in zip(replies[::2], replies[1::2], strict=True):
            pairs = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
            fields = {(name.decode() if isinstance(name, bytes) else name): value
                      for name, value in pairs}
            size = int(fields["Size"])
            n = int(fields["Number of items inserted"])
            m = size * 8
            part_set = round(m * (1 - math.exp(-k * n / m))) if m else 0
            bits += m
            bits_set += part_set
            items += n
            memory += size
            capacity += int(fields["Capacity"])
            slices.append(int(fields["Number of filters"]))
            fp_sum += (part_set / m) ** k if m else 0.0
            filtered += int(state.get(b"filtered", 0))
        checked = items + filtered
        return BloomInfo(
            capacity=params.capacity, error_rate=params.error_rate, hashes=k, bits=bits,
            bits_set=bits_set, fill_ratio=bits_set / bits if bits else 0.0, items=items,
            estimated_false_positive_rate=fp_sum / params.partitions, slices=max(slices),
            memory_bytes=memory, partitions=params.partitions, checked=checked,
            filtered=filtered, slice_capacity=capacity, partition_slices=slices)

    def clear(self) -> None:
        """Delete the filter's bits, counters and metadata."""
        with redis_errors(self.server):
            for p in range(self.params.partitions):
                pattern = keys.chunk_pattern(self.key, p)
                batch = list(self.server.scan_iter(match=pattern, count=1000))
                if batch:
                    self.server.unlink(*batch)
                self.server.unlink(keys.state_key(self.key, p), keys.redisbloom_key(self.key, p))
            self.server.unlink(keys.meta_key(self.key))

    def __repr__(self) -> str:
        return "BloomFilter(%r, capacity=%d, error_rate=%g, partitions=%d)" % (
            self.key, self.params.capacity, self.params.error_rate, self.params.partitions)

