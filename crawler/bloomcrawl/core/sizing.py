"""Sizing of the blocked, scalable Bloom filter: parameters, slice plans, error rates.

Pure arithmetic, no Redis: :class:`FilterParams` is what a filter stores in
its meta hash, and :meth:`FilterParams.plan` is what every opener derives
from it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.errors import InvalidFilterParameters

FINGERPRINT_BYTES = 20
BLOCK_BITS = 2048
# just under 32 MiB: with the string header the allocation stays in the 32 MiB size class
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024 - 4096
MAX_SLICES = 24
MAX_CHUNK_BYTES = 256 * 1024 * 1024
#: "bitmap": plain Redis strings and Lua, any Redis; "redisbloom": the bf module's
#: BF.MADD inside the same atomic scripts; "auto" picks redisbloom when loaded
BACKENDS = ("bitmap", "redisbloom")
#: RedisBloom's scalable filter halves the error of each new sub-filter
REDISBLOOM_TIGHTENING = 0.5

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


PARTITION_BY = ("host", "fingerprint")


@dataclass(frozen=True)
class FilterParams:
    """What is stored in ``NAME:meta``; two openers must agree on all of it."""

    capacity: int
    error_rate: float
    partitions: int = defaults.FILTER_PARTITIONS
    growth: float = defaults.FILTER_GROWTH
    tightening: float = defaults.FILTER_TIGHTENING
    bit_exponent: int | None = None
    hashes: int | None = None
    block_bits: int = BLOCK_BITS
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    backend: str = "bitmap"
    version: int = keys.FORMAT_VERSION
    #: what fingerprint bytes 17-20 (the partition) come from: "host", a hash of
    #: the request's host, so a host's filter bits, queue and politeness state share
    #: one slot; or "fingerprint", the request's own (filters made before hosts were)
    partition_by: str = "fingerprint"

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
        if self.partition_by not in PARTITION_BY:
            problems.append("partition_by must be one of %s, got %r"
                            % (", ".join(PARTITION_BY), self.partition_by))
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int):
            problems.append("capacity must be an integer, got %r" % (self.capacity,))
        elif self.capacity <= 0:
            problems.append("capacity must be > 0, got %r" % (self.capacity,))
        if not isinstance(self.error_rate, float | int) or not 0 < self.error_rate < 1:
            problems.append("error_rate must be in (0, 1), got %r" % (self.error_rate,))
        if not isinstance(self.partitions, int) or not 1 <= self.partitions <= 16384:
            problems.append("partitions must be in 1..16384, got %r" % (self.partitions,))
        if (not isinstance(self.growth, float | int) or not math.isfinite(self.growth)
                or self.growth < 1):
            problems.append("growth must be >= 1 and finite, got %r" % (self.growth,))
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
        tightening = float(kwargs.get("tightening", defaults.FILTER_TIGHTENING))
        error_rate = min(0.5, first / (1 - tightening))
        return cls(capacity=capacity, error_rate=error_rate, bit_exponent=bit_exponent,
                   hashes=hashes, **kwargs)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> FilterParams:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the parameters are %r, not a JSON object" % (data,))
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
