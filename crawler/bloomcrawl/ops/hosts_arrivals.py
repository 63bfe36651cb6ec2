"""Each request a site recorded (an :class:`Arrival`), and what a politeness test reads in it.

The hosts site (:mod:`bloomcrawl.ops.hosts_site`) records every request to a
host as an :class:`Arrival`: host, path, ``time.monotonic()`` when it arrived
and when its answer was ready (None while outstanding), status,
``User-Agent`` and kind. The functions here (:func:`min_gaps`,
:func:`max_outstanding`, :func:`rates`, :func:`peak_rates`, :func:`span`,
:func:`summarize`, ...) compute from a list of arrivals what a politeness
test or benchmark asserts. They need no web server (no aiohttp): a process
that reads arrivals from a site in another process uses them alone.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

#: kinds of arrival
PAGE: Final = "page"
ROBOTS: Final = "robots"
THROTTLED: Final = "throttled"
NOT_FOUND: Final = "not_found"


@dataclass(frozen=True)
class Arrival:
    """One request a host received."""

    host: str
    path: str
    #: time.monotonic() when it arrived
    start: float
    #: time.monotonic() when its answer was ready; None while outstanding
    end: float | None
    status: int
    agent: str
    kind: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Arrival:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


def pages_only(arrivals: Iterable[Arrival]) -> list[Arrival]:
    """The page fetches that were served (no robots.txt, 429 or 404)."""
    return [a for a in arrivals if a.kind == PAGE]


def by_host(arrivals: Iterable[Arrival]) -> dict[str, list[Arrival]]:
    """Arrivals per host, each list by arrival time."""
    hosts: dict[str, list[Arrival]] = defaultdict(list)
    for a in arrivals:
        hosts[a.host].append(a)
    for records in hosts.values():
        records.sort(key=lambda a: a.start)
    return dict(hosts)


def gaps(arrivals: Iterable[Arrival]) -> dict[str, list[float]]:
    """Per host, the times between its consecutive arrivals, in arrival order."""
    return {host: [b.start - a.start for a, b in itertools.pairwise(records)]
            for host, records in by_host(arrivals).items()}


def min_gaps(arrivals: Iterable[Arrival]) -> dict[str, float]:
    """Per host, the shortest time between two consecutive arrivals (hosts with two or more)."""
    return {host: min(values) for host, values in gaps(arrivals).items() if values}


def max_outstanding(arrivals: Iterable[Arrival]) -> dict[str, int]:
    """Per host, the most requests it was answering at one time.

    A request is outstanding from its arrival until its answer was ready
    (still outstanding when ``end`` is None). An answer ready at the very
    time another request arrives does not overlap it.
    """
    result = {}
    for host, records in by_host(arrivals).items():
        events = []
        for a in records:
            events.append((a.start, 1))
            events.append((a.end if a.end is not None else math.inf, -1))
        events.sort()  # at equal times -1 sorts first: a finished answer frees its place
        current = peak = 0
        for _, delta in events:
            current += delta
            peak = max(peak, current)
        result[host] = peak
    return result


def rates(arrivals: Iterable[Arrival]) -> dict[str, float]:
    """Per host, requests per second between its first and last arrival: (n - 1) / span."""
    result = {}
    for host, records in by_host(arrivals).items():
        elapsed = records[-1].start - records[0].start
        if len(records) > 1 and elapsed > 0:
            result[host] = (len(records) - 1) / elapsed
    return result


def peak_rates(arrivals: Iterable[Arrival], intervals: int) -> dict[str, float]:
    """Per host, the fastest pace over ``intervals`` consecutive gaps: intervals / their sum.

    A host paced at one request every ``d`` seconds shows ``1/d`` (a little
    less when slower); N uncoordinated workers each keeping ``d`` show up to
    ``N/d``. A host with fewer requests than ``intervals + 1`` shows its mean
    rate; hosts with fewer than two requests are left out, as are those whose
    requests all came at once.
    """
    if intervals < 1:
        raise ValueError(f"intervals must be at least 1, got {intervals!r}")
    result = {}
    for host, records in by_host(arrivals).items():
        starts = [a.start for a in records]
        run = min(intervals, len(starts) - 1)
        if run < 1:
            continue
        shortest = min(starts[i + run] - starts[i] for i in range(len(starts) - run))
        if shortest > 0:
            result[host] = run / shortest
    return result


def span(arrivals: Iterable[Arrival]) -> float:
    """Seconds from the first arrival to the last (0 with fewer than two)."""
    starts = [a.start for a in arrivals]
    return max(starts) - min(starts) if len(starts) > 1 else 0.0


def fetch_counts(arrivals: Iterable[Arrival]) -> Counter[tuple[str, str]]:
    """How often each (host, path) was requested."""
    return Counter((a.host, a.path) for a in arrivals)


def per_agent(arrivals: Iterable[Arrival]) -> Counter[str]:
    """Requests per ``User-Agent``: per worker, when each worker sends its own."""
    return Counter(a.agent for a in arrivals)


@dataclass(frozen=True)
class HostSummary:
    """One host's numbers, from its arrivals."""

    host: str
    requests: int
    first: float
    last: float
    #: None with fewer than two requests
    min_gap: float | None
    #: (n - 1) / (last - first); None with fewer than two requests
    rate: float | None
    max_outstanding: int

    @property
    def span(self) -> float:
        return self.last - self.first


def summarize(arrivals: Iterable[Arrival]) -> dict[str, HostSummary]:
    """Per host: requests, first and last arrival, min gap, rate, max outstanding."""
    records = list(arrivals)
    gaps, host_rates, outstanding = min_gaps(records), rates(records), max_outstanding(records)
    return {
        host: HostSummary(host, len(group), group[0].start, group[-1].start, gaps.get(host),
                          host_rates.get(host), outstanding[host])
        for host, group in by_host(records).items()
    }
