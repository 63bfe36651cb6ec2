"""A Bloom filter's size and fill, read from the counters its scripts keep.

Read-only and cheap whatever the filter holds: the bitmap backend's figures
come from each partition's exact counters (``bits_set:<i>``, ``items:<i>``)
and the chunks' lengths, never a ``BITCOUNT``; the RedisBloom backend's from
``BF.INFO``, where bits set and the false-positive rate are estimates.
:meth:`bloomcrawl.core.bloom.BloomFilter.info` is the usual way in.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from bloomcrawl.core import keys
from bloomcrawl.core.connection import redis_errors
from bloomcrawl.core.sizing import LN2_2, FilterParams, SlicePlan, blocked_false_positive_rate


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


#: one growing filter of a partition: its state, and the name of chunk c of slice s
_Unit = tuple[dict[bytes, bytes], Callable[[int, int], str]]


def partition_filters(server: redis.Redis, key: str, params: FilterParams,
                      states: list[dict[bytes, bytes]]
                      ) -> tuple[list[list[_Unit]], list[int]]:
    """Per partition (its state in ``states``), the growing filters it holds: itself, or
    for revisit windows the generations of every ring still in its window at Redis's
    TIME; and per partition the duplicates counted by generations out of the window, not
    retired yet.
    """
    if not params.windowed:
        return ([[(state, functools.partial(keys.chunk_key, key, p))]
                 for p, state in enumerate(states)], [0] * len(states))
    seconds, micros = server.time()
    now_ms = seconds * 1000 + micros // 1000
    # every ring: the default window's (0) and the named windows' (1..)
    rings = list(enumerate([params.period_ms, *params.window_periods_ms()]))
    listed = [[(r, int(g)) for r, _ in rings
               for g in state.get(keys.generations_field(r).encode(), b"").split()]
              for state in states]
    pipe = server.pipeline(transaction=False)
    for p, gens in enumerate(listed):
        for r, g in gens:
            pipe.hgetall(keys.generation_state_key(key, p, g, r))
    replies = iter(pipe.execute())
    current = {r: now_ms // period if period else 0 for r, period in rings}
    units: list[list[_Unit]] = []
    retired_filtered = [0] * len(states)
    for p, gens in enumerate(listed):
        part: list[_Unit] = []
        for r, g in gens:
            generation: dict[bytes, bytes] = next(replies)
            if g >= current[r] - params.generations:
                part.append((generation, functools.partial(keys.generation_chunk_key, key, p, g,
                                                           window=r)))
            else:  # out of the window, not retired yet: only its duplicates count
                retired_filtered[p] += int(generation.get(b"filtered", 0))
        units.append(part)
    return units, retired_filtered


def filter_info(server: redis.Redis, key: str, params: FilterParams) -> BloomInfo:
    """The figures of filter ``key``, created with ``params``, by its backend."""
    if params.backend == "redisbloom":
        return redisbloom_info(server, key, params)
    return bitmap_info(server, key, params)


def bitmap_info(server: redis.Redis, key: str, params: FilterParams) -> BloomInfo:
    """Size and fill from the exact counters (no BITCOUNT), summed over partitions."""
    computed = params.plan()
    chunk_blocks = params.chunk_bytes // (params.block_bits // 8)

    def stored_plan(state: dict[bytes, bytes], s: int) -> SlicePlan:
        """The plan the scripts use is the one stored with the partition."""
        raw = state.get(b"plan:%d" % s)
        if raw is None:
            return computed[s]
        capacity, hashes, blocks = (int(x) for x in raw.split())
        return SlicePlan(capacity, computed[s].error_rate, hashes, blocks)

    with redis_errors(server):
        pipe = server.pipeline(transaction=False)
        for p in range(params.partitions):
            pipe.hgetall(keys.state_key(key, p))
        states = pipe.execute()
        units, retired_filtered = partition_filters(server, key, params, states)
        pipe = server.pipeline(transaction=False)
        for part in units:
            for state, chunk_key in part:
                for s in range(int(state.get(b"slices", 1))):
                    for c in range(math.ceil(stored_plan(state, s).blocks / chunk_blocks)):
                        pipe.strlen(chunk_key(s, c))
        memory = sum(pipe.execute())
    bits = bits_set = items = checked = filtered = 0
    fp_sum = 0.0
    slices_per_partition = []
    slice_capacity = 0
    filtered = sum(retired_filtered)
    for state, part in zip(states, units, strict=True):
        # a window's duplicates found in older generations, and those of retired ones
        filtered += int(state.get(b"filtered", 0)) if params.windowed else 0
        miss = 1.0
        most_slices = 0
        for unit, _ in part:
            nslices = int(unit.get(b"slices", 1))
            most_slices = max(most_slices, nslices)
            for s in range(nslices):
                sp = stored_plan(unit, s)
                s_items = int(unit.get(b"items:%d" % s, 0))
                bits += sp.bits
                slice_capacity += sp.capacity
                bits_set += int(unit.get(b"bits_set:%d" % s, 0))
                items += s_items
                if s_items:
                    miss *= 1 - blocked_false_positive_rate(sp.bits / s_items, sp.hashes,
                                                            params.block_bits)
            filtered += int(unit.get(b"filtered", 0))
        slices_per_partition.append(most_slices or 1)
        fp_sum += 1 - miss
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


def redisbloom_info(server: redis.Redis, key: str, params: FilterParams) -> BloomInfo:
    """BF.INFO per partition; bits set and false-positive rate are estimates here."""
    k, _ = module_hashes(params.plan()[0].error_rate)
    with redis_errors(server):
        pipe = server.pipeline(transaction=False)
        for p in range(params.partitions):
            pipe.hgetall(keys.state_key(key, p))
            pipe.execute_command("BF.INFO", keys.redisbloom_key(key, p))  # type: ignore[no-untyped-call]
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
        if params.initial_capacity is None or slices[-1] == 1:
            fp_sum += (part_set / m) ** k if m else 0.0
        else:
            fp_sum += chain_false_positives(params, slices[-1], n)
        filtered += int(state.get(b"filtered", 0))
    checked = items + filtered
    return BloomInfo(
        capacity=params.capacity, error_rate=params.error_rate, hashes=k, bits=bits,
        bits_set=bits_set, fill_ratio=bits_set / bits if bits else 0.0, items=items,
        estimated_false_positive_rate=fp_sum / params.partitions, slices=max(slices),
        memory_bytes=memory, partitions=params.partitions, checked=checked,
        filtered=filtered, slice_capacity=capacity, partition_slices=slices)


def chain_false_positives(params: FilterParams, links: int, items: int) -> float:
    """The estimated false-positive rate of a grown RedisBloom chain of ``links``
    sub-filters holding ``items``: those before the newest full, each at its own rate
    (half its plan's: the module halves what it is reserved with), the newest at its fill.
    One k for the whole chain, as above, would take the full old sub-filters for as
    empty as the newest."""
    plan = params.plan()
    rate, left = 0.0, items
    for i in range(min(links, len(plan))):
        held = plan[i].capacity if i < links - 1 else max(0, left)
        left -= held
        k, bits_per_item = module_hashes(plan[i].error_rate / 2)
        rate += (1 - math.exp(-k * held / (plan[i].capacity * bits_per_item))) ** k
    return min(1.0, rate)


def module_hashes(error_rate: float) -> tuple[int, float]:
    """The hashes and bits per item of an unblocked filter at ``error_rate``, as the
    module sizes its sub-filters."""
    bits_per_item = -math.log(error_rate) / LN2_2
    return max(1, math.ceil(math.log(2) * bits_per_item)), bits_per_item
