"""A small shop on 127.0.0.1 for the user project in ``tests/userproject``.

Pages: ``/`` links every category and the search form; ``/category/<name>``
(``?page=N``) lists products a page at a time; ``/product/<id>`` has a
name, a price, its category, its reviews page and two related products;
``/product/<id>/reviews``; ``/sitemap.xml`` lists every product; ``/search``
is a form whose POST lists a category's products; ``/deals``. Every request
is counted by method and path (query included), so a test can check that a
crawl fetched each page exactly once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

from aiohttp import web

from bloomcrawl.ops.site_server import ThreadedSite

CATEGORIES = ("books", "games", "tools")
PER_PAGE = 5
#: the longest a gated page waits for its gate (a test that never opens it does not hang
#: the site)
GATE_MAX_S = 60.0


class ShopServer:
    def __init__(self, products: int = 60, flaky: frozenset[str] = frozenset(),
                 partners: bool = False) -> None:
        self.products = products
        #: ``"GET /path"``s that answer 503 the first time they are asked for
        self.flaky = flaky
        #: each category's first page links to ``/category/<name>/partner``, which
        #: redirects to another site (``partner.localhost``)
        self.partners = partners
        self.hits: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._gates: dict[str, threading.Event] = {}

    # -- the catalogue -----------------------------------------------------------

    def category_of(self, product: int) -> str:
        return CATEGORIES[product % len(CATEGORIES)]

    def in_category(self, name: str) -> list[int]:
        return [p for p in range(self.products) if self.category_of(p) == name]

    def pages_of(self, name: str) -> int:
        return max(1, -(-len(self.in_category(name)) // PER_PAGE))

    def all_pages(self) -> set[str]:
        """Every ``GET`` page a full crawl reaches (what the tests expect once each)."""
        pages = {"/"}
        for name in CATEGORIES:
            pages.add("/category/%s" % name)
            pages.update("/category/%s?page=%d" % (name, n)
                         for n in range(2, self.pages_of(name) + 1))
        for p in range(self.products):
            pages.update(("/product/%d" % p, "/product/%d/reviews" % p))
        if self.partners:
            pages.update("/category/%s/partner" % name for name in CATEGORIES)
        return pages

    # -- serving -------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application()
        app.middlewares.append(self._count)
        app.router.add_get("/", self._home)
        app.router.add_get("/category/{name}", self._category)
        app.router.add_get("/category/{name}/partner", self._partner)
        app.router.add_get("/product/{id:\\d+}", self._product)
        app.router.add_get("/product/{id:\\d+}/reviews", self._reviews)
        app.router.add_get("/sitemap.xml", self._sitemap)
        app.router.add_get("/old-sitemap.xml", self._moved_sitemap)
        app.router.add_route("*", "/search", self._search)
        app.router.add_get("/deals", self._deals)
        return app

    def reset(self) -> None:
        with self._lock:
            self.hits.clear()

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.hits)

    def gate(self, key: str) -> threading.Event:
        """``key`` (``"GET /path?query"``) is counted when asked for, and answered once
        the returned event is set (at most :data:`GATE_MAX_S` later): a test knows a
        worker holds that page, and chooses when its callback runs."""
        with self._lock:
            return self._gates.setdefault(key, threading.Event())

    def open_gates(self) -> None:
        with self._lock:
            for gate in self._gates.values():
                gate.set()

    @web.middleware
    async def _count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = "%s %s" % (request.method, request.path_qs)
        with self._lock:
            self.hits[key] += 1
            first = self.hits[key] == 1
        if first and key in self.flaky:
            return web.Response(status=503, text="try again")
        gate = self._gates.get(key)
        if gate is not None:
            deadline = time.monotonic() + GATE_MAX_S
            while not gate.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return await handler(request)

    @staticmethod
    def _html(body: str) -> web.Response:
        return web.Response(text="<html><body>%s</body></html>" % body,
                            content_type="text/html")

    async def _home(self, request: web.Request) -> web.Response:
        links = "".join('<a href="/category/%s">%s</a>' % (c, c) for c in CATEGORIES)
        return self._html(links + '<a href="/search">search</a>')

    async def _category(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in CATEGORIES:
            raise web.HTTPNotFound()
        page = int(request.query.get("page", "1"))
        products = self.in_category(name)[(page - 1) * PER_PAGE: page * PER_PAGE]
        body = "".join('<a href="/product/%d">product %d</a>' % (p, p) for p in products)
        if page < self.pages_of(name):
            body += '<a rel="next" href="/category/%s?page=%d">next</a>' % (name, page + 1)
        body += '<a href="/">home</a>'
        if self.partners and page == 1:
            body += '<a href="/category/%s/partner">partner offers</a>' % name
        return self._html(body)

    async def _partner(self, request: web.Request) -> web.Response:
        if not self.partners:
            raise web.HTTPNotFound()
        # another site: a spider whose allowed_domains leave it out drops the redirect
        raise web.HTTPFound("http://partner.localhost:%s/offers/%s"
                            % (request.url.port, request.match_info["name"]))

    async def _product(self, request: web.Request) -> web.Response:
        p = int(request.match_info["id"])
        if p >= self.products:
            raise web.HTTPNotFound()
        related = "".join('<a href="/product/%d">related</a>' % ((p + k) % self.products)
                          for k in (1, 7))
        category = self.category_of(p)
        return self._html(
            '<h1 class="name">Product %d</h1><span class="price">EUR %d.50</span>'
            '<a class="category" data-name="%s" href="/category/%s">%s</a>'
            '<a class="reviews" href="/product/%d/reviews">reviews</a>%s'
            % (p, 10 + p, category, category, category, p, related))

    async def _reviews(self, request: web.Request) -> web.Response:
        p = int(request.match_info["id"])
        return self._html("<ul>%s</ul>" % "".join(
            '<li class="review">review %d of %d</li>' % (r, p) for r in range(p % 4)))

    async def _sitemap(self, request: web.Request) -> web.Response:
        base = "http://%s" % request.host
        urls = "".join("<url><loc>%s/product/%d</loc></url>" % (base, p)
                       for p in range(self.products))
        return web.Response(
            text='<?xml version="1.0" encoding="UTF-8"?>'
                 '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">%s</urlset>'
                 % urls, content_type="application/xml")

    async def _moved_sitemap(self, request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently("/sitemap.xml")

    async def _search(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            query = (await request.post()).get("q", "")
        else:
            query = request.query.get("q", "")
        form = ('<form id="search" action="/search" method="post"><select name="q">%s'
                '</select><input type="submit"></form>'
                % "".join('<option value="%s">%s</option>' % (c, c) for c in CATEGORIES))
        results = "".join('<a class="result" href="/product/%d">%d</a>' % (p, p)
                          for p in self.in_category(str(query)))
        return self._html(form + results)

    async def _deals(self, request: web.Request) -> web.Response:
        return self._html("<ul><li class='deal'>half price</li></ul>")


class RunningShop(ThreadedSite[ShopServer]):
    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def hits(self) -> Counter[str]:
        return self.server.snapshot()

    def stop(self, timeout: float = 10.0) -> None:
        self.server.open_gates()
        super().stop(timeout)


def serve_shop(products: int = 60, flaky: frozenset[str] = frozenset(),
               partners: bool = False) -> RunningShop:
    return RunningShop(ShopServer(products, flaky, partners), host="127.0.0.1", port=0,
                       what="the shop site").start()
