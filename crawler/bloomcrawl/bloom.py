"""A scalable, blocked Bloom filter kept in plain Redis.

No Scrapy import here: the exporter and outside tools use this module alone.

Layout (key names in :mod:`bloomcrawl.keys`):

* The filter is split into ``partitions`` by fingerprint bytes 17-20. Each
  partition is an independent scalable Bloom filter in one hash slot, so a
  check-and-set is one Lua call on one slot, also on Redis Cluster.
* Each partition is a list of slices. Slice ``i`` holds ``capacity *
  growth**i`` items (per partition) at error ``error_rate * (1 - tightening) *
  tightening**i``; the compound false-positive rate stays below
  ``error_rate`` however many slices are added.
* Within a slice, all k bits of an item lie in one block of
  :data:`BLOCK_BITS` bits (a blocked Bloom filter), one bit in each of k
  lanes of the block: one read and at most one write per item instead of k.
  Slices are sized with the blocked filter's own false-positive formula, so
  the target holds despite the blocking.
* Slices are stored in chunks of at most ``chunk_bytes`` (well below Redis's
  512 MiB string limit). ``bits_set`` is counted exactly by the same call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis

from bloomcrawl import keys

if TYPE_CHECKING:
    from redis.client import Pipeline

FINGERPRINT_BYTES = 20
BLOCK_BITS = 2048
DEFAULT_CAPACITY = 100_000_000
DEFAULT_ERROR_RATE = 0.001
DEFAULT_PARTITIONS = 4
DEFAULT_GROWTH = 2.0
DEFAULT_TIGHTENING = 0.4
# just under 32 MiB: with the string header the allocation stays in the 32 MiB size class
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024 - 4096
MAX_SLICES = 24
MAX_CHUNK_BYTES = 256 * 1024 * 1024
#: "bitmap": plain Redis strings and Lua, any Redis; "redisbloom": the bf module's
#: BF.MADD inside the same atomic scripts; "auto" picks redisbloom when loaded
BACKENDS = ("bitmap", "redisbloom")
#: RedisBloom's scalable filter halves the error of each new sub-filter
REDISBLOOM_TIGHTENING = 0.5


class BloomFilterError(Exception):
    """Base class of the errors this module raises."""


class InvalidFilterParameters(BloomFilterError, ValueError):
    """A parameter is out of range; raised before Redis is touched."""


class FilterMismatchError(BloomFilterError):
    """The filter stored in Redis was created with other parameters."""


class RedisUnavailableError(BloomFilterError, ConnectionError):
    """Redis could not be reached."""


def describe_redis(client: Any) -> str:
    """A redis:// URL naming the server a client talks to, without its password."""
    try:
        kwargs = client.connection_pool.connection_kwargs
    except AttributeError:
        return repr(client)
    if "path" in kwargs:
        return "unix://%s?db=%s" % (kwargs["path"], kwargs.get("db", 0))
    scheme = "rediss" if kwargs.get("ssl") else "redis"
    return "%s://%s:%s/%s" % (
        scheme,
        kwargs.get("host", "localhost"),
        kwargs.get("port", 6379),
        kwargs.get("db", 0),
    )


