"""Queue entries keep the types of what requests carry, and name only what may be called.

Requests are real Scrapy ones (Request, FormRequest, JsonRequest, the ones a
CrawlSpider, a SitemapSpider and scrapy-redis's RedisCrawlSpider make), from
spiders built through ``get_crawler`` and ``from_crawler``.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import importlib
import json
import math
import sys
import threading
import uuid
import zoneinfo
from collections.abc import Iterator
from http import HTTPStatus  # also named test_codec.HTTPStatus: see the hostile entries
from pathlib import Path
from typing import Any, NamedTuple

import attr
import pytest
import scrapy
from scrapy import FormRequest, Request, Spider
from scrapy.http import HtmlResponse, JsonRequest, XmlResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.settings import Settings
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from scrapy_redis.spiders import RedisCrawlSpider

from bloomcrawl.core.errors import SettingError
from bloomcrawl.crawl.codec import TAG
from bloomcrawl.crawl.lease import LEASE_META_KEY
from bloomcrawl.crawl.serialization import (
    ClassAllowList,
    UnreadableRequest,
    UnserializableRequest,
    check_callback,
    default_allow_list,
    request_from_json,
    request_to_json,
)

from conftest import disconnect_at_teardown

# --- what a project defines ---------------------------------------------------------


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    tags = scrapy.Field()
    seen_at = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class Listing:
    category: str
    page: int
    found_at: datetime.datetime
    score: float = dataclasses.field(init=False, default=0.5)


@dataclasses.dataclass
class Counter:
    start: int
    doubled: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.doubled = self.start * 2


@dataclasses.dataclass
class NeedsInitVar:
    value: int
    scale: dataclasses.InitVar[int]

    def __post_init__(self, scale: int) -> None:
        object.__setattr__(self, "value", self.value * scale)


@attr.s(frozen=True)
class Offer:
    shop = attr.ib()
    _price = attr.ib()  # passed as price=
    note = attr.ib(init=False, default="none")


@attr.define
class Basket:
    items: list[Any]
    total: decimal.Decimal = decimal.Decimal(0)


class Colour(enum.Enum):
    RED = "red"
    GREEN = (0, 255, 0)


class Perm(enum.Flag):
    READ = 1
    WRITE = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(NamedTuple):
    x: int
    y: int


class PageRequest(Request):
    """A project's Request subclass with an attribute of its own."""

    attributes = (*Request.attributes, "page_kind")

    def __init__(self, *args: Any, page_kind: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.page_kind = page_kind


@dataclasses.dataclass
class Price:
    """A __post_init__ that converts what it is given: built again from the Decimal it
    stored, it fails."""

    price: Any

    def __post_init__(self) -> None:
        self.price = decimal.Decimal(self.price.replace("$", ""))


@dataclasses.dataclass
class Hops:
    """A __post_init__ that counts: built again, it is another value."""

    hops: int

    def __post_init__(self) -> None:
        self.hops += 1


@dataclasses.dataclass(frozen=True)
class Slug:
    """A __post_init__ that gives the same value again: stored as any dataclass."""

    name: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.name.strip().lower())


@attr.define
class Trimmed:
    price: decimal.Decimal = attr.field(converter=lambda s: decimal.Decimal(s.strip()))


class UrlItem(scrapy.Item):
    """An Item whose __init__ wants an argument."""

    url = scrapy.Field()

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url=url, **kwargs)


class ApiRequest(Request):
    """A Request subclass whose constructor takes other arguments than its attributes."""

    def __init__(self, base: str, endpoint: str, **kwargs: Any) -> None:
        super().__init__(base + endpoint, **kwargs)


class NotData:
    """A project class that is neither an Item nor a dataclass."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("queue data must never call this")


class OwnTz(datetime.tzinfo):
    """A time zone class of neither kind bloomcrawl stores."""

    def utcoffset(self, dt: Any) -> datetime.timedelta:
        return datetime.timedelta(hours=1)

    def dst(self, dt: Any) -> datetime.timedelta:
        return datetime.timedelta(0)

    def tzname(self, dt: Any) -> str:
        return "OWN"


class Text(str):
    """A str subclass, such as lxml's smart strings: the text is what matters."""


def local_dataclass() -> Any:
    @dataclasses.dataclass
    class Local:
        x: int

    return Local(1)


class ShopSpider(Spider):
    name = "shop"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.helper = self.parse_item  # an instance attribute: never a callback by name

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return ()

    def parse_item(self, response: Any, **kwargs: Any) -> Any:
        return [kwargs]

    def _parse_private(self, response: Any) -> Any:
        return ["private"]

    def __parse_mangled(self, response: Any) -> Any:
        return ["mangled"]

    def mangled(self) -> Any:
        return self.__parse_mangled

    def on_error(self, failure: Any) -> None:
        pass

    @staticmethod
    def a_staticmethod(response: Any) -> None:
        pass

    @classmethod
    def a_classmethod(cls, response: Any) -> None:
        pass

    @property
    def a_property(self) -> Any:
        return self.parse

    def closed(self, reason: str) -> None:
        pass

    def start_requests(self) -> Any:
        return []


class ShopCrawlSpider(CrawlSpider):
    name = "shopcrawl"
    rules = (
        Rule(LinkExtractor(allow=r"/category/"), follow=True),
        Rule(LinkExtractor(allow=r"/product/\d+$"), callback="parse_product", follow=False),
    )

    def parse_product(self, response: Any) -> Any:
        yield Product(name=response.css("h1::text").get(), tags=("new",))


