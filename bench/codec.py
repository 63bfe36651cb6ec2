"""Request codec benchmark: what queueing a request costs a worker's CPU, typed codec vs JSON.

Encode (``request_to_json``) and decode (``request_from_json``) in
microseconds per request, this process only (no Redis), for:

* (a) a typical link request: ``response.follow(url, callback=self.parse_page)``
  with ``depth`` and ``download_slot`` in meta and a Referer; (a') the same
  without a callback, which leaves the JSON and the codec alone in the loop;
* (b) a request carrying a half-filled Scrapy Item and a tz-aware datetime in
  cb_kwargs and a frozen dataclass in meta. Today's path refuses it, so its
  "legacy" column serializes what a user has to write instead: the same data
  flattened by hand (``dict(item)``, ``isoformat()``, ``asdict()``), types lost;
* (c) a CrawlSpider rule request, as ``CrawlSpider._requests_to_follow``
  builds it from a real HtmlResponse (lxml's smart string in ``link_text``).

Each beside today's JSON path, copied below as ``legacy_request_to_json`` /
``legacy_request_from_json`` (git b3fb3c4). The share of a worker's CPU is
arithmetic, not a measurement: encode x REQUESTS_PER_PAGE (the requests a
page yields) plus one decode (the page's own leased request), over
WORKER_CPU_PER_PAGE_MS. Timings are the best of several runs of a loop; they
depend on what else the machine does: compare rows of one run. Nothing here
asserts anything.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import timeit
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "crawler"))  # the working tree's bloomcrawl, installed or not

import scrapy  # noqa: E402
from _report import emit, table  # noqa: E402
from scrapy import Request  # noqa: E402
from scrapy.http import HtmlResponse  # noqa: E402
from scrapy.linkextractors import LinkExtractor  # noqa: E402
from scrapy.spiders import CrawlSpider, Rule  # noqa: E402
from scrapy.utils.misc import load_object  # noqa: E402
from scrapy.utils.request import request_from_dict  # noqa: E402

from bloomcrawl.crawl.lease import INTERNAL_META_KEYS  # noqa: E402
from bloomcrawl.crawl.serialization import request_from_json, request_to_json  # noqa: E402

WORKER_CPU_PER_PAGE_MS = 10.0
REQUESTS_PER_PAGE = 30
HOST = "www.example-shop.com"


@dataclass(frozen=True)
class Sizes:
    number: int  # requests per timed loop
    repeat: int  # loops; the best one is reported


FULL = Sizes(number=5_000, repeat=7)
QUICK = Sizes(number=200, repeat=2)


# --- today's path, as it was ---------------------------------------------------------


class LegacyUnserializable(ValueError):
    pass


def legacy_request_to_json(request: Request, spider: scrapy.Spider) -> str:
    try:
        d = request.to_dict(spider=spider)
    except ValueError as exc:
        raise LegacyUnserializable("cannot queue %s: %s" % (request, exc)) from exc
    meta = {k: v for k, v in (d.get("meta") or {}).items() if k not in INTERNAL_META_KEYS}
    d["meta"] = meta
    body = d.get("body") or b""
    d["body"] = base64.b64encode(body).decode("ascii") if body else ""
    d["headers"] = {
        k.decode("latin-1"): [v.decode("latin-1") for v in vs]
        for k, vs in (d.get("headers") or {}).items()
    }
    d["_id"] = uuid.uuid4().hex[:16]
    try:
        return json.dumps(d, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise LegacyUnserializable("cannot queue %s: not JSON-serializable" % request) from exc


def legacy_check_callback(spider: scrapy.Spider, name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError("callback %r is not a public spider method name" % (name,))
    if not callable(getattr(type(spider), name, None)):
        raise ValueError("callback %r is not a method of spider %r" % (name, spider.name))


def legacy_check_request_class(spider: scrapy.Spider, path: Any) -> None:
    module = path.rpartition(".")[0]
    own = type(spider).__module__
    if not (module == "scrapy" or module.startswith("scrapy.") or module == own):
        raise ValueError("request class %r is neither Scrapy's nor in %s" % (path, own))
    cls = load_object(path)
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        raise ValueError("%r is not a Request class" % (path,))


def legacy_request_from_json(data: str | bytes, spider: scrapy.Spider,
                             check_callbacks: bool = True) -> Request:
    d = json.loads(data)
    for key in ("callback", "errback"):
        if d.get(key) and check_callbacks:
            legacy_check_callback(spider, d[key])
    if "_class" in d:
        legacy_check_request_class(spider, d["_class"])
    d.pop("_id", None)
    body = d.get("body") or ""
    d["body"] = base64.b64decode(body) if body else b""
    d["headers"] = {k: vs for k, vs in (d.get("headers") or {}).items()}
    return request_from_dict(d, spider=spider)


# --- what a project has ------------------------------------------------------------


class ProductItem(scrapy.Item):
    url = scrapy.Field()
    name = scrapy.Field()
    price = scrapy.Field()
    currency = scrapy.Field()
    category = scrapy.Field()
    reviews = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class Listing:
    category: str
    page: int
    found_at: datetime.datetime


class ShopSpider(CrawlSpider):
    name = "shop"
    rules = (
        Rule(LinkExtractor(allow=r"/category/"), follow=True),
        Rule(LinkExtractor(allow=r"/product/\d+$"), callback="parse_product", follow=True),
    )

    def parse_page(self, response: Any) -> Any:
        return ()

    def parse_product(self, response: Any) -> Any:
        return ()

    def parse_reviews(self, response: Any, item: Any, seen_at: Any) -> Any:
        return ()


def make_spider() -> ShopSpider:
    if scrapy.version_info < (2, 14):
        # Scrapy 2.13's get_crawler() asks which reactor is installed
        from scrapy.utils.reactor import install_reactor

        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(ShopSpider, settings_dict={"SPIDER_MODULES": []})
    spider = ShopSpider.from_crawler(crawler)
    crawler.spider = spider
    return spider


def page_url(i: int) -> str:
    return "https://%s/category/kitchen/kettles/page-%d.html" % (HOST, i)


@dataclass
class Case:
    key: str
    label: str
    request: Request
    legacy_request: Request  # what the legacy path is given (b: the hand-flattened data)
    note: str = ""
    legacy_reads_callbacks: bool = True


def cases(spider: ShopSpider) -> list[Case]:
    referer = {"Referer": page_url(1)}
    meta = {"depth": 3, "download_slot": HOST}
    link = Request("https://%s/product/123456" % HOST, callback=spider.parse_page,
                   meta=dict(meta), headers=referer)
    bare = Request("https://%s/product/123456" % HOST, meta=dict(meta), headers=referer)

    found_at = datetime.datetime(2024, 5, 17, 10, 30, tzinfo=datetime.UTC)
    item = ProductItem(url=link.url, name="Stainless kettle 1.7 l", currency="EUR",
                       category="kettles")
    listing = Listing("kettles", 2, found_at)
    typed = Request(link.url + "/reviews", callback=spider.parse_reviews, headers=referer,
                    cb_kwargs={"item": item, "seen_at": found_at},
                    meta={**meta, "listing": listing})
    flat = Request(link.url + "/reviews", callback=spider.parse_reviews, headers=referer,
                   cb_kwargs={"item": dict(item), "seen_at": found_at.isoformat()},
                   meta={**meta, "listing": {**dataclasses.asdict(listing),
                                             "found_at": found_at.isoformat()}})

    body = ("<html><body>%s</body></html>" % "".join(
        '<a href="/product/%d">Kettle %d</a>' % (n, n) for n in range(100, 130))).encode()
    response = HtmlResponse(page_url(1), body=body, encoding="utf-8")
    rule_request = next(r for r in spider._requests_to_follow(response) if r is not None)
    rule_request.meta["depth"] = 3  # DepthMiddleware's
    rule_request.headers.setdefault("Referer", page_url(1))  # RefererMiddleware's
    return [
        Case("a", "(a) link request, callback", link, link),
        Case("a0", "(a') link request, no callback", bare, bare),
        Case("b", "(b) Item + datetime + dataclass", typed, flat,
             "legacy: the same data flattened by hand (its types are lost)"),
        Case("c", "(c) CrawlSpider rule request", rule_request, rule_request,
             "legacy refuses the callback '_callback' on decode (such entries were dropped as"
             " unreadable): its decode is timed without that check", False),
    ]


# --- measurements --------------------------------------------------------------------


def best_us(bodies: Sequence[Callable[[], Any]], sizes: Sizes) -> list[float]:
    """Per-call microseconds of each body: the best of ``repeat`` loops, taken in turns so
    that a busy moment of the machine falls on all of them alike."""
    best = [math.inf] * len(bodies)
    for _ in range(sizes.repeat):
        for i, body in enumerate(bodies):
            best[i] = min(best[i], timeit.Timer(body).timeit(sizes.number))
    return [t / sizes.number * 1e6 for t in best]


@dataclass
class Result:
    case: Case
    legacy_encode_us: float
    legacy_decode_us: float
    encode_us: float
    decode_us: float
    legacy_bytes: int
    new_bytes: int
    round_trip: str

    def share(self, encode_us: float, decode_us: float) -> float:
        """Fraction of a worker's CPU per page spent encoding and decoding its requests."""
        # a page's callback yields REQUESTS_PER_PAGE requests, each encoded; the worker
        # decodes one: the page's own leased request
        return (encode_us * REQUESTS_PER_PAGE + decode_us) / (WORKER_CPU_PER_PAGE_MS * 1e3)