@contextmanager
def redis_errors(client: Any) -> Iterator[None]:
    """Turn connection failures into :class:`RedisUnavailableError` naming the server."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailableError(
            "cannot reach Redis at %s: %s" % (describe_redis(client), exc)
        ) from exc


# --- sizing ---------------------------------------------------------------


def blocked_false_positive_rate(bits_per_item: float, hashes: int, block_bits: int) -> float:
    """False-positive rate of the blocked, lane-partitioned filter the Lua scripts keep.

    The number of items in a block is Poisson with mean ``block_bits /
    bits_per_item``; each item sets one bit in each of k lanes of
    ``w = block_bits // k`` bits, so a block holding j items leaves a given
    lane bit unset with probability ``(1 - 1/w)**j``.
    """
    if bits_per_item <= 0:
        return 1.0
    if math.isinf(bits_per_item):
        return 0.0
    load = block_bits / bits_per_item
    spread = 10 * math.sqrt(load) + 10
    lo = max(0, int(load - spread))
    hi = int(load + spread) + 1
    unset = 1.0 - 1.0 / (block_bits // hashes)
    # Poisson weights and unset**j by recurrence from j = lo
    weight = math.exp(lo * math.log(load) - load - math.lgamma(lo + 1)) if load > 0 else 1.0
    power = unset**lo
    total = 0.0
    for j in range(lo, hi):
        total += weight * (1.0 - power) ** hashes
        weight *= load / (j + 1)
        power *= unset
    return total


@lru_cache(maxsize=256)
def size_slice(error_rate: float, block_bits: int = BLOCK_BITS) -> tuple[int, float]:
    """The (hashes, bits per item) of the smallest blocked filter meeting ``error_rate``."""
    ideal = -math.log(error_rate) / math.log(2) ** 2
    ideal_k = max(1, round(ideal * math.log(2)))
    best: tuple[int, float] | None = None
    for k in range(max(1, ideal_k - 1), ideal_k + 3):
        lo, hi = ideal * 0.95, ideal * 2
        for _ in range(30):
            mid = (lo + hi) / 2
            if blocked_false_positive_rate(mid, k, block_bits) <= error_rate:
                hi = mid
            else:
                lo = mid
        if best is None or hi < best[1]:
            best = (k, hi)
    assert best is not None
    return best


@dataclass(frozen=True)
class SlicePlan:
    """One slice of one partition."""

    capacity: int
    error_rate: float
    hashes: int
    blocks: int

    @property
    def bits(self) -> int:
        return self.blocks * BLOCK_BITS


@dataclass(frozen=True)
class FilterParams:
    """What is stored in ``NAME:meta``; two openers must agree on all of it."""

    capacity: int
    error_rate: float
    partitions: int = DEFAULT_PARTITIONS
    growth: float = DEFAULT_GROWTH
    tightening: float = DEFAULT_TIGHTENING
    bit_exponent: int | None = None
    hashes: int | None = None
    block_bits: int = BLOCK_BITS
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    backend: str = "bitmap"
    version: int = keys.FORMAT_VERSION

    def __post_init__(self) -> None:
        problems = []
        if self.backend not in BACKENDS:
            problems.append("backend must be one of %s, got %r" % (", ".join(BACKENDS),
                                                                   self.backend))
        elif self.backend == "redisbloom":
            if self.bit_exponent is not None:
                problems.append("the redisbloom backend sizes from capacity and error rate:"
                                " BLOOMFILTER_BIT/HASH_NUMBER need the bitmap backend")
            if float(self.growth) != int(self.growth):
                problems.append("the redisbloom backend needs an integer growth, got %r"
                                % (self.growth,))
            if self.tightening != REDISBLOOM_TIGHTENING:
                problems.append("the redisbloom backend tightens by %s, got tightening=%r"
                                % (REDISBLOOM_TIGHTENING, self.tightening))
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            problems.append("capacity must be an integer, got %r" % (self.capacity,))
        elif self.capacity <= 0:
            problems.append("capacity must be > 0, got %r" % (self.capacity,))
        if not isinstance(self.error_rate, float | int) or not 0 < self.error_rate < 1:
            problems.append("error_rate must be in (0, 1), got %r" % (self.error_rate,))
        if not isinstance(self.partitions, int) or not 1 <= self.partitions <= 16384:
            problems.append("partitions must be in 1..16384, got %r" % (self.partitions,))
        if not isinstance(self.growth, float | int) or self.growth < 1:
            problems.append("growth must be >= 1, got %r" % (self.growth,))
        if not isinstance(self.tightening, float | int) or not 0 < self.tightening < 1:
            problems.append("tightening must be in (0, 1), got %r" % (self.tightening,))
        if self.bit_exponent is not None and (
            not isinstance(self.bit_exponent, int) or not 10 <= self.bit_exponent <= 40
        ):
            problems.append("bit_exponent (BLOOMFILTER_BIT) must be in 10..40, got %r"
                            % (self.bit_exponent,))
        if self.hashes is not None and (not isinstance(self.hashes, int)
                                        or not 1 <= self.hashes <= 64):
            problems.append("hashes (BLOOMFILTER_HASH_NUMBER) must be in 1..64, got %r"
                            % (self.hashes,))
        if (self.bit_exponent is None) != (self.hashes is None):
            problems.append("bit_exponent and hashes (BLOOMFILTER_BIT, BLOOMFILTER_HASH_NUMBER)"
                            " go together: set both or neither")
        block_bytes = self.block_bits // 8
        if not isinstance(self.chunk_bytes, int) or not (
            block_bytes <= self.chunk_bytes <= MAX_CHUNK_BYTES
        ):
            problems.append("chunk_bytes must be in %d..%d, got %r"
                            % (block_bytes, MAX_CHUNK_BYTES, self.chunk_bytes))
        if problems:
            raise InvalidFilterParameters("invalid Bloom filter parameters: " + "; ".join(problems))

    @classmethod
    def fixed(cls, bit_exponent: int, hashes: int, **kwargs: Any) -> FilterParams:
        """The seeds' sizing: m = 2**bit_exponent bits and k = hashes.

        Capacity is where the first slice is half full (n = m ln 2 / k); the
        error rate is what such a slice gives, compounded over growth slices.
        """
        m = 1 << bit_exponent
        capacity = max(1, int(m * math.log(2) / hashes))
        first = blocked_false_positive_rate(m / capacity, hashes, BLOCK_BITS)
        tightening = float(kwargs.get("tightening", DEFAULT_TIGHTENING))
        error_rate = min(0.5, first / (1 - tightening))
        return cls(capacity=capacity, error_rate=error_rate, bit_exponent=bit_exponent,
                   hashes=hashes, **kwargs)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> FilterParams:
        data = json.loads(text)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def differences(self, other: FilterParams) -> list[str]:
        """``name: stored X, asked for Y`` for each differing parameter."""
        mine, theirs = asdict(self), asdict(other)
        out = []
        for name in mine:
            a, b = mine[name], theirs[name]
            if isinstance(a, float) or isinstance(b, float):
                same = a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)
            else:
                same = a == b
            if not same:
                out.append("%s: stored %r, asked for %r" % (name, a, b))
        return out

    def plan(self) -> list[SlicePlan]:
        """Slice plans of one partition, slice 0 first."""
        return list(_plan(self))


@lru_cache(maxsize=64)
def _plan(params: FilterParams) -> tuple[SlicePlan, ...]:
    # Fingerprints split over partitions binomially: give each partition four
    # standard deviations of headroom, so a filter holding its capacity has
    # not grown yet.
    share = params.capacity / params.partitions
    spread = math.sqrt(share * (1 - 1 / params.partitions))
    per_partition = math.ceil(share + 4 * spread)
    slices = []
    for i in range(MAX_SLICES):
        capacity = max(1, int(per_partition * params.growth**i))
        error = params.error_rate * (1 - params.tightening) * params.tightening**i
        if i == 0 and params.bit_exponent is not None and params.hashes is not None:
            k = params.hashes
            bits = max(BLOCK_BITS, (1 << params.bit_exponent) // params.partitions)
        else:
            k, bits_per_item = size_slice(error, params.block_bits)
            bits = math.ceil(capacity * bits_per_item)
        blocks = max(1, math.ceil(bits / params.block_bits))
        slices.append(SlicePlan(capacity=capacity, error_rate=error, hashes=k, blocks=blocks))
    return tuple(slices)


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


def _load_lua(*names: str) -> str:
    base = resources.files("bloomcrawl") / "lua"
    return "\n".join((base / name).read_text() for name in names)


BACKEND_LUA = {"bitmap": "bloom_common.lua", "redisbloom": "redisbloom_common.lua"}


def backend_script(backend: str, body: str) -> str:
    """The source of a partition script: the backend's prelude, then the body."""
    return _load_lua(BACKEND_LUA[backend], body)


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


