"""One per-host budget for the whole cluster: hosts, their partition, their policy.

The frontier keeps, in each partition, one queue per host and the host's
politeness state (see :mod:`bloomcrawl.core.keys`): when it may be leased
next, how many of its requests are leased, and its policy. A worker leases
only from hosts that are *ready* (``core/lua/polite_common.lua``), so the
delay and concurrency hold for all workers together.

A host's requests, filter bits and state share one partition, one Redis
Cluster slot: the partition comes from a hash of the host, written into
fingerprint bytes 17-20 (:func:`filter_fingerprint`), so enqueue-if-new
stays one atomic call.

Delays (milliseconds in Redis) combine as: the operator's override
(``bloomcrawl throttle``), else the DOWNLOAD_SLOTS entry, else the default;
then raised, never lowered, by robots.txt's Crawl-delay and AutoThrottle; a
back-off after 429/503 (Retry-After) holds the host until its end.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bloomcrawl.core import keys
from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts

#: a host name the frontier cannot key on (no host, or one with our separator)
_UNSAFE = str.maketrans({"|": "%7C", " ": "%20"})
#: longest Retry-After honoured, in seconds (a wrong date must not park a host for days)
MAX_BACKOFF_S = 3600.0
#: back-off when a 429/503 carries no usable Retry-After
DEFAULT_BACKOFF_S = 5.0
#: a partition whose hosts with work all have every slot in flight is asked again after
#: this long (their slots free with acks of other workers, which a worker does not see)
BUSY_RETRY_S = 0.2
#: a leased request that went out this much later than its lease is reported: its
#: host's next lease then counts from when it went out
LAG_REPORTED_S = 0.005

_POLICY = Script("polite_common.lua", "frontier_policy.lua")
_INFO = Script("polite_common.lua", "frontier_hosts.lua")


def host_of(url: str) -> str:
    """The host a request's politeness is kept under: Scrapy's download slot key."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        host = ""
    return host.lower().translate(_UNSAFE)


def host_hash(host: str) -> bytes:
    """Four bytes chosen by the host alone: the partition of all its requests."""
    return hashlib.sha1(host.encode("utf-8")).digest()[:4]


def filter_fingerprint(fp: bytes, host: str, partition_by: str) -> bytes:
    """The fingerprint the filter and the frontier use: bytes 17-20 from the host.

    Bytes 1-12 (block and bits) stay the request's own, so the error rate is
    unchanged; only the partition follows the host. ``partition_by`` is the
    filter's stored choice: filters made before hosts keep the request's.
    """
    if partition_by != "host":
        return fp
    return fp[:16] + host_hash(host)


def host_partition(host: str, partitions: int) -> int:
    """The partition a host-partitioned filter keeps ``host`` in."""
    return int.from_bytes(host_hash(host), "big") % partitions


@dataclass(frozen=True)
class Politeness:
    """The cluster-wide defaults every host starts from (Scrapy's own settings).

    ``delay`` is DOWNLOAD_DELAY, ``concurrency`` CONCURRENT_REQUESTS_PER_DOMAIN,
    ``jitter`` the ±fraction RANDOMIZE_DOWNLOAD_DELAY (or DOWNLOAD_DELAY_JITTER)
    applies; ``slots`` the per-host DOWNLOAD_SLOTS entries ``{host: (delay,
    concurrency)}`` (None: not set). With ``autothrottle``, delays adapt to the
    latency every worker sees: ``(start, max, target concurrency)``.
    """

    delay: float = 0.0
    concurrency: int = 8
    jitter: float = 0.0
    slots: tuple[tuple[str, float | None, int | None], ...] = ()
    autothrottle: tuple[float, float, float] | None = None

    def config(self, frontier_keys: keys.FrontierKeys, partition: int) -> str:
        """The ``cfg`` argument of every politeness script of ``partition``.

        ``<delay ms>|<concurrency>|<jitter>|<AutoThrottle start ms, -1: off>|<host queue prefix>``
        """
        start = -1 if self.autothrottle is None else round(self.autothrottle[0] * 1000)
        return "%d|%d|%s|%d|%s" % (round(self.delay * 1000), self.concurrency,
                                   repr(self.jitter), start,
                                   frontier_keys.host_queue_prefix(partition))

    def describe(self) -> str:
        text = "delay %.3g s, concurrency %d per host across the cluster" % (
            self.delay, self.concurrency)
        if self.jitter:
            text += ", delay jitter ±%.0f%%" % (self.jitter * 100)
        if self.autothrottle:
            text += ", AutoThrottle (start %.3g s, max %.3g s, target %.3g)" % self.autothrottle
        if self.slots:
            text += ", %d DOWNLOAD_SLOTS" % len(self.slots)
        return text

    def to_meta(self) -> dict[str, Any]:
        return {"delay": self.delay, "concurrency": self.concurrency, "jitter": self.jitter,
                "autothrottle": list(self.autothrottle) if self.autothrottle else None}

    @classmethod
    def from_meta(cls, data: Any) -> Politeness:
        """What a worker recorded (the exporter and the CLI read it); defaults if unreadable."""
        try:
            auto = data.get("autothrottle")
            return cls(delay=float(data["delay"]), concurrency=int(data["concurrency"]),
                       jitter=float(data.get("jitter", 0.0)),
                       autothrottle=(float(auto[0]), float(auto[1]), float(auto[2]))
                       if auto else None)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return cls()


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else str(round(seconds * 1000))


