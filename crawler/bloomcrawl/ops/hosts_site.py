"""Many small websites on one 127.0.0.1 port, told apart by ``Host``: politeness measuring.

One aiohttp server serves the hosts ``h0.localhost`` ... ``h<N-1>.localhost``
(or any names given). Crawlers reach them as ``http://h3.localhost:<port>/``
through :class:`bloomcrawl.crawl.resolver.LocalhostResolver` (``*.localhost``
is loopback, RFC 6761), so every host has a downloader slot and a politeness
budget of its own while one process serves them all.

Each host has ``pages`` pages: page 0 is ``/``, page ``i`` is ``/p/<i>``.
Page ``i`` links to its children ``fanout*i+1 .. fanout*i+fanout`` (a tree:
a crawl from ``/`` reaches every page, with work to spare), to its parent and
to ``/``, all as relative links, so a crawl never leaves the host. Per host
(:class:`HostSpec`), optionally:

* ``robots``: serve ``/robots.txt`` (else 404), with ``Crawl-delay`` and
  ``Disallow`` lines when given;
* ``throttle_first``: answer ``429 Too Many Requests`` with ``Retry-After``
  to the host's first K requests (robots.txt excepted);
* ``latency``: wait this many seconds before every answer.

Every request to a host is recorded as an :class:`Arrival`: host, path,
``time.monotonic()`` when it arrived and when its answer was ready (None while
outstanding), status, ``User-Agent`` and kind. CLOCK_MONOTONIC is
system-wide on Linux, so a process that runs the site in a subprocess can
compare those times with its own clock. The control endpoints answer on any
``Host`` and are never recorded:

``GET /__arrivals[?since=N]``
    ``{"now": ..., "count": ..., "arrivals": [...]}`` from the N-th on
``GET /__stats``
    per host: pages, distinct pages fetched, requests, duplicates, missing,
    throttled, robots, outstanding; and the totals
``POST /__reset``
    forget every arrival and counter

The functions at the end (:func:`min_gaps`, :func:`max_outstanding`,
:func:`rates`, :func:`peak_rates`, :func:`span`, :func:`summarize`, ...)
compute, from a list of arrivals, what a politeness test asserts.

Run it with ``python -m bloomcrawl.ops.hosts_site --port 8001 --hosts 50
--pages 20``; in tests, use :func:`serve_in_thread`; from another process,
read it with :class:`HostsSiteClient`.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import itertools
import json
import logging
import math
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import web

from bloomcrawl.crawl.resolver import resolver_settings
from bloomcrawl.ops.noproxy import OPENER
from bloomcrawl.ops.site_server import ThreadedSite, serve_until_signalled

__all__ = [
    "Arrival",
    "HostSpec",
    "HostSummary",
    "HostsServer",
    "HostsSiteClient",
    "RunningHostsSite",
    "build_parser",
    "by_host",
    "fetch_counts",
    "gaps",
    "host_names",
    "main",
    "max_outstanding",
    "min_gaps",
    "page_path",
    "pages_only",
    "peak_rates",
    "per_agent",
    "rates",
    "serve_in_thread",
    "span",
    "specs_from_args",
    "summarize",
]

logger = logging.getLogger(__name__)

DEFAULT_LISTEN: Final = "127.0.0.1"
DEFAULT_HOSTS: Final = 10
DEFAULT_PAGES: Final = 20
DEFAULT_FANOUT: Final = 2
DEFAULT_NAME_PATTERN: Final = "h{i}.localhost"
HTTP_TIMEOUT_S: Final = 10.0

#: kinds of arrival
PAGE: Final = "page"
ROBOTS: Final = "robots"
THROTTLED: Final = "throttled"
NOT_FOUND: Final = "not_found"


@dataclass(frozen=True)
class HostSpec:
    """One host: its pages and how it behaves."""

    name: str
    pages: int = DEFAULT_PAGES
    fanout: int = DEFAULT_FANOUT
    #: serve /robots.txt (404 when False)
    robots: bool = False
    #: the robots.txt ``Crawl-delay`` line, seconds (none when None)
    crawl_delay: float | None = None
    #: robots.txt ``Disallow`` paths
    disallow: tuple[str, ...] = ()
    #: answer 429 to this many first requests (robots.txt excepted)
    throttle_first: int = 0
    #: the 429's ``Retry-After``, whole seconds
    retry_after: int = 1
    #: seconds before every answer
    latency: float = 0.0

    def __post_init__(self) -> None:
        if not self.name or self.name != self.name.lower():
            raise ValueError(f"a host name must be non-empty and lower case, got {self.name!r}")
        if self.pages < 1:
            raise ValueError(f"pages must be at least 1, got {self.pages}")
        if self.fanout < 1:
            raise ValueError(f"fanout must be at least 1, got {self.fanout}")
        for name in ("throttle_first", "retry_after", "latency"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)!r}")
        if self.crawl_delay is not None and self.crawl_delay < 0:
            raise ValueError(f"crawl_delay must not be negative, got {self.crawl_delay!r}")

    def page_paths(self) -> list[str]:
        """Every page's path, indexed by page number."""
        return [page_path(page) for page in range(self.pages)]

    def links(self, page: int) -> list[str]:
        """The ``href`` values of ``page``: its children, its parent and ``/``."""
        children = range(self.fanout * page + 1, min(self.fanout * page + self.fanout + 1,
                                                      self.pages))
        targets = [*children]
        if page:
            targets += [(page - 1) // self.fanout, 0]
        return [page_path(target) for target in targets]

    def robots_txt(self) -> str:
        lines = ["User-agent: *"]
        lines += [f"Disallow: {path}" for path in self.disallow] or ["Disallow:"]
        if self.crawl_delay is not None:
            lines.append(f"Crawl-delay: {self.crawl_delay:g}")
        return "\n".join(lines) + "\n"


def page_path(page: int) -> str:
    return "/" if page == 0 else f"/p/{page}"


def host_names(count: int, pattern: str = DEFAULT_NAME_PATTERN) -> list[str]:
    """``pattern`` with ``{i}`` = 0 .. count-1: ``h0.localhost``, ``h1.localhost``, ..."""
    return [pattern.format(i=i) for i in range(count)]


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


def _hostname(host_header: str) -> str:
    """``h3.localhost`` of ``H3.localhost:8001`` (port dropped, lower case)."""
    try:
        return (urlsplit("//" + host_header).hostname or "").rstrip(".")
    except ValueError:
        return host_header.lower()


@dataclass
class _HostState:
    spec: HostSpec
    hits: list[int] = field(default_factory=list)
    requests: int = 0
    throttled: int = 0
    robots: int = 0
    not_found: int = 0

    def __post_init__(self) -> None:
        self.hits = [0] * self.spec.pages


class HostsServer:
    """The HTTP side: one app for every host, the arrivals and the counters.

    Everything is written in the event loop's thread; other threads read
    snapshots (:meth:`arrivals` copies a list of frozen records).
    """

    def __init__(self, hosts: Iterable[HostSpec]) -> None:
        self.specs = {spec.name: spec for spec in hosts}
        if not self.specs:
            raise ValueError("give at least one host")
        self._hosts = {name: _HostState(spec) for name, spec in self.specs.items()}
        self._arrivals: list[Arrival] = []
        self.unknown_hosts = 0

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/__arrivals", self._arrivals_view)
        app.router.add_get("/__stats", self._stats_view)
        app.router.add_post("/__reset", self._reset_view)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    def reset(self) -> None:
        """Forget every arrival and counter (call from the event loop's thread)."""
        self._hosts = {name: _HostState(spec) for name, spec in self.specs.items()}
        self._arrivals = []
        self.unknown_hosts = 0

    def arrivals(self, since: int = 0) -> list[Arrival]:
        """The arrivals from the ``since``-th on, in arrival order (a snapshot)."""
        return self._arrivals[since:]

    def stats(self) -> dict[str, Any]:
        hosts = {}
        outstanding: Counter[str] = Counter(a.host for a in self._arrivals if a.end is None)
        for name, state in list(self._hosts.items()):
            counts = list(state.hits)
            distinct = sum(1 for n in counts if n)
            pages_total = sum(counts)
            hosts[name] = {
                "pages": state.spec.pages,
                "distinct": distinct,
                "requests": state.requests,
                "page_requests": pages_total,
                "duplicates": pages_total - distinct,
                "missing": state.spec.pages - distinct,
                "throttled": state.throttled,
                "robots": state.robots,
                "not_found": state.not_found,
                "outstanding": outstanding[name],
            }
        return {
            "now": time.monotonic(),
            "hosts": hosts,
            "pages": sum(h["pages"] for h in hosts.values()),
            "distinct": sum(h["distinct"] for h in hosts.values()),
            "requests": sum(h["requests"] for h in hosts.values()),
            "duplicates": sum(h["duplicates"] for h in hosts.values()),
            "missing": sum(h["missing"] for h in hosts.values()),
            "unknown_hosts": self.unknown_hosts,
            "arrivals": len(self._arrivals),
        }

    async def _handle(self, request: web.Request) -> web.Response:
        start = time.monotonic()
        name = _hostname(request.host)
        state = self._hosts.get(name)
        if state is None:
            self.unknown_hosts += 1
            return web.Response(status=404, text=f"no host {name!r} here\n")
        spec = state.spec
        state.requests += 1
        index = len(self._arrivals)
        pending = Arrival(name, request.path_qs, start, None, 0,
                          request.headers.get("User-Agent", ""), PAGE)
        self._arrivals.append(pending)
        response, kind = self._answer(state, request.path)
        if spec.latency:
            await asyncio.sleep(spec.latency)
        # one list item assignment: a reader in another thread sees one record or the other
        self._arrivals[index] = replace(pending, end=time.monotonic(), status=response.status,
                                        kind=kind)
        return response

    def _answer(self, state: _HostState, path: str) -> tuple[web.Response, str]:
        spec = state.spec
        if path == "/robots.txt":
            state.robots += 1
            if spec.robots:
                return web.Response(text=spec.robots_txt(), content_type="text/plain"), ROBOTS
            return web.Response(status=404, text="no robots.txt\n"), ROBOTS
        if state.requests - state.robots <= spec.throttle_first:
            state.throttled += 1
            return web.Response(status=429, text="too many requests\n",
                                headers={"Retry-After": str(spec.retry_after)}), THROTTLED
        page = _page_number(path, spec.pages)
        if page is None:
            state.not_found += 1
            return web.Response(status=404, text="not found\n"), NOT_FOUND
        state.hits[page] += 1
        return web.Response(text=_render(spec, page), content_type="text/html"), PAGE

    async def _arrivals_view(self, request: web.Request) -> web.Response:
        try:
            since = max(0, int(request.query.get("since", "0")))
        except ValueError:
            return web.Response(status=400, text="since: not an integer\n")
        records = self.arrivals(since)
        return web.json_response({"now": time.monotonic(), "count": since + len(records),
                                  "arrivals": [a.to_json() for a in records]})

    async def _stats_view(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _reset_view(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": True})


def _page_number(path: str, pages: int) -> int | None:
    if path == "/":
        return 0
    if not path.startswith("/p/"):
        return None
    number = path[3:]
    if not (number.isascii() and number.isdigit() and number[0] != "0"):
        return None
    page = int(number)
    return page if page < pages else None


def _render(spec: HostSpec, page: int) -> str:
    title = html.escape(f"{spec.name} page {page}")
    items = "\n".join(f'<li><a href="{href}">{href}</a></li>' for href in spec.links(page))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{title}</title></head>\n<body><h1>{title}</h1>\n<ul>\n{items}\n</ul>\n"
            "</body></html>\n")


class RunningHostsSite(ThreadedSite[HostsServer]):
    """The hosts site served from a background thread; also a context manager."""

    def __init__(self, hosts: Iterable[HostSpec], *, listen: str = DEFAULT_LISTEN,
                 port: int = 0) -> None:
        super().__init__(HostsServer(hosts), host=listen, port=port, what="the hosts site")

    @property
    def hosts(self) -> list[str]:
        return list(self.server.specs)

    @property
    def specs(self) -> dict[str, HostSpec]:
        return self.server.specs

    def url(self, host: str, path: str = "/") -> str:
        """``http://<host>:<port><path>``."""
        return f"http://{host}:{self.port}{path}"

    def arrivals(self, since: int = 0) -> list[Arrival]:
        return self.server.arrivals(since)

    def stats(self) -> dict[str, Any]:
        return self.server.stats()


def crawl_settings(delay: float, per_domain: int = 1) -> dict[str, str]:
    """The Scrapy settings of a crawl measured at this site against one budget per host.

    The ``*.localhost`` names resolve to 127.0.0.1
    (:mod:`bloomcrawl.crawl.resolver`), and every host gets ``delay`` seconds and
    ``per_domain`` requests at a time with no random jitter, so the gaps the site
    records can be held to the delay itself.
    """
    return {
        "DOWNLOAD_DELAY": str(delay),
        "CONCURRENT_REQUESTS_PER_DOMAIN": str(per_domain),
        "RANDOMIZE_DOWNLOAD_DELAY": "False",
        **resolver_settings(),
    }


def serve_in_thread(hosts: Iterable[HostSpec] | None = None, *, count: int = DEFAULT_HOSTS,
                    pages: int = DEFAULT_PAGES, listen: str = DEFAULT_LISTEN,
                    port: int = 0, **behaviour: Any) -> RunningHostsSite:
    """Start the site in a daemon thread and return it, already listening.

    Without ``hosts``: ``count`` hosts ``h0.localhost`` ... with ``pages``
    pages each and the :class:`HostSpec` fields in ``behaviour``::

        with serve_in_thread(count=3, pages=40) as site:
            crawl(site.url("h0.localhost"))
            print(min_gaps(site.arrivals()))
    """
    if hosts is None:
        hosts = [HostSpec(name, pages=pages, **behaviour) for name in host_names(count)]
    return RunningHostsSite(hosts, listen=listen, port=port).start()


class HostsSiteClient:
    """The control endpoints of a hosts site in another process (never through a proxy)."""

    def __init__(self, port: int, address: str = DEFAULT_LISTEN) -> None:
        self.port = port
        self.base = f"http://{address}:{port}"

    def url(self, host: str, path: str = "/") -> str:
        return f"http://{host}:{self.port}{path}"

    def _request(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(self.base + path, method=method,
                                         data=b"" if method == "POST" else None)
        with OPENER.open(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read())

    def arrivals(self, since: int = 0) -> list[Arrival]:
        data = self._request(f"/__arrivals?since={since}")
        return [Arrival.from_json(a) for a in data["arrivals"]]

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = self._request("/__stats")
        return data

    def reset(self) -> None:
        self._request("/__reset", method="POST")


# --- what the arrivals say --------------------------------------------------------------


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


# --- the command ------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _non_negative(kind: Callable[[str], float]) -> Callable[[str], float]:
    def convert(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= 0:
            raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
        return value

    return convert


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bloomcrawl.ops.hosts_site",
        description="Serve many small websites on one port, told apart by the Host header,"
                    " and record every request's arrival.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="TCP port, 0 for a free one")
    parser.add_argument("--hosts", type=_positive_int, default=DEFAULT_HOSTS,
                        help="number of hosts")
    parser.add_argument("--names", default=DEFAULT_NAME_PATTERN,
                        help="host names: a pattern with {i}, or a comma-separated list")
    parser.add_argument("--pages", type=_positive_int, default=DEFAULT_PAGES,
                        help="pages per host")
    parser.add_argument("--fanout", type=_positive_int, default=DEFAULT_FANOUT,
                        help="child pages each page links to")
    parser.add_argument("--robots", action="store_true", help="serve robots.txt")
    parser.add_argument("--crawl-delay", type=_non_negative(float),
                        help="robots.txt Crawl-delay, seconds (implies --robots)")
    parser.add_argument("--throttle-first", type=_non_negative(int), default=0,
                        help="answer 429 to each host's first K requests")
    parser.add_argument("--retry-after", type=_non_negative(int), default=1,
                        help="the 429's Retry-After, seconds")
    parser.add_argument("--latency-ms", type=_non_negative(float), default=0.0,
                        help="wait this long before every answer")
    parser.add_argument("--spec", default="{}",
                        help='per-host overrides as JSON, e.g. \'{"h0.localhost":'
                             ' {"latency": 1.0, "throttle_first": 3}}\'')
    return parser


def specs_from_args(args: argparse.Namespace) -> list[HostSpec]:
    """The hosts the command line describes."""
    if "{i}" in args.names:
        names = host_names(args.hosts, args.names)
    else:
        names = [n.strip().lower() for n in args.names.split(",") if n.strip()]
    base = {
        "pages": args.pages, "fanout": args.fanout,
        "robots": args.robots or args.crawl_delay is not None, "crawl_delay": args.crawl_delay,
        "throttle_first": args.throttle_first, "retry_after": args.retry_after,
        "latency": args.latency_ms / 1000.0,
    }
    overrides = json.loads(args.spec)
    if not isinstance(overrides, dict):
        raise ValueError("--spec must be a JSON object of host: {field: value}")
    unknown = set(overrides) - set(names)
    if unknown:
        raise ValueError(f"--spec names hosts that are not served: {sorted(unknown)}")
    specs = []
    for name in names:
        override = dict(overrides.get(name, {}))
        if "disallow" in override:
            override["disallow"] = tuple(override["disallow"])
        specs.append(HostSpec(name, **{**base, **override}))
    return specs


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m bloomcrawl.ops.hosts_site``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        specs = specs_from_args(args)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    def ready(bound_port: int) -> None:
        logger.info("serving %d hosts (%s ... %s, %d pages in all) on http://%s:%d/",
                    len(specs), specs[0].name, specs[-1].name,
                    sum(s.pages for s in specs), args.listen, bound_port)

    try:
        asyncio.run(serve_until_signalled(HostsServer(specs), args.listen, args.port,
                                          on_ready=ready))
    except OSError as exc:
        logger.error("cannot serve on %s:%d: %s", args.listen, args.port, exc)
        raise SystemExit(1) from exc
    logger.info("stopped")


if __name__ == "__main__":
    from bloomcrawl.ops.hosts_site import main as _main  # log as bloomcrawl.ops.hosts_site

    _main()
