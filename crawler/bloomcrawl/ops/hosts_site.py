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

The functions of :mod:`bloomcrawl.ops.hosts_arrivals` (:func:`min_gaps`,
:func:`max_outstanding`, :func:`rates`, :func:`peak_rates`, :func:`span`,
:func:`summarize`, ...) compute, from a list of arrivals, what a politeness
test asserts; this module offers them too.

Run it with ``python -m bloomcrawl.ops.hosts_site --port 8001 --hosts 50
--pages 20``; in tests, use :func:`serve_in_thread`; from another process,
read it with :class:`HostsSiteClient`.

The app itself (:class:`HostSpec`, :class:`HostsServer`) is
:mod:`bloomcrawl.ops.hosts_server`; this module serves it and is its command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from bloomcrawl.crawl.resolver import resolver_settings
from bloomcrawl.ops.hosts_arrivals import (
    NOT_FOUND,
    PAGE,
    ROBOTS,
    THROTTLED,
    Arrival,
    HostSummary,
    by_host,
    fetch_counts,
    gaps,
    max_outstanding,
    min_gaps,
    pages_only,
    peak_rates,
    per_agent,
    rates,
    span,
    summarize,
)
from bloomcrawl.ops.hosts_server import (
    DEFAULT_FANOUT,
    DEFAULT_NAME_PATTERN,
    DEFAULT_PAGES,
    HostSpec,
    HostsServer,
    host_names,
    page_path,
)
from bloomcrawl.ops.noproxy import OPENER
from bloomcrawl.ops.site_server import ThreadedSite, serve_until_signalled

__all__ = [
    "DEFAULT_FANOUT",
    "DEFAULT_HOSTS",
    "DEFAULT_LISTEN",
    "DEFAULT_NAME_PATTERN",
    "DEFAULT_PAGES",
    "HTTP_TIMEOUT_S",
    "NOT_FOUND",
    "PAGE",
    "ROBOTS",
    "THROTTLED",
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
HTTP_TIMEOUT_S: Final = 10.0


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
