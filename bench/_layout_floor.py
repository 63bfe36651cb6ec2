"""The bit layout's own floor for an item, and what another layout would cost in bits.

An item's k lanes are k bytes of its block (one bit each, in k lanes of the block:
``core/lua/bloom_common.lua``). Deciding a new one in Lua takes at the least: the
block's GETRANGE, its k bytes read and tested, the k changed bytes written back with the
bytes between them as one string, and that string's SETRANGE. A duplicate is confirmed
only by all k of its bits: the GETRANGE and the k bytes read and tested.
:func:`layout_probe` is that script unrolled for one k, with each lane's position taken
straight from a byte of the fingerprint (no hashing to compute, no slices, no counters;
lanes of whole bytes): what a script of this layout pays beyond the commands, the string
it must build.

A layout whose write is one short string built at once (the k bits in one 64- or
128-bit word, packed by ``struct``) would cost less in Lua, and more in memory: a block
of B bits holding k lanes of one bit errs more than one spread over the whole filter,
the more so at the low error rates the slices of a growing filter run at.
:func:`block_bits_per_url` computes it with the filter's own model
(``core.sizing.blocked_false_positive_rate``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import redis

from bloomcrawl.core.keys import state_key
from bloomcrawl.core.sizing import BLOCK_BITS, blocked_false_positive_rate

#: the error rates the table is computed at: the filter's, and the tighter ones its
#: slices run at as it grows (each slice shares the error rate with those before it)
TABLE_RATES = (1e-3, 1e-4, 1e-5)
#: block sizes in bits: words a script can pack in one string, and the filter's own
TABLE_BLOCKS = (64, 128, BLOCK_BITS)


def layout_probe(k: int, block_bytes: int, blocks: int, write: bool = True) -> str:
    """Lua deciding a batch of 20-byte fingerprints (ARGV[1]) in KEYS[1] (a chunk of
    ``blocks`` blocks): the least this bit layout does per item, unrolled for ``k``.
    Returns how many it wrote; without ``write``, how many it found with all k bits set
    (it writes nothing: the least a duplicate costs)."""
    w = block_bytes // k * 8  # whole bytes a lane: no two lanes share one
    lines = [
        "local byte, char, sub, f = string.byte, string.char, string.sub, string.format",
        "local blob, key, set = ARGV[1], KEYS[1], 0",
        "local MASK = {[0] = 128, 64, 32, 16, 8, 4, 2, 1}",
        "for j = 0, #blob / 20 - 1 do",
        "  local %s = byte(blob, j * 20 + 1, j * 20 + 20)" % ", ".join(
            "f%d" % i for i in range(20)),
        "  local off = ((f0 * 256 + f1) * 256 + f2) %% %d * %d" % (blocks, block_bytes),
        "  local blk = redis.call('GETRANGE', key, f('%%d', off), f('%%d', off + %d))"
        % (block_bytes - 1),
    ]
    for t in range(k):
        lines.append("  local p%d = %d + f%d %% %d" % (t, t * w, 3 + t % 17, w))
        lines.append("  local r%d = p%d %% 8" % (t, t))
        lines.append("  local b%d, m%d = (p%d - r%d) / 8 + 1, MASK[r%d]" % (t, t, t, t, t))
        lines.append("  local o%d = byte(blk, b%d)" % (t, t))
    every = " and ".join("o%d %% (m%d + m%d) >= m%d" % (t, t, t, t) for t in range(k))
    if not write:
        return "\n".join([*lines, "  if %s then set = set + 1 end" % every, "end", "return set"])
    lines.append("  if not (%s) then" % every)
    pieces = []
    for t in range(k):
        lines.append("    local n%d = o%d %% (m%d + m%d) >= m%d and o%d or o%d + m%d"
                     % (t, t, t, t, t, t, t, t))
        pieces.append("char(n%d)" % t)
        if t < k - 1:
            pieces.append("sub(blk, b%d + 1, b%d - 1)" % (t, t + 1))
    lines += ["    redis.call('SETRANGE', key, f('%%d', off + b0 - 1), %s)" % " .. ".join(pieces),
              "    set = set + 1",
              "  end",
              "end",
              "return set"]
    return "\n".join(lines)


def block_bits_per_url(block: int, rate: float) -> float:
    """The fewest bits per URL (to 0.1, over k) at which blocks of ``block`` bits meet
    ``rate``."""
    tenths = int(10 * math.log2(1 / rate) / math.log(2))  # one unblocked filter's, fewer
    while True:
        bits = tenths / 10
        if any(blocked_false_positive_rate(bits, k, block) <= rate
               for k in range(1, min(block, 32) + 1)):
            return bits
        tenths += 1


def layout_table() -> list[list[str]]:
    """Per block size: the bits per URL it needs at each of TABLE_RATES, and over the
    filter's own blocks."""
    own = {rate: block_bits_per_url(TABLE_BLOCKS[-1], rate) for rate in TABLE_RATES}
    rows = []
    for block in TABLE_BLOCKS:
        cells = [f"{block} bits" + (" (bloomcrawl's)" if block == TABLE_BLOCKS[-1] else "")]
        for rate in TABLE_RATES:
            bits = block_bits_per_url(block, rate)
            cells.append(f"{bits:.1f} ({bits / own[rate]:.2f}x)")
        rows.append(cells)
    return rows


#: a slice below the newest is read whole by a call when it is no larger than this many
#: bytes per lookup the call still expects in it (bloom_common.lua's WHOLE_READ_BYTES)
WHOLE_READ_BYTES = 2048


def read_by_block(slice_bytes: int, batch: int) -> bool:
    """Whether a call of ``batch`` items reads a slice below the newest a block at a time
    (the rule at a call's start: every item still to decide may look in it)."""
    return slice_bytes > batch * WHOLE_READ_BYTES


class BlockReads(NamedTuple):
    """The block reads (GETRANGEs) a grown filter's lookups cannot avoid, per item."""

    new: float  # per new item, averaged over the filter's filling from empty
    duplicate: float  # per duplicate of an item held, drawn evenly from those held


def block_reads(client: redis.Redis, key: str, partitions: int, batch: int) -> BlockReads:
    """What a filter's lookups must read block by block, from its partitions' stored slices.

    A new item is looked up in every slice; a duplicate in the slices holding most items
    first, until the one that holds it (bloom_common.lua's order). The newest slice is
    read a block at a time; an older one only when :func:`read_by_block`. Reading whole
    is counted as free, so this is a floor.
    """
    new_reads = dup_reads = held = 0.0
    for p in range(partitions):
        state = {k.decode(): v.decode() for k, v in client.hgetall(state_key(key, p)).items()}
        n, block_bytes = int(state["slices"]), int(state["block_bytes"])
        plans = [[int(x) for x in state[f"plan:{i}"].split()] for i in range(n)]  # cap k blocks
        items = [int(state.get(f"items:{i}", 0)) for i in range(n)]
        large = [read_by_block(blocks * block_bytes, batch) for _, _, blocks in plans]
        # while slice m was the newest: it, and the large slices before it
        new_reads += sum(items[m] * (1 + sum(large[:m])) for m in range(n))
        order = list(range(n - 1, -1, -1))
        if n > 1 and items[n - 1] < plans[n - 2][0]:
            order[0], order[1] = order[1], order[0]
        reads = 0
        for i in order:
            reads += 1 if large[i] or i == n - 1 else 0
            dup_reads += items[i] * reads
        held += sum(items)
    return BlockReads(new=new_reads / held if held else 0.0,
                      duplicate=dup_reads / held if held else 0.0)
