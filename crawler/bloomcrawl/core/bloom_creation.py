"""Creating a Bloom filter in Redis, or opening the one there: what the metadata says.

A filter's parameters are written once (``HSETNX``) and every opener compares
its own with them. The stored ones win: an opener asking for other sizing
(capacity, error rate, growth...) uses the stored filter and logs what
differed, since the stored plan is what its bits were written with; other
partitions, partitioning, bit layout or backend would put bits and requests
elsewhere, and is an error (:class:`~bloomcrawl.core.errors.FilterMismatchError`),
as is any difference when the opener asks to be strict. Each partition's plan follows
from the parameters, so any opener can write it again, idempotently;
``ready`` is set last, once the partitions exist.
:class:`bloomcrawl.core.bloom.BloomFilter` is the usual way in.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.connection import describe_redis, is_cluster, redis_errors
from bloomcrawl.core.errors import BloomFilterError, FilterMismatchError
from bloomcrawl.core.sizing import REDISBLOOM_TIGHTENING, FilterParams

logger = logging.getLogger(__name__)


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


#: what the redisbloom backend runs, each asked so that it changes nothing: an error rate
#: out of range, NOCREATE, and lookups, all on a key of the filter's that is never made
_REDISBLOOM_PROBES = (("BF.RESERVE", "2", "1"), ("BF.INSERT", "NOCREATE", "ITEMS", "x"),
                      ("BF.MEXISTS", "x"), ("BF.INFO",))


def redisbloom_refused(server: Any, key: str) -> list[str]:
    """The bf commands the client's Redis user may not run (its ACL: the roles of
    docs/scale.md list none, since a Redis without the module refuses their names)."""
    probe = keys.partition_tag(key, 0) + ":bf-acl-probe"
    refused = []
    for command, *args in _REDISBLOOM_PROBES:
        try:
            server.execute_command(command, probe, *args)
        except redis.exceptions.NoPermissionError:
            refused.append(command)
        except redis.ResponseError:
            pass  # allowed: refused for its arguments, or the missing key
    return refused


def check_redisbloom(server: Any, key: str) -> None:
    """:class:`BloomFilterError` unless the bf module is loaded and the client's user may
    run what the redisbloom backend runs; before anything is stored."""
    if not has_redisbloom(server):
        raise BloomFilterError(
            "Bloom filter %r uses the redisbloom backend, but Redis at %s has no bf"
            " module loaded" % (key, describe_redis(server)))
    if refused := redisbloom_refused(server, key):
        raise BloomFilterError("Bloom filter %r uses the redisbloom backend, but at %s %s" % (
            key, describe_redis(server), grant_text(refused)))


def grant_text(refused: list[str]) -> str:
    return "its ACL user may not run %s (grant %s)" % (
        ", ".join(refused), " ".join("+" + c.lower() for c in refused))


def resolve_auto_backend(server: redis.Redis, key: str,
                         params: FilterParams) -> tuple[FilterParams, bool]:
    """auto: an existing filter keeps its backend; a new one uses RedisBloom if loaded
    and the client's user may run it. With the parameters, whether that was checked here
    (:func:`check_redisbloom`'s round trips, which the opener need not run again).

    Either backend starts a new filter small and grows it (``initial_capacity``).
    An existing filter's backend is never a mismatch under auto: asked sizing that
    only the other backend has (BLOOMFILTER_BIT, a growth that is not an integer)
    is a sizing difference, logged when the filter is opened with its own.
    """
    with redis_errors(server):
        raw = server.hget(keys.meta_key(key), "params")
        if raw is not None:
            try:
                stored = json.loads(raw).get("backend", "bitmap")
            except (ValueError, AttributeError):
                return params, False
        else:
            # a revisit window is the bitmap backend's alone
            stored = ("redisbloom" if has_redisbloom(server) and not params.windowed
                      else "bitmap")
            if stored == "redisbloom" and (refused := redisbloom_refused(server, key)):
                logger.warning(
                    "Bloom filter %r: Redis at %s has the bf module, but %s: the new filter"
                    " uses the bitmap backend (BLOOMFILTER_BACKEND=bitmap asks for it)",
                    key, describe_redis(server), grant_text(refused))
                stored = "bitmap"
    checked = raw is None and stored == "redisbloom"
    if stored == params.backend:
        return params, checked
    changes: dict[str, Any] = {"backend": stored}
    if stored == "redisbloom":
        changes["tightening"] = REDISBLOOM_TIGHTENING
        if params.bit_exponent is not None or float(params.growth) != int(params.growth):
            if raw is None:
                return params, False  # cannot: a new filter stays on the bitmap backend
            # the stored RedisBloom filter is opened with its own sizing, as any
            # other difference in sizing would be
            own = parse_stored_params(server, key, raw)
            changes.update(bit_exponent=None, hashes=None, growth=own.growth,
                           initial_capacity=own.initial_capacity)
            logger.warning(
                "Bloom filter %r at %s is a RedisBloom filter, made with growth %s: asked"
                " for %s, which only bitmap filters have; it is opened with its own", key,
                describe_redis(server), own.growth,
                "BLOOMFILTER_BIT=%s and BLOOMFILTER_HASH_NUMBER=%s" % (
                    params.bit_exponent, params.hashes)
                if params.bit_exponent is not None else "growth %s" % (params.growth,))
    else:
        changes["tightening"] = defaults.FILTER_TIGHTENING
    return dataclasses.replace(params, **changes), checked


def parse_stored_params(server: redis.Redis, key: str, raw: bytes | str) -> FilterParams:
    """The parameters stored in the meta hash; unreadable ones are an error naming the key."""
    try:
        return FilterParams.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise FilterMismatchError(
            "Bloom filter %r at %s has unreadable metadata (%s); it was not written by"
            " this version of bloomcrawl" % (key, describe_redis(server), exc)
        ) from exc


def create_or_open(server: redis.Redis, key: str, params: FilterParams, *,
                   adopt_partition_by: bool = False,
                   adopt_initial_capacity: bool = False,
                   strict: bool = False,
                   rewrite_partitions: bool = False,
                   redisbloom_checked: bool = False) -> FilterParams:
    """Store ``params`` unless the filter has some already; the parameters it has.

    Stored parameters that differ in partitions, partitioning, bit layout or
    backend (or in anything, when ``strict``) raise :class:`FilterMismatchError`
    and touch nothing; other sizing is the stored one, and what differed is
    logged.
    ``adopt_partition_by``, ``adopt_initial_capacity``: take the stored value
    rather than compare it (the opener did not choose one).
    ``redisbloom_checked``: the opener ran :func:`check_redisbloom` on this server already.
    """
    meta = keys.meta_key(key)
    with redis_errors(server):
        new = params.backend == "redisbloom" and server.hget(meta, "params") is None
        if new and not redisbloom_checked:  # before anything is stored
            check_redisbloom(server, key)
        server.hsetnx(meta, "params", params.to_json())
        stored_raw = server.hget(meta, "params")
    assert stored_raw is not None
    stored = parse_stored_params(server, key, stored_raw)
    # the hashing is never the opener's choice: a filter keeps the one it was made with
    adopted: dict[str, Any] = {"hashing": stored.hashing}
    if adopt_partition_by:
        adopted["partition_by"] = stored.partition_by
    if adopt_initial_capacity:
        adopted["initial_capacity"] = stored.initial_capacity
    layout = stored.layout_differences(params, adopted)
    sizing = stored.sizing_differences(params, adopted)
    if layout or (strict and sizing):
        raise FilterMismatchError(
            "Bloom filter %r at %s exists with other parameters (%s); its bits were left"
            " untouched. Use the stored parameters, another key, or clear the filter."
            % (key, describe_redis(server), "; ".join(layout + sizing))
        )
    if stored.backend == "redisbloom" and not new and not redisbloom_checked:
        with redis_errors(server):
            check_redisbloom(server, key)
    if sizing:
        logger.warning(
            "Bloom filter %r at %s was created with other sizing (%s): it is opened with"
            " its own, which its bits were written with (BLOOMFILTER_STRICT_PARAMS=True"
            " makes this an error)", key, describe_redis(server), "; ".join(sizing))
    write_partitions(server, key, stored, force=rewrite_partitions)
    return stored


def write_partitions(server: redis.Redis, key: str, params: FilterParams,
                     force: bool = False) -> None:
    """Write each partition's plan; idempotent, since it follows from the parameters."""
    plan = params.plan()
    block_bytes = params.block_bits // 8
    fields: dict[str, Any] = {
        "block_bytes": block_bytes,
        "chunk_blocks": params.chunk_bytes // block_bytes,
        "max_slices": len(plan),
        "slices": 1,
        "filtered": 0,
        "hashing": params.hashing,
    }
    if params.windowed:
        # the template of the generations (bloom_window.lua): their plan, above, and
        # the window; the live generations are listed in 'gens' as they are made. Named
        # windows: their spans in 'windows' (0: never forgotten), each ring's in 'gens:<i>'
        fields.update(period_ms=params.period_ms, generations=params.generations, gens="",
                      windows=" ".join(map(str, params.window_periods_ms())))
        for i in range(1, len(params.windows) + 1):
            fields[keys.generations_field(i)] = ""
    for i, s in enumerate(plan):
        fields["plan:%d" % i] = "%d %d %d" % (s.capacity, s.hashes, s.blocks)
    with redis_errors(server):
        if not force and server.hget(keys.meta_key(key), "ready") == b"1":
            return
        recovered: dict[int, dict[str, Any]] = {}
        if force and params.backend == "bitmap":
            pipe = server.pipeline(transaction=False)
            for p in range(params.partitions):
                pipe.exists(keys.state_key(key, p))
            for p, exists in enumerate(pipe.execute()):
                if not exists:
                    recovered[p] = (recover_generations(server, key, params, p)
                                    if params.windowed
                                    else recover_counters(server, key, params, p))
        pipe = server.pipeline(transaction=False)
        for p in range(params.partitions):
            state = keys.state_key(key, p)
            for name, value in {**fields, **recovered.get(p, {})}.items():
                pipe.hsetnx(state, name, value)
        pipe.execute()
        if params.backend == "redisbloom":
            first = plan[0]
            for p in range(params.partitions):
                try:
                    server.execute_command(  # type: ignore[no-untyped-call]
                        "BF.RESERVE", keys.redisbloom_key(key, p),
                        repr(first.error_rate), first.capacity,
                        "EXPANSION", int(params.growth))
                except redis.ResponseError as exc:
                    if "exists" not in str(exc).lower():
                        raise
        server.hset(keys.meta_key(key), "ready", 1)


def recover_generations(server: redis.Redis, key: str, params: FilterParams,
                        partition: int) -> dict[str, str]:
    """The live generations of a windowed partition whose state was lost: those whose
    own state is still there, in each ring (a SCAN of the partition's keys, on this
    rare path only).

    Without them the generations would never be looked in nor retired; those out of
    the window are retired by the next call.
    """
    recovered = {}
    for window in range(len(params.windows) + 1):
        found = set()
        marker = keys.generation_state_key(key, partition, 0, window)[:-len("0:state")]
        for name in server.scan_iter(match=keys.generation_pattern(key, partition, window),
                                     count=1000):
            text = name.decode() if isinstance(name, bytes) else name
            if not text.startswith(marker) or not text.endswith(keys.STATE_SUFFIX):
                continue
            number = text[len(marker):-len(keys.STATE_SUFFIX)]
            if number.isdigit():
                found.add(int(number))
        if found:
            recovered[keys.generations_field(window)] = " ".join(str(g) for g in sorted(found))
    return recovered


def recover_counters(server: redis.Redis, key: str, params: FilterParams,
                     partition: int) -> dict[str, int]:
    """The counters of a partition whose state was lost (evicted, deleted) but whose bits
    were not: its slices are those with chunks, every one but the newest full.

    Without them the partition would go on in its first slice, overfilling it and
    no longer looking in the others. Bits set are counted again (``BITCOUNT``, a
    rare path); the newest slice's items are estimated from its bits set.
    """
    plan = params.plan()
    chunk_blocks = params.chunk_bytes // (params.block_bits // 8)
    counters: dict[str, int] = {}
    newest = -1
    for i, s in enumerate(plan):
        chunks = [keys.chunk_key(key, partition, i, c)
                  for c in range(-(-s.blocks // chunk_blocks))]
        if not server.exists(*chunks):
            break
        newest = i
        pipe = server.pipeline(transaction=False)
        for chunk in chunks:
            pipe.bitcount(chunk)
        counters["bits_set:%d" % i] = sum(pipe.execute())
    if newest < 0:
        return {}
    for i in range(newest):
        counters["items:%d" % i] = plan[i].capacity
    s = plan[newest]
    lane_bits = s.blocks * (params.block_bits // s.hashes) * s.hashes
    fill = min(counters["bits_set:%d" % newest] / lane_bits, 1 - 1e-9)
    counters["items:%d" % newest] = min(s.capacity, round(-lane_bits / s.hashes
                                                          * math.log(1 - fill)))
    counters["slices"] = newest + 1
    return counters