def measure(case: Case, spider: ShopSpider, sizes: Sizes) -> Result:
    new = request_to_json(case.request, spider)
    old = legacy_request_to_json(case.legacy_request, spider)
    copy = request_from_json(new, spider)
    same = (copy.meta == case.request.meta and copy.cb_kwargs == case.request.cb_kwargs
            and copy.callback == case.request.callback
            and all(type(copy.cb_kwargs[k]) is type(v) for k, v in case.request.cb_kwargs.items())
            and all(type(copy.meta[k]) is type(v) for k, v in case.request.meta.items()
                    if not isinstance(v, str)))
    legacy_encode, legacy_decode, encode, decode = best_us([
        lambda: legacy_request_to_json(case.legacy_request, spider),
        lambda: legacy_request_from_json(old, spider, case.legacy_reads_callbacks),
        lambda: request_to_json(case.request, spider),
        lambda: request_from_json(new, spider),
    ], sizes)
    return Result(
        case=case,
        legacy_encode_us=legacy_encode,
        legacy_decode_us=legacy_decode,
        encode_us=encode,
        decode_us=decode,
        legacy_bytes=len(old.encode()),
        new_bytes=len(new.encode()),
        round_trip="same values and types" if same else "DIFFERENT",
    )


# --- output --------------------------------------------------------------------------