class ShopSitemapSpider(SitemapSpider):
    name = "shopsitemap"
    sitemap_urls = ("http://shop.test/sitemap.xml",)
    sitemap_rules = ((r"/product/", "parse_product"),)

    def parse_product(self, response: Any) -> Any:
        return ()


class ShopRedisSpider(RedisCrawlSpider):
    name = "shopredis"
    rules = (Rule(LinkExtractor(allow=r"/product/"), callback="parse_product"),)

    def parse_product(self, response: Any) -> Any:
        yield Product(name="from redis")


SETTINGS = {"SPIDER_MODULES": ["test_codec"]}


def make_spider(cls: type[Spider] = ShopSpider, **settings: Any) -> Any:
    crawler = get_crawler(cls, settings_dict={**SETTINGS, **settings})
    spider = cls.from_crawler(crawler)
    crawler.spider = spider
    return spider


def round_trip(request: Request, spider: Spider) -> tuple[Request, dict[str, Any]]:
    text = request_to_json(request, spider)
    return request_from_json(text, spider), json.loads(text)


def assert_same(a: Any, b: Any) -> None:
    """Equal, and of the same types all the way down."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    elif isinstance(a, decimal.Decimal):
        assert str(a) == str(b)  # NaN too, and 19.90 is not 19.9
    elif isinstance(a, dict | scrapy.Item):
        assert list(a.keys()) == list(b.keys())
        for key in a:
            keys = [k for k in b if k == key]
            assert len(keys) == 1
            assert_same(key, keys[0])
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif attr.has(type(a)):
        for a_field in attr.fields(type(a)):
            assert_same(getattr(a, a_field.name), getattr(b, a_field.name))
    else:
        assert a == b
        if isinstance(a, datetime.datetime | datetime.time):
            assert a.tzinfo == b.tzinfo and a.fold == b.fold
            assert a.tzname() == b.tzname()


NOW = datetime.datetime(2024, 5, 17, 10, 30, 15, 123456)
VALUES: dict[str, Any] = {
    "naive datetime": NOW,
    "utc datetime": NOW.replace(tzinfo=datetime.UTC),
    "offset datetime": NOW.replace(tzinfo=datetime.timezone(datetime.timedelta(hours=5,
                                                                                minutes=30))),
    "named offset": NOW.replace(tzinfo=datetime.timezone(datetime.timedelta(hours=2), "CEST")),
    "zoneinfo": NOW.replace(tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
    "zoneinfo fold": datetime.datetime(2024, 10, 27, 2, 30, fold=1,
                                       tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
    "date": datetime.date(2024, 2, 29),
    "time": datetime.time(23, 59, 1, 5),
    "aware time": datetime.time(8, 0, tzinfo=datetime.UTC),
    "timedelta": datetime.timedelta(days=-1, seconds=5, microseconds=7),
    "decimal": decimal.Decimal("19.90"),
    "decimal nan": decimal.Decimal("NaN"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "bytes": b"\x00\xff binary",
    "bytearray": bytearray(b"\x01\x02"),
    "tuple": ("a", 1, None),
    "empty tuple": (),
    "set": {1, 2, 3},
    "frozenset": frozenset({"x", "y"}),
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "int keys": {1: "one", 2: "two"},
    "mixed keys": {1: "int", "1": "str", (1, 2): "tuple", None: "none", 2.5: "float"},
    "bool keys": {True: "yes"},
    "tag key": {TAG: "tuple", "v": [1, 2]},
    "enum": Colour.GREEN,
    "flag": Perm.READ | Perm.WRITE,
    "int enum": Level.HIGH,
    "named tuple": Point(1, 2),
    "item": Product(name="kettle", price=decimal.Decimal("20.5"), tags=("new", "sale")),
    "half-filled item": Product(name="toaster"),
    "frozen dataclass": Listing("kitchen", 2, NOW.replace(tzinfo=datetime.UTC)),
    "dataclass with a non-init field": Counter(21),
    "attrs": Offer("shop", 3),
    "attrs define": Basket([Product(name="a")], decimal.Decimal("1.5")),
    "plain JSON": {"a": [1, 2.5, "x", None, True, {"b": []}]},
    "nested mix": [{"when": (NOW, datetime.date(2024, 1, 1)), 3: {Colour.RED: {b"k"}}},
                   Listing("a", 1, NOW)],
}


@pytest.mark.parametrize("name", list(VALUES))
@pytest.mark.parametrize("request_class", [Request, FormRequest, JsonRequest])
def test_values_come_back_with_their_types(name: str, request_class: type[Request]) -> None:
    spider = make_spider()
    value = VALUES[name]
    original = request_class("http://shop.test/p", callback=spider.parse_item,
                             meta={"value": value, "depth": 1},
                             cb_kwargs={"value": value, "nested": [value]})
    copy, stored = round_trip(original, spider)
    assert type(copy) is request_class
    assert_same(copy.meta, {"value": value, "depth": 1})
    assert_same(copy.cb_kwargs, {"value": value, "nested": [value]})
    assert stored["v"] == 2
    assert stored["meta"]["depth"] == 1  # the plain values stay plain beside the tagged one


def test_cookies_flags_and_extra_attributes_keep_their_types() -> None:
    spider = make_spider()
    original = JsonRequest("http://shop.test/api", data={"q": 1}, cookies={"c": "1"},
                           flags=["cached"], dumps_kwargs={"sort_keys": True})
    copy, stored = round_trip(original, spider)
    assert copy.dumps_kwargs == {"sort_keys": True}
    assert copy.cookies == {"c": "1"} and copy.flags == ["cached"]
    assert copy.body == original.body == b'{"q": 1}'
    page = PageRequest("http://shop.test/x", page_kind=(Colour.RED, 2),
                       cookies=[{"name": "n", "value": "v", "domain": "shop.test"}])
    copy, stored = round_trip(page, spider)
    assert type(copy) is PageRequest
    assert copy.page_kind == (Colour.RED, 2) and type(copy.page_kind) is tuple
    assert copy.cookies == [{"name": "n", "value": "v", "domain": "shop.test"}]
    assert stored["_class"] == "test_codec.PageRequest"


def test_plain_values_stay_plain_json() -> None:
    spider = make_spider()
    request = Request("http://shop.test/a", meta={"depth": 2, "download_slot": "shop.test",
                                                 LEASE_META_KEY: (0, "token")},
                      headers={"Referer": "http://shop.test/"}, callback=spider.parse)
    text = request_to_json(request, spider)
    assert TAG not in text
    stored = json.loads(text)
    assert stored["meta"] == {"depth": 2, "download_slot": "shop.test"}
    assert stored["callback"] == "parse" and "errback" not in stored  # None: left out
    assert stored["headers"] == {"Referer": ["http://shop.test/"]}
    assert len(stored["_id"]) == 16 and stored["v"] == 2
    assert LEASE_META_KEY in request.meta  # the request itself is not changed


def test_a_plain_request_leaves_its_defaults_out_and_comes_back_whole() -> None:
    """A link's entry holds only what differs from ``Request``'s defaults, and a field left
    out comes back as that default; a subclass's entry keeps every field."""
    spider = make_spider()
    link = Request("http://shop.test/a", headers={"Referer": "http://shop.test/"},
                   meta={"depth": 1})
    copy, stored = round_trip(link, spider)
    assert set(stored) == {"url", "headers", "meta", "_id", "v"}, stored
    assert copy.to_dict(spider=spider) == link.to_dict(spider=spider)
    assert (copy.method, copy.encoding, copy.priority, copy.dont_filter, copy.body) == (
        "GET", "utf-8", 0, False, b"")
    # a meta of bloomcrawl's own keys only is an empty meta in the queue
    leased = Request("http://shop.test/c", meta={LEASE_META_KEY: (0, "token")})
    assert set(json.loads(request_to_json(leased, spider))) == {"url", "_id", "v"}
    # every field away from its default is kept
    other = Request("http://shop.test/b", callback=spider.parse_item, errback=spider.on_error,
                    method="HEAD", encoding="latin-1", priority=-3, dont_filter=True,
                    flags=["f"], cb_kwargs={"n": 1}, cookies={"c": "1"}, body=b"x")
    copy, stored = round_trip(other, spider)
    assert set(stored) == {"url", "callback", "errback", "method", "encoding", "priority",
                           "dont_filter", "flags", "cb_kwargs", "cookies", "body", "_id",
                           "v"}, stored
    assert copy.to_dict(spider=spider) == other.to_dict(spider=spider)
    # a JsonRequest with a body is a POST unless told GET: its GET must stay in the entry
    api = JsonRequest("http://shop.test/api", data={"q": 1}, method="GET")
    copy, stored = round_trip(api, spider)
    assert stored["method"] == "GET" and copy.method == "GET", stored
    assert {"encoding", "priority", "dont_filter", "callback"} <= set(stored), stored


