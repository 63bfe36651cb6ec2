"""The Lua scripts and the one way they are run.

Scripts are called by SHA. :func:`run_scripts` sends a batch of calls in one
pipeline (one round trip) and has one partial-failure policy: a call that
did nothing because Redis lost its script cache (NOSCRIPT, after a restart)
or because its filter partition was missing (``BLOOMCRAWL_NOFILTER``, the
filter was deleted) is sent again, once, after the cause was mended. Calls
that succeeded are never sent twice: their effects already happened.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis
from redis.crc import key_slot

from bloomcrawl.core.errors import FilterFullError

if TYPE_CHECKING:
    from redis.client import Pipeline

#: error prefix the bitmap and RedisBloom preludes reply with when a partition is missing
NOFILTER = "BLOOMCRAWL_NOFILTER"
#: error prefix of a partition whose last slice is full (it refuses, never answers "seen")
FULL = "BLOOMCRAWL_FULL"
BACKEND_PRELUDES = {"bitmap": "bloom_common.lua", "redisbloom": "redisbloom_common.lua"}
#: a revisit window's decide() and check() over generations (bitmap backend only)
WINDOW_PRELUDE = "bloom_window.lua"


@cache
def load_lua(*names: str) -> str:
    """The concatenated source of scripts in ``bloomcrawl/core/lua``."""
    base = resources.files("bloomcrawl.core") / "lua"
    return "\n".join((base / name).read_text() for name in names)


class Script:
    """A Lua script called by SHA."""

    def __init__(self, *names: str) -> None:
        self.source = load_lua(*names)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    @classmethod
    def for_backend(cls, backend: str, *names: str, windowed: bool = False) -> Script:
        """A partition script: the filter backend's prelude (and, for a filter with a
        revisit window, the window's), then ``names``."""
        if windowed:
            return cls(BACKEND_PRELUDES[backend], WINDOW_PRELUDE, *names)
        return cls(BACKEND_PRELUDES[backend], *names)

    def queue(self, pipe: Pipeline, keys: Sequence[str], args: Sequence[Any],
              command: str = "EVALSHA") -> None:
        pipe.execute_command(command, self.sha, len(keys), *keys, *args,  # type: ignore[no-untyped-call]
                             **_route(pipe, keys))


def _route(pipe: Any, keys: Sequence[str]) -> dict[str, Any]:
    """On Redis Cluster, the master owning the call's slot (its keys share one).

    redis-py 8's cluster pipeline otherwise asks a node ``COMMAND GETKEYS``
    for each queued EVALSHA, one round trip each, all to the same node. A
    stale slot map is harmless: the owner answers MOVED or ASK and redis-py
    sends the call again by its keys.
    """
    nodes = getattr(pipe, "nodes_manager", None)
    if nodes is None or not keys:
        return {}
    key = keys[0].encode() if isinstance(keys[0], str) else keys[0]
    return {"target_nodes": nodes.get_node_from_slot(key_slot(key))}


@dataclass(frozen=True)
class ScriptCall:
    script: Script
    keys: Sequence[str]
    args: Sequence[Any]


def is_missing_filter(reply: Any) -> bool:
    return isinstance(reply, redis.ResponseError) and NOFILTER in str(reply)


