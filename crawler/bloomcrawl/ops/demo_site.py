"""A deterministic synthetic website for tests, benchmarks and ``make demo``.

The site has ``pages`` pages: page 0 is ``/``, page ``i`` is ``/page/<i>`` with
a fixed query string (:func:`page_path`). Page ``i`` links to its children
``2i+1`` and ``2i+2``, so every page is reachable from ``/`` within
``log2(pages)`` hops, and to pseudo-random other pages. Each target is written
in one of several spellings -- query parameters in any order, with a
fragment, relative (``12?...``, ``../page/12?...``), absolute and
scheme-relative with the ``Host`` the request came with -- and all spellings
of one page have the same Scrapy request fingerprint, so a duplicate filter
sees the same page many times under different URLs.

The links depend only on ``(pages, links_per_page, seed)``. The server counts
GET hits per page: ``GET /__stats`` returns them as JSON and
``POST /__reset`` zeroes them, so a test can check that a crawl fetched every
page exactly once.

Run it with ``bloomcrawl-demo-site`` or ``python -m bloomcrawl.ops.demo_site``; in
tests, use :func:`serve_in_thread`.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import logging
import os
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import web

from bloomcrawl.ops.site_server import ThreadedSite, serve_until_signalled

__all__ = [
    "DEFAULT_LINKS_PER_PAGE",
    "DEFAULT_PAGES",
    "DemoServer",
    "DemoSite",
    "RunningSite",
    "main",
    "page_id",
    "page_path",
    "page_query",
    "page_title",
    "page_url",
    "serve_in_thread",
]

logger = logging.getLogger(__name__)

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8000
DEFAULT_PAGES: Final = 10_000
DEFAULT_LINKS_PER_PAGE: Final = 20
DEFAULT_SEED: Final = 0

#: Stands for the request's ``Host`` in cached page bodies; never part of the text.
_HOST_MARK: Final = "\x00"

_PAGE_PATH_RE: Final = re.compile(r"/page/([1-9][0-9]*)")
_LANGS: Final = ("en", "de", "fr")
_FRAGMENTS: Final = ("top", "comments", "related", "footer", "s1", "s2")
_WORDS: Final = (
    "frontier", "bloom", "filter", "crawl", "lease", "queue", "shard", "redis",
    "worker", "spider", "request", "response", "link", "page", "fingerprint",
    "partition", "scheduler", "duplicate", "canonical", "depth", "priority",
    "slice", "capacity", "error", "rate", "metric", "exporter", "node",
)
_ROBOTS_TXT: Final = b"User-agent: *\nDisallow:\n"


def page_query(page: int) -> list[tuple[str, str]]:
    """The query parameters every link to ``page`` carries, in canonical (sorted) order.

    Page 0 (``/``) has none, so ``/`` given as a start URL matches its links.
    """
    if page == 0:
        return []
    return [
        ("cat", str(page % 17)),
        ("lang", _LANGS[page % len(_LANGS)]),
        ("sort", "asc" if page % 2 else "desc"),
    ]


def _query_string(params: list[tuple[str, str]]) -> str:
    return "&".join(f"{key}={value}" for key, value in params)


def page_path(page: int) -> str:
    """Canonical path and query of ``page``, as :func:`w3lib.url.canonicalize_url` writes it."""
    if page == 0:
        return "/"
    return f"/page/{page}?{_query_string(page_query(page))}"


def page_url(page: int, base: str = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}") -> str:
    """Canonical absolute URL of ``page`` on the site at ``base`` (``scheme://host:port``)."""
    return base.rstrip("/") + page_path(page)


def page_id(url: str) -> int | None:
    """Page number of a site URL, absolute or not (query and fragment ignored).

    :returns: ``None`` when the path is not a page path. The page count is not
        checked.
    """
    path = urlsplit(url).path
    if path in ("", "/"):
        return 0
    match = _PAGE_PATH_RE.fullmatch(path)
    return int(match.group(1)) if match else None


def page_title(page: int) -> str:
    """The ``<title>`` of ``page``."""
    return "bloomcrawl demo: home" if page == 0 else f"bloomcrawl demo: page {page}"


class DemoSite:
    """The page set: which page links where, and how each link is spelled.

    Pure and deterministic; rendered bodies are cached per page, with the
    request's ``Host`` filled in at serve time.
    """

    def __init__(
        self,
        pages: int = DEFAULT_PAGES,
        *,
        links_per_page: int = DEFAULT_LINKS_PER_PAGE,
        seed: int = DEFAULT_SEED,
    ) -> None:
        if pages < 1:
            raise ValueError(f"pages must be at least 1, got {pages}")
        if links_per_page < 0:
            raise ValueError(f"links_per_page must not be negative, got {links_per_page}")
        self.pages = pages
        self.links_per_page = links_per_page
        self.seed = seed
        self._bodies: list[tuple[bytes, ...] | None] = [None] * pages
        self._hosts: dict[str, bytes] = {}

    def __repr__(self) -> str:
        return (
            f"DemoSite(pages={self.pages}, links_per_page={self.links_per_page}, "
            f"seed={self.seed})"
        )

    def _rng(self, page: int) -> random.Random:
        # A string seed is hashed with SHA-512: the same in every process.
        return random.Random(
            f"bloomcrawl-demo:{self.seed}:{self.pages}:{self.links_per_page}:{page}"
        )

    def _link_plan(self, page: int, rng: random.Random) -> list[int]:
        """Targets of the page's anchors, in order; repeats are intended."""
        targets = [child for child in (2 * page + 1, 2 * page + 2) if child < self.pages]
        while len(targets) < self.links_per_page:
            if targets and rng.random() < 0.35:
                targets.append(rng.choice(targets))  # the same page, spelled differently
            else:
                targets.append(rng.randrange(self.pages))
        return targets

    def _href(self, page: int, target: int, rng: random.Random) -> str:
        """One spelling of the link from ``page`` to ``target``; ``_HOST_MARK`` is the host."""
        style = rng.randrange(6)
        if target == 0:
            relative = "./" if page == 0 else "../"
            return (
                "/", f"/#{rng.choice(_FRAGMENTS)}", relative,
                f"http://{_HOST_MARK}/", f"http://{_HOST_MARK}", f"//{_HOST_MARK}/",
            )[style]
        params = page_query(target)
        rng.shuffle(params)
        tail = f"{target}?{_query_string(params)}"
        if style == 0:
            return "/page/" + tail
        if style == 1:
            return f"/page/{tail}#{rng.choice(_FRAGMENTS)}"
        if style == 2:
            return ("page/" if page == 0 else "") + tail
        if style == 3:
            return ("./page/" if page == 0 else "../page/") + tail
        if style == 4:
            return f"http://{_HOST_MARK}/page/{tail}"
        return f"//{_HOST_MARK}/page/{tail}"

    def links(self, page: int, host: str = f"{DEFAULT_HOST}:{DEFAULT_PORT}") -> list[str]:
        """The ``href`` values of ``page``'s anchors, as served to a request for ``host``."""
        self._check(page)
        rng = self._rng(page)
        plan = self._link_plan(page, rng)
        return [self._href(page, target, rng).replace(_HOST_MARK, host) for target in plan]

    def targets(self, page: int) -> set[int]:
        """The distinct pages ``page`` links to."""
        self._check(page)
        return set(self._link_plan(page, self._rng(page)))

    def body(self, page: int, host: str) -> bytes:
        """The HTML of ``page`` as served to a request whose ``Host`` is ``host``."""
        parts = self._bodies[page] if 0 <= page < self.pages else None
        if parts is None:
            parts = self._bodies[page] = self._render(page)
        return self._host_bytes(host).join(parts)

    def _host_bytes(self, host: str) -> bytes:
        cached = self._hosts.get(host)
        if cached is None:
            cached = html.escape(host).encode("ascii", "backslashreplace")
            if len(self._hosts) < 64:  # clients use a handful of Host values
                self._hosts[host] = cached
        return cached

    def _check(self, page: int) -> None:
        if not 0 <= page < self.pages:
            raise IndexError(f"page {page} is not in 0..{self.pages - 1}")

    def _render(self, page: int) -> tuple[bytes, ...]:
        self._check(page)
        rng = self._rng(page)
        plan = self._link_plan(page, rng)
        items = [
            f'<li><a href="{html.escape(self._href(page, target, rng))}">'
            f'{"Home" if target == 0 else target}</a></li>'
            for target in plan
        ]
        text = " ".join(rng.choice(_WORDS) for _ in range(24))
        title = html.escape(page_title(page))
        newline = "\n"
        document = (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{title}</title></head>\n<body><h1>{title}</h1>\n"
            f"<p>{text.capitalize()}.</p>\n<ul>\n{newline.join(items)}\n</ul>\n"
            "</body></html>\n"
        )
        return tuple(part.encode() for part in document.split(_HOST_MARK))


class DemoServer:
    """The HTTP side: routes, per-page GET counters and the optional delay.

    All counters live in the event loop's thread; other threads read them as
    snapshots.
    """

    def __init__(self, site: DemoSite, *, delay_ms: float = 0.0) -> None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must not be negative, got {delay_ms!r}")
        self.site = site
        self.delay = delay_ms / 1000.0
        self.hit_counts = [0] * site.pages
        self.not_found = 0
        self.robots = 0

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._home)
        app.router.add_get("/page/{number}", self._page)
        app.router.add_get("/robots.txt", self._robots)
        app.router.add_get("/__stats", self._stats)
        app.router.add_post("/__reset", self._reset)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    def reset(self) -> None:
        """Zero all counters (call from the event loop's thread)."""
        self.hit_counts = [0] * self.site.pages
        self.not_found = 0
        self.robots = 0

    def stats(self) -> dict[str, Any]:
        """The ``/__stats`` document; ``hits`` lists only pages fetched at least once."""
        counts = list(self.hit_counts)
        hits = {str(page): n for page, n in enumerate(counts) if n}
        total = sum(counts)
        return {
            "pages": self.site.pages,
            "links_per_page": self.site.links_per_page,
            "seed": self.site.seed,
            "total": total,
            "distinct": len(hits),
            "duplicates": total - len(hits),
            "missing": self.site.pages - len(hits),
            "not_found": self.not_found,
            "robots": self.robots,
            "hits": hits,
        }

    async def _serve_page(self, request: web.Request, page: int) -> web.Response:
        if request.method == "GET":
            self.hit_counts[page] += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(
            body=self.site.body(page, request.host), content_type="text/html", charset="utf-8"
        )

    async def _home(self, request: web.Request) -> web.Response:
        return await self._serve_page(request, 0)

    async def _page(self, request: web.Request) -> web.Response:
        number = request.match_info["number"]
        if number.isascii() and number.isdigit() and number[0] != "0":
            page = int(number)
            if page < self.site.pages:
                return await self._serve_page(request, page)
        return await self._not_found(request)

    async def _robots(self, request: web.Request) -> web.Response:
        self.robots += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(body=_ROBOTS_TXT, content_type="text/plain")

    async def _not_found(self, request: web.Request) -> web.Response:
        self.not_found += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(status=404, text="not found\n")

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": True})