def fmt_ratio(new: float, old: float) -> str:
    return "%.2fx" % (new / old) if old > 0 and math.isfinite(new / old) else "n/a"


def report(args: argparse.Namespace, sizes: Sizes, results: list[Result]) -> None:
    quick = " --quick" if args.quick else ""
    emit(f"bloomcrawl request codec benchmark (bench/codec.py{quick})")
    emit(f"Python {platform.python_version()}, Scrapy {scrapy.__version__}; {os.cpu_count()}"
         f" CPUs; load average {' '.join('%.2f' % x for x in os.getloadavg())}; best of"
         f" {sizes.repeat} loops of {sizes.number} requests")
    emit("us per request; x = codec / legacy (today's JSON path); CPU share = (encode x"
         f" {REQUESTS_PER_PAGE} requests a page yields + decode of its one leased request) over"
         f" {WORKER_CPU_PER_PAGE_MS:g} ms of worker CPU per page (arithmetic)")
    emit()
    header = ["case", "encode legacy", "encode codec", "x", "decode legacy", "decode codec",
              "x", "bytes legacy", "bytes codec", "CPU/page legacy", "CPU/page codec",
              "round trip"]
    rows = []
    for r in results:
        rows.append([
            r.case.label,
            "%.1f" % r.legacy_encode_us, "%.1f" % r.encode_us,
            fmt_ratio(r.encode_us, r.legacy_encode_us),
            "%.1f" % r.legacy_decode_us, "%.1f" % r.decode_us,
            fmt_ratio(r.decode_us, r.legacy_decode_us),
            str(r.legacy_bytes), str(r.new_bytes),
            "%.1f %%" % (100 * r.share(r.legacy_encode_us, r.legacy_decode_us)),
            "%.1f %%" % (100 * r.share(r.encode_us, r.decode_us)),
            r.round_trip,
        ])
    for line in table(header, rows):
        emit(line)
    emit()
    for r in results:
        if r.case.note:
            emit(f"{r.case.label}: {r.case.note}")
    emit("legacy (a), (b), (c) encode: Request.to_dict finds the callback's name with"
         " inspect.getmembers(spider); the codec looks it up once per spider class")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a few hundred requests: a smoke test of the benchmark, not a"
                             " measurement")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to PATH")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    spider = make_spider()
    results = [measure(case, spider, sizes) for case in cases(spider)]
    report(args, sizes, results)
    if args.json:
        Path(args.json).write_text(json.dumps([{
            "case": r.case.key,
            "legacy_encode_us": r.legacy_encode_us, "legacy_decode_us": r.legacy_decode_us,
            "encode_us": r.encode_us, "decode_us": r.decode_us,
            "legacy_bytes": r.legacy_bytes, "bytes": r.new_bytes,
            "legacy_cpu_share": r.share(r.legacy_encode_us, r.legacy_decode_us),
            "cpu_share": r.share(r.encode_us, r.decode_us),
            "round_trip": r.round_trip,
        } for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
