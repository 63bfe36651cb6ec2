"""The hosts site's HTTP side: many small websites told apart by ``Host``, each arrival recorded.

:class:`HostSpec` says what one host serves and how it behaves (pages, robots.txt,
429s, latency; see :mod:`bloomcrawl.ops.hosts_site`); :class:`HostsServer` is
the one aiohttp app answering for all of them, counting what each host
served and recording every request as an
:class:`~bloomcrawl.ops.hosts_arrivals.Arrival`. Serving it, from a thread or
as a process, is :mod:`bloomcrawl.ops.hosts_site`'s.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import web

from bloomcrawl.ops.hosts_arrivals import NOT_FOUND, PAGE, ROBOTS, THROTTLED, Arrival

DEFAULT_PAGES: Final = 20
DEFAULT_FANOUT: Final = 2
DEFAULT_NAME_PATTERN: Final = "h{i}.localhost"


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