def test_the_tagged_forms_are_readable() -> None:
    spider = make_spider()
    stored = json.loads(request_to_json(Request("http://shop.test/", cb_kwargs={
        "when": datetime.datetime(2024, 5, 17, 10, 0, tzinfo=datetime.UTC),
        "pair": (1, "a"),
        "item": Product(name="kettle"),
        "by_id": {7: "seven"},
    }), spider))
    assert stored["cb_kwargs"] == {
        "when": {TAG: "datetime", "v": "2024-05-17T10:00:00+00:00"},
        "pair": {TAG: "tuple", "v": [1, "a"]},
        "item": {TAG: "item", "cls": "test_codec.Product", "v": {"name": "kettle"}},
        "by_id": {TAG: "dict", "v": [[7, "seven"]]},
    }


def test_subclasses_of_str_int_and_float_come_back_as_the_plain_type() -> None:
    spider = make_spider()
    copy, stored = round_trip(Request("http://shop.test/", meta={
        "text": Text("kettle"), "level": Level.LOW, "n": type("Big", (int,), {})(7),
        "f": type("Real", (float,), {})("inf")}), spider)
    assert_same(copy.meta, {"text": "kettle", "level": Level.LOW, "n": 7, "f": math.inf})
    assert stored["meta"]["text"] == "kettle" and stored["meta"]["n"] == 7


def test_a_dict_holding_the_tag_key_is_escaped_and_the_request_left_alone() -> None:
    spider = make_spider()
    user_data = {TAG: "item", "cls": "subprocess.Popen", "v": {"args": "sh"}}
    request = Request("http://shop.test/", meta={"doc": user_data})
    copy, stored = round_trip(request, spider)
    assert copy.meta["doc"] == user_data and type(copy.meta["doc"]) is dict
    assert stored["meta"]["doc"][TAG] == "dict"  # escaped: never read as a tag
    assert request.meta["doc"] is user_data and user_data[TAG] == "item"


def test_int_dict_keys_come_back_as_ints() -> None:
    spider = make_spider()
    copy, _ = round_trip(Request("http://shop.test/", meta={"pages": {1: "a", 20: "b"}}), spider)
    assert copy.meta["pages"] == {1: "a", 20: "b"}
    assert [type(k) for k in copy.meta["pages"]] == [int, int]


