"""Sizing of the blocked, scalable Bloom filter: parameters, slice plans, error rates.

Pure arithmetic, no Redis: :class:`FilterParams` is what a filter stores in
its meta hash, and :meth:`FilterParams.plan` is what every opener derives
from it.

A filter made now starts small and grows with what it holds
(``initial_capacity``): slice ``i`` of a partition holds ``initial_capacity *
growth**i`` items. The slices it takes for one partition to hold
``capacity`` items share ``(1 - tightening)`` of the error rate equally;
past them, each slice gets ``tightening`` times the previous one's share, so
the compound rate stays under ``error_rate`` however far it grows. Filters
made before (no ``initial_capacity`` stored) keep their first slice of
``capacity / partitions`` items.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.errors import InvalidFilterParameters, UnknownWindow

FINGERPRINT_BYTES = 20
LN2_2 = math.log(2) ** 2
BLOCK_BITS = 2048
# just under 32 MiB: with the string header the allocation stays in the 32 MiB size class
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024 - 4096
MAX_SLICES = 24
#: slices of a small-start filter past those that hold its capacity (32 times the capacity)
OVERFLOW_SLICES = 5
#: at most this many slices to reach the capacity: a larger first slice beyond it
MAX_PLANNED_SLICES = 40
MAX_CHUNK_BYTES = 256 * 1024 * 1024
#: "bitmap": plain Redis strings and Lua, any Redis; "redisbloom": the bf module's
#: BF.INSERT NOCREATE inside the same atomic scripts; "auto" picks redisbloom when loaded
BACKENDS = ("bitmap", "redisbloom")
#: RedisBloom's scalable filter halves the error of each new sub-filter
REDISBLOOM_TIGHTENING = 0.5
#: where an item's bits lie in its block (bloom_common.lua): 1, triple hashing of 16-bit
#: values, whose few patterns per block add to the false-positive rate (filters made
#: before); 2, a quadratic sequence of 24-bit values, as independent as the formula assumes
HASHINGS = (1, 2)
#: what new filters use
HASHING = 2

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

#: what decides where an item's bits are and which partition (and queue) holds it: a
#: filter stored with others is never opened
LAYOUT_FIELDS = ("partitions", "partition_by", "block_bits", "hashing", "backend", "version",
                 "revisit_after", "generations", "windows")
#: the most generations a revisit window keeps (each call may look in all of them)
MAX_GENERATIONS = 64
#: the most named revisit windows a filter has (BLOOMFILTER_REVISIT_WINDOWS): each is
#: one letter in the scripts' flags, "a" for the first name in order
MAX_WINDOWS = 26
#: a named window's name: what a request's meta["revisit"] or a spider's
#: ``revisit_window`` says; "default" is BLOOMFILTER_REVISIT_AFTER's
WINDOW_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
DEFAULT_WINDOW = "default"


def shortest_window(revisit_after: float, windows: tuple[tuple[str, float], ...]) -> float:
    """The shortest of a default window and named ones that forgets (0: none forgets)."""
    return min((w for w in (revisit_after, *(span for _, span in windows)) if w), default=0.0)


def allocation_bytes(size: int) -> int:
    """Bytes jemalloc (Redis's allocator) gives ``size``: 4 classes a power of 2 above 128."""
    if size <= 8:
        return 8
    if size <= 128:
        return (size + 15) // 16 * 16
    step = 1 << ((size - 1).bit_length() - 3)
    return (size + step - 1) // step * step


def _sds_header(length: int) -> int:
    """Redis's string header (sdshdr8/16/32) plus its trailing NUL."""
    return 4 if length < 1 << 8 else 6 if length < 1 << 16 else 10


def fill_allocation(blocks: int, block_bytes: int) -> int:
    """The most blocks a string of ``blocks`` blocks can hold in the allocation it gets anyway."""
    size = allocation_bytes(blocks * block_bytes + _sds_header(blocks * block_bytes))
    room = size - _sds_header(size)
    while room + _sds_header(room) > size:
        room -= 1
    return max(blocks, room // block_bytes)


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
    #: items the first slice of each partition holds; None: filters made before
    #: slices started small, whose first slice holds ``capacity / partitions``
    initial_capacity: int | None = None
    #: where an item's bits lie in its block (:data:`HASHINGS`)
    hashing: int = 1
    #: the revisit window W in seconds (BLOOMFILTER_REVISIT_AFTER): an item added longer
    #: than W (1 + 1/generations) ago is forgotten; 0, never (filters made before)
    revisit_after: float = 0
    #: the generations g a revisit window is kept in (BLOOMFILTER_GENERATIONS)
    generations: int = defaults.FILTER_GENERATIONS
    #: named revisit windows (BLOOMFILTER_REVISIT_WINDOWS), ``(name, seconds)`` sorted by
    #: name, 0 seconds: never forgotten. Each is a ring of generations of its own; a
    #: request names its window, and is a duplicate only of what was queued in it
    windows: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        problems: list[str] = []
        self._check_windows(problems)
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
        if self.hashing not in HASHINGS or isinstance(self.hashing, bool):
            problems.append("hashing must be one of %s, got %r"
                            % (", ".join(map(str, HASHINGS)), self.hashing))
        initial = self.initial_capacity
        if initial is not None:
            if isinstance(initial, bool) or not isinstance(initial, int) or initial < 1:
                problems.append("initial_capacity must be an integer >= 1, got %r" % (initial,))
            elif self.bit_exponent is not None:
                problems.append("BLOOMFILTER_BIT/HASH_NUMBER size the first slice: no"
                                " initial_capacity with them")
        if (isinstance(self.revisit_after, bool)
                or not isinstance(self.revisit_after, float | int)
                or not math.isfinite(self.revisit_after) or self.revisit_after < 0):
            problems.append("revisit_after must be a number of seconds >= 0, got %r"
                            % (self.revisit_after,))
        elif self.windowed:
            if self.backend != "bitmap":
                problems.append("a revisit window (BLOOMFILTER_REVISIT_AFTER/_WINDOWS) needs"
                                " the bitmap backend, got %r" % (self.backend,))
            if self.bit_exponent is not None:
                problems.append("a revisit window (BLOOMFILTER_REVISIT_AFTER/_WINDOWS) needs"
                                " a growing filter: no BLOOMFILTER_BIT/HASH_NUMBER with it")
            if (self.revisit_after and isinstance(self.generations, int)
                    and self.generations > 0 and self.period_ms < 1):
                problems.append("revisit_after / generations must be at least 1 ms, got %r s"
                                " / %r" % (self.revisit_after, self.generations))
        if (isinstance(self.generations, bool) or not isinstance(self.generations, int)
                or not 1 <= self.generations <= MAX_GENERATIONS):
            problems.append("generations must be an integer in 1..%d, got %r"
                            % (MAX_GENERATIONS, self.generations))
        if problems:
            raise InvalidFilterParameters("invalid Bloom filter parameters: " + "; ".join(problems))

    def _check_windows(self, problems: list[str]) -> None:
        """Named windows as one sorted tuple of pairs (JSON gives lists); their problems."""
        raw = self.windows
        if isinstance(raw, dict):
            raw = tuple(raw.items())
        try:
            pairs = tuple(sorted((name, value) for name, value in raw))
        except (TypeError, ValueError):
            problems.append("windows must be (name, seconds) pairs, got %r" % (raw,))
            return
        object.__setattr__(self, "windows", pairs)
        if len(pairs) > MAX_WINDOWS:
            problems.append("at most %d named revisit windows, got %d" % (MAX_WINDOWS,
                                                                           len(pairs)))
        names = [name for name, _ in pairs]
        for name, seconds in pairs:
            if not isinstance(name, str) or not WINDOW_NAME.match(name):
                problems.append("a revisit window's name is 1-40 letters, digits, '_', '.' or"
                                " '-', got %r" % (name,))
            elif name == DEFAULT_WINDOW:
                problems.append("the window %r is BLOOMFILTER_REVISIT_AFTER's: name the"
                                " others differently" % (DEFAULT_WINDOW,))
            if (isinstance(seconds, bool) or not isinstance(seconds, float | int)
                    or not math.isfinite(seconds) or seconds < 0):
                problems.append("revisit window %r must be seconds >= 0, got %r"
                                % (name, seconds))
            elif seconds and isinstance(self.generations, int) and self.generations > 0 \
                    and self._generation_ms(seconds) < 1:
                problems.append("revisit window %r / generations must be at least 1 ms"
                                % (name,))
        if len(set(names)) != len(names):
            problems.append("revisit window names must differ, got %s" % ", ".join(names))

    @property
    def windowed(self) -> bool:
        """Whether requests go into rings of generations (bloom_window.lua): a revisit
        window, or named windows."""
        return bool(self.revisit_after or self.windows)

    def _generation_ms(self, window: float) -> int:
        """A generation's span P = W / g in milliseconds (Redis TIME) for a window of
        ``window`` seconds; 0 for one that never forgets."""
        return round(window * 1000 / self.generations)

    @property
    def period_ms(self) -> int:
        """The default window's generation span, 0 without a window."""
        return self._generation_ms(self.revisit_after)

    def window_periods_ms(self) -> list[int]:
        """The named windows' generation spans, in their order (0: never forgotten)."""
        return [self._generation_ms(seconds) for _, seconds in self.windows]

    def window_flag(self, name: str | None) -> str:
        """The scripts' flag of a request in window ``name``: "0" the default window
        (None or "default"), "a" the first named one... :class:`UnknownWindow` (a
        ValueError naming the windows there are) for any other name."""
        if name is None or name == DEFAULT_WINDOW:
            return "0"
        for i, (known, _) in enumerate(self.windows):
            if known == name:
                return chr(97 + i)
        raise UnknownWindow(
            "no revisit window %r: BLOOMFILTER_REVISIT_WINDOWS has %s" % (
                name, ", ".join(repr(n) for n, _ in self.windows) or "none"))

    def shortest_window(self) -> float:
        """The shortest revisit window in seconds that forgets (0: nothing forgets)."""
        return shortest_window(self.revisit_after, self.windows)

    def generation_params(self) -> FilterParams:
        """What each generation of a revisit window is sized as: a growing filter at
        ``error_rate / (g + 1)``, so the g + 1 generations a lookup may meet compound
        to at most ``error_rate``. Every window's generations share this plan."""
        return replace(self, error_rate=self.error_rate / (self.generations + 1),
                       revisit_after=0, generations=defaults.FILTER_GENERATIONS, windows=())

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

    def differences(self, other: FilterParams, names: tuple[str, ...] | None = None,
                    overrides: dict[str, Any] | None = None) -> list[str]:
        """``name: stored X, asked for Y`` for each differing parameter (of ``names``).

        ``overrides``: values of ``other`` to take instead (compared as plain
        values, whether or not they would make valid parameters with the rest).
        """
        mine, theirs = asdict(self), {**asdict(other), **(overrides or {})}
        out = []
        for name in mine if names is None else names:
            a, b = mine[name], theirs[name]
            if isinstance(a, float) or isinstance(b, float):
                same = a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)
            else:
                same = a == b
            if not same:
                out.append("%s: stored %r, asked for %r" % (name, a, b))
        return out

    def layout_differences(self, other: FilterParams,
                           overrides: dict[str, Any] | None = None) -> list[str]:
        """Differences that would put bits or requests elsewhere: never opened as is."""
        return self.differences(other, LAYOUT_FIELDS, overrides)

    def sizing_differences(self, other: FilterParams,
                           overrides: dict[str, Any] | None = None) -> list[str]:
        """Differences in how slices are sized: a filter keeps its own."""
        return self.differences(other, tuple(
            name for name in self.__dataclass_fields__ if name not in LAYOUT_FIELDS), overrides)

    def plan(self) -> list[SlicePlan]:
        """Slice plans of one partition (of each generation of a window), slice 0 first."""
        if self.windowed:
            return self.generation_params().plan()
        if self.initial_capacity is None:
            return list(_plan(self))
        if self.backend == "redisbloom":
            return list(_redisbloom_plan(self))
        return list(_growing_plan(self))


@lru_cache(maxsize=64)
def _growing_plan(params: FilterParams) -> tuple[SlicePlan, ...]:
    # Any partition may get every item (a crawl of one host), so the slices to
    # reach the capacity are counted for one partition. They share (1 -
    # tightening) of the error equally: with slices growing geometrically, the
    # newest ones always hold most items, and an equal share keeps their bits
    # per item the same at every size.
    assert params.initial_capacity is not None
    first = min(params.initial_capacity, params.capacity)
    planned = _slices_to_hold(first, params.growth, params.capacity)
    if planned > MAX_PLANNED_SLICES:
        total = sum(params.growth**i for i in range(MAX_PLANNED_SLICES))
        first = math.ceil(params.capacity / total)
        planned = _slices_to_hold(first, params.growth, params.capacity)
    block_bytes = params.block_bits // 8
    chunk_blocks = params.chunk_bytes // block_bytes
    slices = []
    for i in range(max(MAX_SLICES, planned + OVERFLOW_SLICES)):
        capacity = max(1, int(first * params.growth**i))
        if i < planned:
            share = (1 - params.tightening) / planned
        else:
            share = (1 - params.tightening) * params.tightening ** (i - planned + 1)
        error = params.error_rate * share
        k, bits_per_item = size_slice(error, params.block_bits)
        blocks = max(1, math.ceil(capacity * bits_per_item / params.block_bits))
        # a chunk is one allocation: its last (or only) chunk gets the blocks that
        # fit in the size class it is given anyway, and the slice holds what they can
        full, last = divmod(blocks, chunk_blocks)
        if last:
            blocks = full * chunk_blocks + min(chunk_blocks, fill_allocation(last, block_bytes))
            capacity = max(capacity, int(blocks * params.block_bits / bits_per_item))
        slices.append(SlicePlan(capacity=capacity, error_rate=error, hashes=k, blocks=blocks))
    return tuple(slices)


@lru_cache(maxsize=64)
def _redisbloom_plan(params: FilterParams) -> tuple[SlicePlan, ...]:
    # BF.RESERVE <error> <first> EXPANSION <growth>: sub-filter i holds first *
    # growth**i items at error / 2**(i + 1), nominally error in all; measured, ten
    # nearly full ones gave 1.4 times it at 0.001. So slice 0's rate is what is
    # reserved, half the error rate (as a sized filter's always was), and so on.
    assert params.initial_capacity is not None
    first, slices = min(params.initial_capacity, params.capacity), []
    for i in range(MAX_SLICES):
        error = params.error_rate * (1 - params.tightening) * params.tightening**i
        capacity, bits_per_item = max(1, int(first * params.growth**i)), -math.log(error) / LN2_2
        slices.append(SlicePlan(capacity=capacity, error_rate=error,
                                hashes=max(1, math.ceil(math.log(2) * bits_per_item)),
                                blocks=max(1, math.ceil(capacity * bits_per_item / BLOCK_BITS))))
    return tuple(slices)


def _slices_to_hold(first: int, growth: float, capacity: int) -> int:
    held, count = 0, 0
    while held < capacity and count <= MAX_PLANNED_SLICES:
        held += max(1, int(first * growth**count))
        count += 1
    return count


@lru_cache(maxsize=64)
def _plan(params: FilterParams) -> tuple[SlicePlan, ...]:
    # Fingerprints split over partitions binomially: each partition gets four standard
    # deviations of headroom, so a filter holding its capacity has not grown yet.
    share = params.capacity / params.partitions
    per_partition = math.ceil(share + 4 * math.sqrt(share * (1 - 1 / params.partitions)))
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
        slices.append(SlicePlan(capacity=capacity, error_rate=error, hashes=k,
                                blocks=max(1, math.ceil(bits / params.block_bits))))
    return tuple(slices)