class LuaScript:
    """A script called by SHA, loaded on first NOSCRIPT (also inside pipelines)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Any, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys_), *keys_, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys_), *keys_, *args)

    def queue(self, pipe: Pipeline, keys_: Sequence[str], args: Sequence[Any]) -> None:
        pipe.execute_command("EVALSHA", self.sha, len(keys_), *keys_, *args)  # type: ignore[no-untyped-call]

    def run_many(
        self, client: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run several calls in one pipeline (one network round trip)."""
        if len(calls) == 1:
            return [self(client, *calls[0])]
        for attempt in (1, 2):
            pipe = client.pipeline(transaction=False)
            for keys_, args in calls:
                self.queue(pipe, keys_, args)
            results = pipe.execute(raise_on_error=False)
            missing = any(isinstance(r, redis.exceptions.NoScriptError) for r in results)
            if missing and attempt == 1:
                client.script_load(self.source)
                continue
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return list(results)
        raise AssertionError("unreachable")


_ADD = {b: LuaScript(backend_script(b, "bloom_add.lua")) for b in BACKENDS}
_CONTAINS = {b: LuaScript(backend_script(b, "bloom_contains.lua")) for b in BACKENDS}


def has_redisbloom(server: Any) -> bool:
    """True when the server has the bf module loaded."""
    try:
        modules = server.module_list()
    except redis.ResponseError:
        return False
    for module in modules:
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
        capacity: int = DEFAULT_CAPACITY,
        error_rate: float = DEFAULT_ERROR_RATE,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        growth: float = DEFAULT_GROWTH,
        tightening: float = DEFAULT_TIGHTENING,
        bit_exponent: int | None = None,
        hashes: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        backend: str = "bitmap",
    ) -> None:
        keys.check_key(key)
        if backend not in (*BACKENDS, "auto"):
            raise InvalidFilterParameters(
                "backend must be bitmap, redisbloom or auto, got %r" % (backend,))
        concrete = "bitmap" if backend == "auto" else backend
        if concrete == "redisbloom":
            tightening = REDISBLOOM_TIGHTENING
        common = dict(partitions=partitions, growth=growth, tightening=tightening,
                      chunk_bytes=chunk_bytes, backend=concrete)
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
            changes["tightening"] = DEFAULT_TIGHTENING
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
        self.params = FilterParams.from_json(raw)
        return self

    # -- creation -------------------------------------------------------

    def _open(self, params: FilterParams) -> FilterParams:
        meta = keys.meta_key(self.key)
        with redis_errors(self.server):
            self.server.hsetnx(meta, "params", params.to_json())
            stored_raw = self.server.hget(meta, "params")
        assert stored_raw is not None
        try:
            stored = FilterParams.from_json(stored_raw)
        except (ValueError, TypeError) as exc:
            raise FilterMismatchError(
                "Bloom filter %r at %s has unreadable metadata (%s); it was not written by"
                " this version of bloomcrawl" % (self.key, describe_redis(self.server), exc)
            ) from exc
        diffs = stored.differences(params)
        if diffs:
            raise FilterMismatchError(
                "Bloom filter %r at %s exists with other parameters (%s); its bits were left"
                " untouched. Use the stored parameters, another key, or clear the filter."
                % (self.key, describe_redis(self.server), "; ".join(diffs))
            )
        self._ensure_partitions(stored)
        return stored

    def _ensure_partitions(self, params: FilterParams) -> None:
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
            if self.server.hget(keys.meta_key(self.key), "ready") == b"1":
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
        call = ([keys.state_key(self.key, p)], [fp])
        return bool(self._run(_ADD[self.params.backend], [call])[0] == b"1")

    def _run(self, script: LuaScript,
             calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run script calls; if another client cleared the filter, create it and run again."""
        with redis_errors(self.server):
            try:
                return script.run_many(self.server, calls)
            except redis.ResponseError as exc:
                if "BLOOMCRAWL_NOFILTER" not in str(exc):
                    raise
                self.params = self._open(self.params)
                return script.run_many(self.server, calls)

    def add_many(self, fps: Sequence[bytes | str]) -> list[bool]:
        """Add fingerprints; one atomic call per partition touched, in one round trip."""
        return self._batched(_ADD[self.params.backend], fps)

    def __contains__(self, fp: bytes | str) -> bool:
        return self.contains_many([fp])[0]

    def contains_many(self, fps: Sequence[bytes | str]) -> list[bool]:
        return self._batched(_CONTAINS[self.params.backend], fps)

    def _batched(self, script: LuaScript, fps: Sequence[bytes | str]) -> list[bool]:
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
        calls = [([keys.state_key(self.key, p)], [b"".join(blobs[p])]) for p in order]
        results = self._run(script, calls)
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