def test_dataclass_fields_set_after_init_are_kept() -> None:
    spider = make_spider()
    counter = Counter(3)
    counter.doubled = 100  # not what __post_init__ would compute again
    listing = Listing("a", 1, NOW)
    object.__setattr__(listing, "score", 0.9)
    copy, stored = round_trip(Request("http://shop.test/", meta={"c": counter, "l": listing}),
                              spider)
    assert copy.meta["c"].doubled == 100 and copy.meta["l"].score == 0.9
    assert stored["meta"]["c"] == {TAG: "dataclass", "cls": "test_codec.Counter",
                                   "v": {"start": 3}, "set": {"doubled": 100}}
    offer = copy_of(Offer("s", 1))
    assert offer == Offer("s", 1) and offer.note == "none"


def copy_of(value: Any) -> Any:
    spider = make_spider()
    return round_trip(Request("http://shop.test/", meta={"x": value}), spider)[0].meta["x"]


# --- what cannot be stored, and why ------------------------------------------------


@pytest.mark.parametrize(("meta", "cb_kwargs", "key", "kind"), [
    ({"lock": threading.Lock()}, {}, "meta['lock']", "_thread.lock"),
    ({"sock": object()}, {}, "meta['sock']", "object"),
    ({}, {"item": Product(name=threading.Lock())}, "cb_kwargs['item']['name']", "_thread.lock"),
    ({"l": [1, {"x": (2, object())}]}, {}, "meta['l'][1]['x'][1]", "object"),
    ({"listing": Listing("a", 1, object())}, {}, "meta['listing'].found_at",  # type: ignore[arg-type]
     "object"),
    ({"status": HTTPStatus.OK}, {}, "meta['status']", "http.HTTPStatus"),
    ({"local": local_dataclass()}, {}, "meta['local']",
     "test_codec.local_dataclass.<locals>.Local"),
    ({"initvar": NeedsInitVar(1, 2)}, {}, "meta['initvar']", "test_codec.NeedsInitVar"),
    ({"d": datetime.datetime(2024, 1, 1, tzinfo=OwnTz())}, {}, "meta['d']", "test_codec.OwnTz"),
    ({"x": NotData.__new__(NotData)}, {}, "meta['x']", "test_codec.NotData"),
    ({"od": collections.OrderedDict(a=1)}, {}, "meta['od']", "collections.OrderedDict"),
    ({"me": None}, {}, "meta", "recursion"),
])
def test_what_cannot_be_stored_is_refused_naming_where_and_what(
        meta: dict[str, Any], cb_kwargs: dict[str, Any], key: str, kind: str) -> None:
    spider = make_spider()
    if "me" in meta:
        meta["me"] = meta  # contains itself
    with pytest.raises(UnserializableRequest) as info:
        request_to_json(Request("http://shop.test/x", meta=meta, cb_kwargs=cb_kwargs), spider)
    assert info.value.key == key
    assert info.value.kind == kind
    assert str(info.value).startswith("cannot queue <GET http://shop.test/x>: " + key)


@pytest.mark.parametrize(("value", "kind", "says"), [
    (Price("$3.50"), "test_codec.Price", "whose __post_init__ fails when it is built again"),
    (Hops(0), "test_codec.Hops", "whose __post_init__ changes what it is built from"),
    (Trimmed(" 2.5"), "test_codec.Trimmed", "whose converter or validator fails"),
    (UrlItem("http://shop.test/1"), "test_codec.UrlItem", "whose __init__ fails"),
])
def test_a_value_its_class_would_build_again_differently_is_refused(
        value: Any, kind: str, says: str) -> None:
    """A reader builds a value again from its stored fields, running the class's own
    code: one that would fail, or make another value, is refused when queued (the request
    stays with its worker) rather than dropped, or changed, when a worker reads it."""
    spider = make_spider()
    with pytest.raises(UnserializableRequest) as info:
        request_to_json(Request("http://shop.test/x", cb_kwargs={"v": [value]}), spider)
    assert info.value.key == "cb_kwargs['v'][0]"
    assert info.value.kind == kind
    assert says in str(info.value)


def test_a_value_its_class_builds_again_the_same_is_stored() -> None:
    slug = copy_of(Slug(" Shoes "))
    assert slug == Slug("shoes") and type(slug) is Slug


def test_a_request_class_its_constructor_cannot_build_again_is_refused() -> None:
    spider = make_spider()
    request = ApiRequest("http://shop.test", "/api/1", callback=spider.parse_item)
    with pytest.raises(UnserializableRequest) as info:
        request_to_json(request, spider)
    assert info.value.key == "_class" and info.value.kind == "test_codec.ApiRequest"
    assert "cannot be built again" in str(info.value)
    # one whose constructor takes its attributes is stored as before
    assert_same(round_trip(PageRequest("http://shop.test/p", page_kind="list"), spider)[0]
                .page_kind, "list")


def test_a_class_that_is_not_allowed_names_the_setting(vendor: str) -> None:
    money = importlib.import_module(vendor).Money(5, "EUR")
    spider = make_spider()
    with pytest.raises(UnserializableRequest, match="add '%s.Money' \\(or its package\\) to"
                       " FRONTIER_SAFE_CLASSES" % vendor) as info:
        request_to_json(Request("http://shop.test/", cb_kwargs={"price": money}), spider)
    assert (info.value.key, info.value.kind) == ("cb_kwargs['price']", vendor + ".Money")
    for setting in ([vendor], vendor + ".Money", "other.pkg, %s" % vendor):
        spider = make_spider(FRONTIER_SAFE_CLASSES=setting)
        copy, _ = round_trip(Request("http://shop.test/", cb_kwargs={"price": money}), spider)
        assert copy.cb_kwargs["price"] == money and type(copy.cb_kwargs["price"]) is type(money)