def policy_call(frontier_keys: keys.FrontierKeys, politeness: Politeness, partition: int,
                host: str, *, source: str = "", delay: float | None = None,
                concurrency: int | None = None, clear: bool = False) -> ScriptCall:
    """Set (or, ``clear``, remove) a host's delay and concurrency override.

    ``source`` "" is the operator's (``bloomcrawl throttle``), "s" the
    DOWNLOAD_SLOTS setting's. Takes effect at the host's next lease.
    """
    return ScriptCall(_POLICY, frontier_keys.polite_keys(partition), [
        politeness.config(frontier_keys, partition), source, host,
        "-" if clear else _ms(delay), "-" if clear else ("" if concurrency is None
                                                         else str(concurrency))])


def set_policy(server: Any, frontier_keys: keys.FrontierKeys, politeness: Politeness,
               partition: int, host: str, **kwargs: Any) -> None:
    run_scripts(server, [policy_call(frontier_keys, politeness, partition, host, **kwargs)])


@dataclass
class Feedback:
    """What a worker saw of hosts since its last exchange, per partition.

    ``robots``: host -> Crawl-delay (s); ``backoff``: host -> seconds to hold
    it (Retry-After); ``latency``: (host, seconds, ok) per response, for
    AutoThrottle; ``sent``: host -> when (``time.monotonic()``) a request of
    it went out, if it was later than its lease: the host's next lease is no
    earlier than that plus its delay.
    """

    robots: dict[str, float]
    backoff: dict[str, float]
    latency: list[tuple[str, float, bool]]
    sent: dict[str, float]

    def __init__(self) -> None:
        self.robots, self.backoff, self.latency, self.sent = {}, {}, [], {}

    def __bool__(self) -> bool:
        return bool(self.robots or self.backoff or self.latency or self.sent)

    def args(self, autothrottle: tuple[float, float, float] | None) -> list[Any]:
        out: list[Any] = []
        for host, delay in self.robots.items():
            out += ["robots", host, _ms(delay)]
        for host, hold in self.backoff.items():
            out += ["backoff", host, _ms(min(hold, MAX_BACKOFF_S))]
        now = time.monotonic()  # built just before it is sent: "ago" errs long, the safe way
        for host, when in self.sent.items():
            out += ["sent", host, _ms(max(0.0, now - when))]
        if autothrottle is not None:
            start, most, target = autothrottle
            for host, latency, ok in self.latency:
                out += ["latency", host, "%s|%d|%s|%s|%s" % (
                    _ms(latency), int(ok), repr(float(target)), _ms(start), _ms(most))]
        return out


@dataclass(frozen=True)
class DomainState:
    """One host's budget and load, as the frontier holds it now."""

    host: str
    queued: int
    in_flight: int
    #: the delay its next lease gets (before jitter), seconds
    delay: float
    concurrency: int
    #: seconds until it may be leased (0: now; None: not waiting for a time,
    #: either nothing queued or every slot in flight)
    ready_in: float | None


@dataclass(frozen=True)
class PolitenessSummary:
    """A spider's hosts: totals over every partition and the busiest ``top_k``."""

    hosts: int
    queued: int
    #: requests queued for hosts that may not be leased now (delay, concurrency, back-off)
    held_back: int
    in_flight: int
    domains: list[DomainState]


def host_states(server: Any, frontier_keys: keys.FrontierKeys, politeness: Politeness,
                hosts: Iterable[str]) -> list[DomainState]:
    """The state of the named hosts (each in its own partition)."""
    by_partition: dict[int, list[str]] = {}
    for host in hosts:
        by_partition.setdefault(host_partition(host, frontier_keys.partitions), []).append(host)
    calls = [ScriptCall(_INFO, frontier_keys.polite_keys(p),
                        [politeness.config(frontier_keys, p), 0, *names])
             for p, names in by_partition.items()]
    out = []
    for reply in run_scripts(server, calls, read_only=True):
        out += _states(reply[4:])
    return out


def politeness_summary(server: Any, frontier_keys: keys.FrontierKeys, top_k: int = 10,
                       politeness: Politeness | None = None) -> PolitenessSummary:
    """Totals over every partition, and the ``top_k`` hosts by queued plus in flight.

    Costs one script call per partition: each returns its totals and its own
    busiest ``top_k`` (by queue depth, plus the hosts in flight), bounded.
    """
    if politeness is None:
        politeness = recorded_politeness(server, frontier_keys)
    calls = [ScriptCall(_INFO, frontier_keys.polite_keys(p),
                        [politeness.config(frontier_keys, p), top_k])
             for p in range(frontier_keys.partitions)]
    hosts = queued = held = flight = 0
    states: list[DomainState] = []
    for reply in run_scripts(server, calls, read_only=True):
        hosts += int(reply[0])
        queued += int(reply[1])
        held += int(reply[2])
        flight += int(reply[3])
        states += _states(reply[4:])
    states.sort(key=lambda s: (-(s.queued + s.in_flight), s.host))
    return PolitenessSummary(hosts=hosts, queued=queued, held_back=held, in_flight=flight,
                             domains=states[:top_k])


def _states(flat: list[Any]) -> list[DomainState]:
    out = []
    for i in range(0, len(flat), 6):
        host, queued, busy, delay_ms, conc, ready_ms = flat[i:i + 6]
        ready = int(ready_ms)
        out.append(DomainState(
            host=host.decode() if isinstance(host, bytes) else str(host),
            queued=int(queued), in_flight=int(busy), delay=int(delay_ms) / 1000,
            concurrency=int(conc), ready_in=None if ready < 0 else ready / 1000))
    return out


def recorded_politeness(server: Any, frontier_keys: keys.FrontierKeys) -> Politeness:
    """The defaults the spider's workers recorded in the filter's meta hash."""
    import json

    raw = server.hget(frontier_keys.meta, "politeness")
    if raw is None:
        return Politeness()
    try:
        return Politeness.from_meta(json.loads(raw))
    except ValueError:
        return Politeness()