class RunningSite(ThreadedSite[DemoServer]):
    """A demo site served from a background thread; also a context manager.

    :ivar url: the home page, ``http://host:port/``
    """

    def __init__(self, site: DemoSite, *, host: str, port: int, delay_ms: float) -> None:
        super().__init__(DemoServer(site, delay_ms=delay_ms), host=host, port=port,
                         what="the demo site")
        self.site = site

    @property
    def base(self) -> str:
        """``http://host:port``, no trailing slash."""
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return self.base + "/"

    def page_url(self, page: int) -> str:
        return page_url(page, self.base)

    def page_urls(self) -> list[str]:
        """Canonical URLs of all pages, indexed by page number."""
        return [page_url(page, self.base) for page in range(self.site.pages)]

    def hits(self) -> list[int]:
        """GET count per page, indexed by page number (a snapshot)."""
        return list(self.server.hit_counts)

    def stats(self) -> dict[str, Any]:
        """Same document as ``GET /__stats``."""
        return self.server.stats()


def serve_in_thread(
    *,
    pages: int = DEFAULT_PAGES,
    links_per_page: int = DEFAULT_LINKS_PER_PAGE,
    seed: int = DEFAULT_SEED,
    delay_ms: float = 0.0,
    host: str = DEFAULT_HOST,
    port: int = 0,
) -> RunningSite:
    """Start a demo site in a daemon thread and return it, already listening.

    ``port=0`` picks a free port (see ``.port``). Use it as a context manager,
    or call ``.stop()``::

        with serve_in_thread(pages=2000) as site:
            crawl(site.url)
            assert site.hits() == [1] * 2000
    """
    site = DemoSite(pages, links_per_page=links_per_page, seed=seed)
    return RunningSite(site, host=host, port=port, delay_ms=delay_ms).start()


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{value} is not in {bound}")
        return value

    return convert


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Command-line options; each default can be set by an environment variable."""
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="bloomcrawl-demo-site",
        description="Serve bloomcrawl's deterministic demo website.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--host", default=env("DEMO_HOST", DEFAULT_HOST),
        help="address to listen on (containers: 0.0.0.0) [DEMO_HOST]",
    )
    parser.add_argument(
        "--port", type=_int_in(0, 65535), default=env("DEMO_PORT", str(DEFAULT_PORT)),
        help="TCP port, 0 for a free one [DEMO_PORT]",
    )
    parser.add_argument(
        "--pages", type=_int_in(1), default=env("DEMO_PAGES", str(DEFAULT_PAGES)),
        help="number of pages [DEMO_PAGES]",
    )
    parser.add_argument(
        "--links-per-page", type=_int_in(0),
        default=env("DEMO_LINKS_PER_PAGE", str(DEFAULT_LINKS_PER_PAGE)),
        help="anchors per page, duplicates included [DEMO_LINKS_PER_PAGE]",
    )
    parser.add_argument(
        "--seed", type=int, default=env("DEMO_SEED", str(DEFAULT_SEED)),
        help="varies the link graph [DEMO_SEED]",
    )
    parser.add_argument(
        "--delay-ms", type=_non_negative_float, default=env("DEMO_DELAY_MS", "0"),
        help="delay before each response, in milliseconds [DEMO_DELAY_MS]",
    )
    parser.add_argument(
        "--access-log", action="store_true",
        default=env("DEMO_ACCESS_LOG", "") not in ("", "0", "false", "no"),
        help="log every request [DEMO_ACCESS_LOG]",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``bloomcrawl-demo-site`` and ``python -m bloomcrawl.ops.demo_site``."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    site = DemoSite(args.pages, links_per_page=args.links_per_page, seed=args.seed)
    server = DemoServer(site, delay_ms=args.delay_ms)
    def ready(bound_port: int) -> None:
        logger.info(
            "serving %r on http://%s:%d/ (delay %g ms)",
            site, args.host, bound_port, server.delay * 1000,
        )

    try:
        asyncio.run(serve_until_signalled(server, args.host, args.port, on_ready=ready,
                                          access_log=args.access_log))
    except OSError as exc:
        logger.error("cannot serve on %s:%d: %s", args.host, args.port, exc)
        raise SystemExit(1) from exc
    logger.info("stopped")


if __name__ == "__main__":
    from bloomcrawl.ops.demo_site import main as _main  # log as bloomcrawl.ops.demo_site

    _main()