def test_a_request_class_that_is_not_allowed_is_refused_when_queued(vendor: str) -> None:
    request = importlib.import_module(vendor).VendorRequest("http://shop.test/")
    with pytest.raises(UnserializableRequest, match="FRONTIER_SAFE_CLASSES") as info:
        request_to_json(request, make_spider())
    assert (info.value.key, info.value.kind) == ("_class", vendor + ".VendorRequest")
    spider = make_spider(FRONTIER_SAFE_CLASSES=vendor)
    assert type(round_trip(request, spider)[0]).__name__ == "VendorRequest"


def test_callbacks_that_are_not_spider_methods_are_refused_when_queued() -> None:
    spider = make_spider()
    other = make_spider(ShopSitemapSpider)
    for request, key in [
        (Request("http://shop.test/", callback=lambda response: None), "callback"),
        (Request("http://shop.test/", errback=print), "errback"),
        (Request("http://shop.test/", callback=other.parse_product), "callback"),
        (Request("http://shop.test/", callback=spider.a_classmethod), "callback"),
    ]:
        with pytest.raises(UnserializableRequest, match="is not a method of spider class"
                           " ShopSpider") as info:
            request_to_json(request, spider)
        assert (info.value.key, info.value.kind) == (key, "callback")
    with pytest.raises(UnserializableRequest, match="'start_requests' is spider machinery"):
        request_to_json(Request("http://shop.test/", callback=spider.start_requests), spider)


# --- the callback rule ---------------------------------------------------------------


def test_every_method_a_spider_defines_is_a_callback_public_or_private() -> None:
    spider = make_spider()
    for name in ("parse", "parse_item", "_parse", "_parse_private", "_ShopSpider__parse_mangled",
                 "on_error"):
        method = check_callback(spider, name)
        assert method == getattr(spider, name)
    original = Request("http://shop.test/", callback=spider.mangled(),
                       errback=spider._parse_private)
    copy, stored = round_trip(original, spider)
    assert stored["callback"] == "_ShopSpider__parse_mangled"
    assert stored["errback"] == "_parse_private"
    assert copy.callback(None) == ["mangled"] and copy.errback(None) == ["private"]


@pytest.mark.parametrize(("name", "message"), [
    ("__init__", "callback '__init__' is a special method, never a callback"),
    ("__class__", "is a special method"),
    ("_set_crawler", r"'_set_crawler' is spider machinery \(scrapy.spiders.Spider\)"),
    ("from_crawler", "'from_crawler' is spider machinery"),
    ("close", "'close' is spider machinery"),
    ("closed", "'closed' is spider machinery"),
    ("start_requests", "'start_requests' is spider machinery"),
    ("start", "'start' is spider machinery"),
    ("update_settings", "spider machinery"),
    ("handles_request", "spider machinery"),
    ("log", "spider machinery"),
    ("logger", "spider machinery"),
    ("helper", "'helper' is not a method of spider class ShopSpider"),  # an instance attribute
    ("a_staticmethod", "not a method of spider class ShopSpider: it is a staticmethod"),
    ("a_classmethod", "not a method of spider class ShopSpider: it is a classmethod"),
    ("a_property", "not a method of spider class ShopSpider: it is a property"),
    ("name", "not a method of spider class ShopSpider: it is a str"),
    ("crawler", "'crawler' is not a method of spider class ShopSpider"),
    ("settings", "'settings' is not a method of spider class ShopSpider"),
    ("missing", "'missing' is not a method of spider class ShopSpider"),
    ("mro", "is not a method of spider class ShopSpider: it is a method_descriptor"),
    ("parse-item", "is not a method name"),
    (["parse"], "is not a method name"),
])
def test_callback_names_that_are_refused(name: Any, message: str) -> None:
    spider = make_spider()
    with pytest.raises(UnreadableRequest, match=message):
        check_callback(spider, name)
    with pytest.raises(UnreadableRequest, match=message):
        request_from_json(json.dumps({"url": "http://shop.test/", "callback": name, "v": 2}),
                          spider)
    with pytest.raises(UnreadableRequest, match=message):  # entries of before: the same rule
        request_from_json(json.dumps({"url": "http://shop.test/", "errback": name}), spider)


def test_an_instance_attribute_cannot_stand_in_for_a_method() -> None:
    spider = make_spider()
    called = []
    spider.__dict__["parse_item"] = lambda *a, **k: called.append(a)
    copy = request_from_json(json.dumps({"url": "http://shop.test/", "callback": "parse_item"}),
                             spider)
    assert copy.callback.__func__ is ShopSpider.parse_item and copy.callback.__self__ is spider
    assert called == []


def _drain(result: Any) -> list[Any]:
    """The output of a callback, run to its end (CrawlSpider's is an async generator that
    never waits when its rule's callback is a plain generator)."""
    if not hasattr(result, "__anext__"):
        return list(result or ())
    out = []
    while True:
        step = result.__anext__()
        try:
            step.send(None)
        except StopIteration as stop:
            out.append(stop.value)
        except StopAsyncIteration:
            return out
        else:
            raise AssertionError("the callback waited for something")