def run_scripts(
    client: Any,
    calls: Sequence[ScriptCall],
    *,
    also: Callable[[Pipeline], None] | None = None,
    recreate_filter: Callable[[], None] | None = None,
    read_only: bool = False,
    whole: bool = False,
) -> list[Any]:
    """Run ``calls`` in order in one pipeline and return their replies.

    ``also`` queues plain commands after the calls, in the same round trip
    (their replies are not returned and they are never sent twice).
    ``recreate_filter``, when given, is called once if a call found its
    filter partition missing; those calls are then sent again. Any other
    error reply is raised after every call has been tried. ``read_only``
    scripts go as EVALSHA_RO: a user whose keys are read-only (``%R~``) may
    run them.

    ``whole``: on one Redis the calls go in one MULTI/EXEC, so that no
    snapshot (BGSAVE, the AOF, a replica) and no client's death holds some
    of them and not the others. Redis runs a pipeline's calls as it reads
    them, and reads at most 16 KiB at a time. (Redis Cluster has no
    transaction across slots: there a worker sends again what a failover
    may have lost.) The calls sent again after NOSCRIPT or a missing filter
    go in a second transaction: the first ran without them.
    """
    command = "EVALSHA_RO" if read_only else "EVALSHA"
    if len(calls) == 1 and also is None and not read_only:
        return [_run_one(client, calls[0], recreate_filter)]
    whole = whole and not isinstance(client, redis.cluster.RedisCluster)
    pipe = client.pipeline(transaction=whole)
    for call in calls:
        call.script.queue(pipe, call.keys, call.args, command)
    if also is not None:
        also(pipe)
    replies = list(pipe.execute(raise_on_error=False))
    results = replies[: len(calls)]
    unloaded = [i for i, r in enumerate(results) if isinstance(r, redis.exceptions.NoScriptError)]
    no_filter = [i for i, r in enumerate(results) if is_missing_filter(r)]
    if recreate_filter is None:
        no_filter = []
    if no_filter:
        recreate_filter()  # type: ignore[misc]
    again = sorted(set(unloaded) | set(no_filter))
    if again:
        for script in {calls[i].script for i in unloaded}:
            client.script_load(script.source)
        pipe = client.pipeline(transaction=whole)
        for i in again:
            calls[i].script.queue(pipe, calls[i].keys, calls[i].args, command)
        for i, reply in zip(again, pipe.execute(raise_on_error=False), strict=True):
            results[i] = reply
    for reply in replies[len(calls):]:
        if isinstance(reply, Exception):
            raise reply
    for reply in results:
        if isinstance(reply, Exception):
            raise _our_error(reply)
    return results


def load_scripts(client: Any, scripts: Sequence[Script]) -> None:
    """Put ``scripts`` in one Redis's script cache, in one round trip.

    Before the calls of a ``whole`` :func:`run_scripts` are due: a call
    refused for NOSCRIPT would go in a transaction of its own, after the others.
    """
    pipe = client.pipeline(transaction=False)
    for script in scripts:
        pipe.script_load(script.source)
    pipe.execute()


#: what a worker logs when its Redis user may not run MULTI/EXEC
NO_TRANSACTIONS = (
    "the Redis user may not run MULTI and EXEC: an exchange's calls go one by one, so a"
    " snapshot, an AOF cut short or a failover that falls between them may keep a page's"
    " ack and lose its links; grant the worker's user +multi +exec (docs/scale.md, \"ACL"
    " users, one per role\")")


def transactions_allowed(client: Any) -> bool:
    """Whether the client's Redis user may run MULTI/EXEC on one Redis, for a ``whole``
    :func:`run_scripts` (asked with a PING in one: refused, the PING runs outside it)."""
    pipe = client.pipeline(transaction=True)
    pipe.ping()
    try:
        pipe.execute()
    except redis.exceptions.NoPermissionError:  # MULTI refused
        return False
    except redis.exceptions.ExecAbortError as exc:  # EXEC refused
        if "NOPERM" in str(exc):
            return False
        raise
    return True


def _our_error(reply: Exception) -> Exception:
    """The error bloomcrawl defines for a reply its scripts send, else the reply itself."""
    text = str(reply)
    if isinstance(reply, redis.ResponseError) and text.startswith(FULL):
        # drop Redis's " script: <sha>, on @user_script:<line>." suffix
        return FilterFullError(text[len(FULL) + 1:].split(" script: ")[0])
    return reply


def _run_one(client: Any, call: ScriptCall,
             recreate_filter: Callable[[], None] | None) -> Any:
    """One call without a pipeline (the cheapest round trip), same policy."""
    def send() -> Any:
        return client.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)

    def loaded() -> Any:
        try:
            return send()
        except redis.exceptions.NoScriptError:
            client.script_load(call.script.source)
            return send()

    try:
        try:
            # a call that first loads its script may then find its filter missing
            return loaded()
        except redis.ResponseError as exc:
            if recreate_filter is None or not is_missing_filter(exc):
                raise
            recreate_filter()
            return send()
    except redis.ResponseError as exc:
        error = _our_error(exc)
        if error is exc:
            raise
        raise error from exc
