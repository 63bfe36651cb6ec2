"""The servers holding the cluster's data: each master of a Redis Cluster, or the one Redis.

What :mod:`bloomcrawl.ops.inspection` needs to know of them apart from any
spider: their names (``host:port``, the exporter's ``node`` label), which one
holds a key, their memory and key counts, Redis's clock, and which failures
mean Redis itself is out of reach rather than one spider's keys being wrong.
A single Redis is a cluster of one master, named the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import ClusterError, RedisClusterException

from bloomcrawl.core.connection import REDIS_ERRORS, describe_redis, is_cluster, redis_errors
from bloomcrawl.core.errors import RedisUnavailableError

#: what means Redis itself is gone (the whole snapshot fails), not one spider's keys:
#: on a cluster also CLUSTERDOWN/MASTERDOWN replies and a slot no master serves
UNREACHABLE = (RedisUnavailableError, redis.ConnectionError, redis.TimeoutError, ClusterError,
               RedisClusterException)


@dataclass
class RedisMemory:
    """``INFO memory`` figures, in bytes; ``max_bytes`` is 0 when no maxmemory is set."""

    used_bytes: int
    max_bytes: int
    peak_bytes: int


@dataclass
class RedisNode:
    """One server holding data: a master of a cluster, or the one Redis.

    ``name`` is ``host:port`` (a Unix socket's path). A server that did not
    answer this pass has ``up`` False, ``error`` saying why, and no figures.
    """

    name: str
    up: bool
    memory: RedisMemory | None = None
    #: keys it holds (``DBSIZE``)
    keys: int | None = None
    error: str | None = None
    #: what it raised, for :func:`~bloomcrawl.ops.inspection.snapshot` to raise again
    exception: BaseException | None = field(default=None, repr=False, compare=False)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@contextmanager
def reachable(client: redis.Redis) -> Iterator[None]:
    """:func:`~bloomcrawl.core.connection.redis_errors`, and a cluster client's own
    failures (no master serves a slot, no node answers: not RedisErrors) alike."""
    try:
        with redis_errors(client):
            yield
    except RedisClusterException as exc:
        raise RedisUnavailableError(
            "cannot reach Redis Cluster at %s: %s" % (describe_redis(client), exc)) from exc


def unless_unreachable(replies: list[Any]) -> list[Any]:
    """The replies of a pipeline run with ``raise_on_error=False``, unless one says that
    Redis (a master, the cluster) is out of reach: then that error is raised."""
    for reply in replies:
        if isinstance(reply, UNREACHABLE):
            raise reply
    return replies


def node_name(client: redis.Redis) -> str:
    """``host:port`` of a single Redis (a Unix socket's path): the ``node`` label."""
    kwargs = getattr(client, "connection_pool", None)
    kwargs = getattr(kwargs, "connection_kwargs", {})
    if "path" in kwargs:
        return str(kwargs["path"])
    return "%s:%s" % (kwargs.get("host", "localhost"), kwargs.get("port", 6379))


def masters(client: redis.Redis) -> list[tuple[str, dict[str, Any]]]:
    """``(host:port, call options)`` of each server holding data: every master of a
    cluster (as the client's slot map has them now), or the one Redis."""
    if not is_cluster(client):
        return [(node_name(client), {})]
    primaries = sorted(client.get_primaries(), key=lambda node: node.name)  # type: ignore[attr-defined]
    return [(node.name, {"target_nodes": node}) for node in primaries]


def key_owner(client: redis.Redis) -> Callable[[str], str]:
    """A function naming the master (``host:port``) that holds a key."""
    if not is_cluster(client):
        name = node_name(client)
        return lambda key: name
    nodes = client.nodes_manager  # type: ignore[attr-defined]
    return lambda key: str(nodes.get_node_from_slot(client.keyslot(key)).name)  # type: ignore[attr-defined]


def redis_time_ms(client: redis.Redis) -> int:
    """Redis's clock in milliseconds (lease deadlines use it; on a cluster, one master's)."""
    with reachable(client):
        seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def redis_nodes(client: redis.Redis) -> list[RedisNode]:
    """``INFO memory`` and ``DBSIZE`` of each master (of the one Redis), by name.

    A master that fails is returned with ``up`` False; this never raises for one
    server's failure, so the others are still reported.
    """
    out = []
    for name, target in masters(client):
        try:
            with reachable(client):
                info = client.info("memory", **target)
                count = client.dbsize(**target)
        except REDIS_ERRORS as exc:
            out.append(RedisNode(name, up=False, error=str(exc) or type(exc).__name__,
                                 exception=exc))
            continue
        out.append(RedisNode(name, up=True, keys=_int(count), memory=RedisMemory(
            used_bytes=_int(info.get("used_memory")),
            max_bytes=_int(info.get("maxmemory")),
            peak_bytes=_int(info.get("used_memory_peak")),
        )))
    return out


def total_memory(nodes: Sequence[RedisNode]) -> RedisMemory:
    """The memory of the masters that answered, summed; ``max_bytes`` 0 if any is unlimited."""
    up = [node.memory for node in nodes if node.memory is not None]
    limits = [memory.max_bytes for memory in up]
    return RedisMemory(
        used_bytes=sum(memory.used_bytes for memory in up),
        max_bytes=0 if not limits or 0 in limits else sum(limits),
        peak_bytes=sum(memory.peak_bytes for memory in up),
    )