CATEGORY_PAGE = b"""<html><body>
<a href="/category/kettles">Kettles</a>
<a href="/product/1">Kettle one</a>
<a href="/product/2">Kettle two</a>
<a href="http://elsewhere.test/about">About</a>
</body></html>"""


def test_crawlspider_rule_requests_survive_the_queue() -> None:
    spider = make_spider(ShopCrawlSpider)
    page = HtmlResponse("http://shop.test/category/all", body=CATEGORY_PAGE, encoding="utf-8")
    requests = [r for r in spider._requests_to_follow(page) if r is not None]
    assert sorted(r.url for r in requests) == ["http://shop.test/category/kettles",
                                               "http://shop.test/product/1",
                                               "http://shop.test/product/2"]
    for original in requests:
        copy, stored = round_trip(original, spider)
        assert (stored["callback"], stored["errback"]) == ("_callback", "_errback")
        assert copy.callback == spider._callback and copy.errback == spider._errback
        assert copy.meta == original.meta and isinstance(copy.meta["rule"], int)
        response = HtmlResponse(copy.url, body=b"<h1>A kettle</h1>", encoding="utf-8",
                                request=copy)
        out = _drain(copy.callback(response))
        if "/product/" in copy.url:
            assert out == [Product(name="A kettle", tags=("new",))]
        else:
            assert out == []  # the category rule has no callback and no links to follow here
    for name in ("_compile_rules", "_requests_to_follow", "_build_request", "_parse_response",
                 "_handle_failure", "_set_crawler", "parse_with_rules", "process_results"):
        # parse_with_rules is Scrapy 2.14's
        refused = "spider machinery" if hasattr(CrawlSpider, name) else "not a method of spider"
        with pytest.raises(UnreadableRequest, match=refused):
            check_callback(spider, name)
    assert check_callback(spider, "parse_start_url") == spider.parse_start_url
    assert check_callback(spider, "_parse") == spider._parse


SITEMAP_INDEX = b"""<?xml version="1.0" encoding="UTF-8"?>
<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <sitemap><loc>http://shop.test/sitemap-products.xml</loc></sitemap>
</sitemapindex>"""
URLSET = b"""<?xml version="1.0" encoding="UTF-8"?>
<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">
  <url><loc>http://shop.test/product/7</loc></url>
</urlset>"""


def test_sitemapspider_requests_survive_the_queue() -> None:
    spider = make_spider(ShopSitemapSpider)
    index = XmlResponse("http://shop.test/sitemap.xml", body=SITEMAP_INDEX)
    [child] = list(spider._parse_sitemap(index))
    copy, stored = round_trip(child, spider)
    assert stored["callback"] == "_parse_sitemap"
    assert copy.callback == spider._parse_sitemap
    urlset = XmlResponse(copy.url, body=URLSET, request=copy)
    [product] = list(copy.callback(urlset))
    copy, stored = round_trip(product, spider)
    assert (copy.url, stored["callback"]) == ("http://shop.test/product/7", "parse_product")
    for name in ("sitemap_filter", "_get_sitemap_body", "start"):
        with pytest.raises(UnreadableRequest, match="spider machinery"):
            check_callback(spider, name)


def test_redis_crawl_spider_requests_survive_the_queue(redis_server: Any) -> None:
    spider = make_spider(ShopRedisSpider, REDIS_URL=redis_server.url)
    disconnect_at_teardown(spider.server)
    start = spider.make_request_from_data(json.dumps(
        {"url": "http://shop.test/", "meta": {"job": ("a", 1)}}).encode())
    copy, _ = round_trip(start, spider)
    assert type(copy) is FormRequest and copy.meta == {"job": ["a", 1]}  # JSON from Redis
    page = HtmlResponse("http://shop.test/", body=b'<a href="/product/9">p</a>',
                        encoding="utf-8")
    [rule_request] = list(spider._requests_to_follow(page))
    copy, _ = round_trip(rule_request, spider)
    assert copy.callback == spider._callback
    product = HtmlResponse(copy.url, body=b"", request=copy)
    assert _drain(copy.callback(product)) == [Product(name="from redis")]
    for name in ("setup_redis", "next_requests", "make_request_from_data",
                 "schedule_next_requests", "spider_idle", "pop_list_queue",
                 "pop_priority_queue", "start_requests", "from_crawler"):
        with pytest.raises(UnreadableRequest, match=r"spider machinery \(scrapy_redis"):
            check_callback(spider, name)


# --- hostile entries -----------------------------------------------------------------


@pytest.fixture
def vendor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package no allow-list names, importable but not imported: its name."""
    name = "bcvendor_%s" % uuid.uuid4().hex[:8]
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text(
        "import dataclasses\n"
        "import scrapy\n\n"
        "@dataclasses.dataclass\n"
        "class Money:\n"
        "    amount: int\n"
        "    currency: str\n\n"
        "class VendorRequest(scrapy.Request):\n"
        "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def hostile(meta: Any) -> str:
    return json.dumps({"url": "http://shop.test/", "meta": {"x": meta}, "v": 2})


@pytest.mark.parametrize(("tag", "path", "message"), [
    ("item", "subprocess.Popen", "item class 'subprocess.Popen' is neither Scrapy's nor the"
                                 " project's, nor listed in FRONTIER_SAFE_CLASSES"),
    ("dataclass", "subprocess.Popen", "neither Scrapy's nor the project's"),
    ("item", "os.system", "item class 'os.system' is neither Scrapy's"),
    ("dataclass", "os.system", "dataclass class 'os.system' is neither Scrapy's"),
    ("attrs", "builtins.eval", "neither Scrapy's"),
    ("dataclass", "scrapy.utils.misc.load_object", "'scrapy.utils.misc.load_object' is not a"
                                                   " dataclass"),
    ("item", "scrapy.Spider", "'scrapy.Spider' is not a scrapy.Item class"),
    ("dataclass", "test_codec.NotData", "'test_codec.NotData' is not a dataclass"),
    ("item", "test_codec.Listing", "is not a scrapy.Item class"),
    ("attrs", "test_codec.Listing", "is not an attrs class"),
    ("enum", "test_codec.Product", "is not an Enum"),
    ("namedtuple", "test_codec.Listing", "is not a named tuple"),
    ("enum", "test_codec.HTTPStatus", "'test_codec.HTTPStatus' is http.HTTPStatus, which is"
                                      " not allowed"),
    ("dataclass", "test_codec.nothing_here", "cannot be imported"),
    ("dataclass", "test_codec..Listing", "neither Scrapy's"),
    ("dataclass", 5, "is not a dotted path"),
])
def test_a_hostile_entry_names_no_class_that_is_not_allowed_and_of_its_kind(
        tag: str, path: Any, message: str) -> None:
    spider = make_spider()
    with pytest.raises(UnreadableRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        request_from_json(hostile({TAG: tag, "cls": path, "v": {"args": "true"}}), spider)


def test_a_hostile_entry_does_not_import_what_is_not_allowed(vendor: str) -> None:
    spider = make_spider()
    for tag in ("item", "dataclass", "attrs", "enum", "namedtuple"):
        with pytest.raises(UnreadableRequest, match="not imported"):
            request_from_json(hostile({TAG: tag, "cls": vendor + ".Money", "v": {}}), spider)
    with pytest.raises(UnreadableRequest, match="not imported"):
        request_from_json(json.dumps({"url": "http://shop.test/",
                                      "_class": vendor + ".VendorRequest"}), spider)
    assert vendor not in sys.modules
    # allowed, it is imported, and built
    allowed = ClassAllowList(["scrapy", "test_codec", vendor])
    copy = request_from_json(hostile({TAG: "dataclass", "cls": vendor + ".Money",
                                      "v": {"amount": 1, "currency": "EUR"}}), spider, allowed)
    assert vendor in sys.modules and copy.meta["x"].amount == 1


@pytest.mark.parametrize(("entry", "message"), [
    ({TAG: "dataclass", "cls": "test_codec.Counter", "v": {"start": 1},
      "set": {"__class__": "x"}}, "'__class__' is not a field of"),
    ({TAG: "dataclass", "cls": "test_codec.Listing", "v": {"category": "a"}},
     "not a valid dataclass"),
    ({TAG: "item", "cls": "test_codec.Product", "v": {"colour": "red"}}, "not a valid item"),
    ({TAG: "attrs", "cls": "test_codec.Offer", "v": {"shop": 1, "price": 2},
      "set": {"_price": 3}}, "'_price' is not a field of"),
    ({TAG: "enum", "cls": "test_codec.Colour", "v": "BLUE"}, "not a valid enum"),
    ({TAG: "pickle", "v": "gASV"}, "unknown tag 'pickle'"),
    ({TAG: "float", "v": "1e999"}, "not nan, inf or -inf"),
    ({TAG: "tuple", "v": "abc"}, "'v' of a tuple is not a list"),
    ({TAG: "dict", "v": [[[1], 2]]}, "not a valid dict"),
    ({TAG: "datetime", "v": "2024-01-01T00:00", "zone": "../../etc/passwd"},
     "not a valid datetime"),
    ({TAG: "bytes", "v": "***"}, "not a valid bytes"),
    ([{TAG: "timedelta", "v": [1.5, 0, 0]}], r"meta\['x'\]\[0\]: a timedelta's parts"),
])
def test_malformed_tags_are_unreadable_naming_where(entry: Any, message: str) -> None:
    with pytest.raises(UnreadableRequest, match=message):
        request_from_json(hostile(entry), make_spider())


def test_a_hostile_request_class_is_refused() -> None:
    spider = make_spider()
    for path, message in [("subprocess.Popen", "neither Scrapy's nor the project's"),
                          ("scrapy.Spider", "'scrapy.Spider' is not a Request class"),
                          ("test_codec.NotData", "is not a Request class")]:
        with pytest.raises(UnreadableRequest, match=message):
            request_from_json(json.dumps({"url": "http://shop.test/", "_class": path}), spider)


# --- entries of before ------------------------------------------------------------

#: what request_to_json wrote before the format had a version (git b3fb3c4)
OLD_ENTRY = (
    '{"url":"http://shop.test/form","callback":"parse_item","errback":"on_error",'
    '"headers":{"X-Test":["v1"],"Referer":["http://shop.test/"]},"method":"POST",'
    '"body":"AP9hPTE=","cookies":{"c":"1"},"meta":{"nested":{"a":[1,2]},'
    '"doc":{"$bc":"tuple","v":[1,2]},"depth":3},"encoding":"utf-8","priority":3,'
    '"dont_filter":false,"flags":["f"],"cb_kwargs":{"page":2},"_id":"0123456789abcdef"}')
OLD_FORM_ENTRY = (
    '{"url":"http://shop.test/s","callback":null,"errback":null,"headers":{"Content-Type":'
    '["application/x-www-form-urlencoded"]},"method":"POST","body":"cT1h","cookies":{},'
    '"meta":{},"encoding":"utf-8","priority":0,"dont_filter":false,"flags":[],"cb_kwargs":{},'
    '"_class":"scrapy.http.request.form.FormRequest","_id":"fedcba9876543210"}')


def test_entries_of_before_read_as_they_always_did() -> None:
    spider = make_spider()
    copy = request_from_json(OLD_ENTRY, spider)
    assert (copy.url, copy.method, copy.body, copy.priority) == (
        "http://shop.test/form", "POST", b"\x00\xffa=1", 3)
    assert copy.callback == spider.parse_item and copy.errback == spider.on_error
    assert copy.headers.get("X-Test") == b"v1"
    # no version: plain JSON, even where it looks like a tag
    assert copy.meta == {"nested": {"a": [1, 2]}, "doc": {TAG: "tuple", "v": [1, 2]}, "depth": 3}
    assert (copy.cookies, copy.flags, copy.cb_kwargs) == ({"c": "1"}, ["f"], {"page": 2})
    form = request_from_json(OLD_FORM_ENTRY.encode(), spider)
    assert type(form) is FormRequest and form.body == b"q=a"


def test_an_entry_of_a_later_format_is_unreadable() -> None:
    with pytest.raises(UnreadableRequest, match="entry format 3"):
        request_from_json('{"url": "http://shop.test/", "v": 3}', make_spider())


def test_spiders_without_a_crawler_still_queue() -> None:
    """What tests/faults/scenarios.py and bench/scale.py do."""
    from bloomcrawl.crawl.spiders.site import SiteSpider

    entry = json.loads(request_to_json(Request("http://shop.test/robots.txt"), Spider(name="x")))
    assert entry["url"] == "http://shop.test/robots.txt" and "callback" not in entry  # None
    spider = SiteSpider()
    request = Request("https://news.test/a", meta={"site_domains": ["news.test"], "depth": 3},
                      headers={"Referer": "https://news.test/"})
    copy = request_from_json(request_to_json(request, spider), spider)
    assert copy.meta == request.meta and copy.headers == request.headers


# --- the allow-list -----------------------------------------------------------------


def test_allow_list_entries_are_packages_or_classes() -> None:
    allowed = ClassAllowList(["scrapy", "shop", "vendor.models.Money"])
    assert allowed.allows("scrapy.item.Item")
    assert allowed.allows("shop.items.Product")
    assert allowed.allows("vendor.models.Money")
    assert not allowed.allows("vendor.models.Other")
    assert not allowed.allows("shopcrawl.items.Product")  # a prefix is a package, not a string
    assert not allowed.allows("scrapy_redis.spiders.RedisSpider")
    assert not allowed.allows("shop..x") and not allowed.allows("")
    with pytest.raises(ValueError, match="'no spaces' is not a dotted"):
        ClassAllowList(["no spaces"])


def test_allow_list_from_settings() -> None:
    allowed = ClassAllowList.from_settings(Settings({
        "SPIDER_MODULES": ["shopcrawl.spiders", "other.spiders.more"],
        "FRONTIER_SAFE_CLASSES": "pricefmt, money.Money"}))
    assert allowed.entries == ("scrapy", "shopcrawl", "other", "pricefmt", "money.Money")
    allowed = ClassAllowList.from_settings(Settings({"FRONTIER_SAFE_CLASSES": ["a.b", "c"]}))
    assert allowed.entries == ("scrapy", "a.b", "c")
    with pytest.raises(SettingError, match="FRONTIER_SAFE_CLASSES must list dotted module or"
                       " class paths, got 'a b'"):
        ClassAllowList.from_settings(Settings({"FRONTIER_SAFE_CLASSES": "a b"}))
    # the spider's settings, and its own package
    spider = make_spider(FRONTIER_SAFE_CLASSES="pricefmt")
    assert default_allow_list(spider).entries == ("scrapy", "test_codec", "pricefmt")
    assert default_allow_list(Spider(name="x")).entries == ("scrapy",)


# --- through the scheduler and Redis (the Lua scripts parse the entry for its url) -------


def test_typed_values_go_through_the_frontier(redis_server: Any, redis_client: Any) -> None:
    from bloomcrawl.crawl.scheduler import Scheduler

    crawler = get_crawler(ShopSpider, settings_dict={
        **SETTINGS, "REDIS_URL": redis_server.url, "BLOOMFILTER_CAPACITY": 10_000,
        "BLOOMFILTER_ERROR_RATE": 0.001, "BLOOMFILTER_PARTITIONS": 1,
        "SCHEDULER_LEASE_TIMEOUT": 5})
    crawler._apply_settings()
    spider = ShopSpider.from_crawler(crawler)
    crawler.spider = spider
    scheduler = build_from_crawler(Scheduler, crawler)
    disconnect_at_teardown(scheduler.server)
    scheduler.open_frontier(spider)
    item = Product(name="kettle", seen_at=NOW.replace(tzinfo=datetime.UTC))
    listing = Listing("kitchen", 1, NOW)
    assert scheduler.enqueue_request(Request("http://shop.test/p/1", callback=spider.parse_item,
                                             cb_kwargs={"item": item, "tags": ("a",)},
                                             meta={"listing": listing, 2: {3}}))
    scheduler.send_pending()
    got = scheduler.next_request()
    assert got is not None and got.url == "http://shop.test/p/1"
    assert got.callback == spider.parse_item
    assert_same(got.cb_kwargs, {"item": item, "tags": ("a",)})
    assert_same(got.meta["listing"], listing)
    assert got.meta[2] == {3}
