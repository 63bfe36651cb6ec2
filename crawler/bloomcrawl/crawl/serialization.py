"""Requests as JSON queue entries: never pickle, so reading Redis is not running code.

Callbacks and errbacks travel by name and are looked up on the spider's
class, never on the instance or anywhere else. A name is accepted when
``inspect.getattr_static`` finds a plain function for it in the class's MRO: a
method the spider's class or one of its bases defines, public or ``_private``
(name-mangled ``_Cls__x`` too), which covers every method a user writes,
``parse`` and ``_parse``, CrawlSpider's ``_callback``, ``_errback`` and
``parse_start_url``, SitemapSpider's ``_parse_sitemap`` and the feed spiders'
``_parse``. Refused are dunders (``__init__``...), anything that is not a plain
function on the class (an instance attribute, a staticmethod, classmethod or
property, a value), and spider machinery: ``closed``, ``start`` and
``start_requests`` of any spider, and every other name that a Scrapy or
scrapy-redis class in the spider's MRO defines (``scrapy.Spider``'s
``from_crawler``, ``_set_crawler``, ``update_settings``, ``handles_request``,
``close``, ``log``, ``logger``...; CrawlSpider's ``_compile_rules``,
``_requests_to_follow``, ``_build_request``, ``parse_with_rules``,
``_parse_response``, ``_handle_failure``...; the feed spiders' ``parse_node``,
``parse_row``...; RedisMixin's ``setup_redis``, ``next_requests``,
``make_request_from_data``, ``schedule_next_requests``, ``spider_idle``,
``pop_list_queue``, ``pop_priority_queue``...). The decision is made once
per spider class and name. A request whose callback the rule refuses, or
that is not a method of the spider at all (a lambda), is refused when it is
queued.

A queue entry is a JSON object holding what ``Request.to_dict`` gives:
``url``, ``callback`` and ``errback`` (names), ``headers`` (latin-1 strings),
``body`` (base64), ``method``, ``cookies``, ``meta`` (without bloomcrawl's
internal keys), ``encoding``, ``priority``, ``dont_filter``, ``flags``,
``cb_kwargs``, the extra attributes of a Request subclass and its ``_class``;
then ``_id`` (random, so identical ``dont_filter`` requests stay distinct in
a zset) and ``"v": 2``. A plain ``scrapy.Request``'s entry leaves out the
fields that hold their default (no callback, GET, utf-8, empty, 0, false):
a third of a typical link's entry, in every queue's memory and every
exchange. A field left out is read as its default, by this version and by
every one before it. Values are plain JSON when they are plain JSON, else
tagged objects (:mod:`bloomcrawl.crawl.codec`). Entries without ``"v"``
(written before tags existed) are read as plain JSON, tags or not. The Lua
scripts read ``url`` only.

Classes named in an entry (a Request subclass, an Item, a dataclass...) must
be Scrapy's, the project's (the top-level packages of SPIDER_MODULES and of
the spider's own module) or listed in FRONTIER_SAFE_CLASSES
(:class:`~bloomcrawl.crawl.codec.ClassAllowList`).
"""

from __future__ import annotations

import base64
import inspect
import json
import math
import os
import sys
import types
import weakref
from typing import TYPE_CHECKING, Any

from scrapy import Request as ScrapyRequest

from bloomcrawl.crawl.codec import (
    SAFE_CLASSES_SETTING,
    TAG,
    ClassAllowList,
    UnreadableRequest,
    UnserializableRequest,
    ValueCodec,
    codec_for,
)
from bloomcrawl.crawl.lease import INTERNAL_META_KEYS, VISIT_META_KEY

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider

__all__ = [
    "ClassAllowList",
    "UnreadableRequest",
    "UnserializableRequest",
    "check_callback",
    "check_request_class",
    "default_allow_list",
    "priority_score",
    "request_from_json",
    "request_to_json",
]

#: the entry format this module writes (entries without a version are read as plain JSON)
FORMAT_VERSION = 2
VERSION_KEY = "v"
#: top-level keys of an entry that are not Request attributes
_ENTRY_KEYS = frozenset({"_class", "_id", VERSION_KEY})
#: attributes stored without the codec (url is what the Lua scripts read)
_OWN_FIELDS = frozenset({"url", "callback", "errback", "headers", "body", "meta"})
_PLAIN = frozenset({str, int, bool, type(None)})
#: what a plain ``scrapy.Request``'s entry leaves out: these fields when empty, 0 or False
#: (their defaults), and those when they hold their default text; any other field (a
#: later Scrapy's) is always kept
_EMPTY_BY_DEFAULT = frozenset({"headers", "body", "cookies", "meta", "priority",
                               "dont_filter", "flags", "cb_kwargs"})
_DEFAULT_TEXT = {"method": "GET", "encoding": "utf-8"}
_NO_DEFAULT = object()
_TAG_TEXT = json.dumps(TAG)  # '"$bc"': no tag anywhere in an entry without it
_TAG_BYTES = _TAG_TEXT.encode("ascii")

# the values were walked by the codec: no NaN, no cycle is left to check for
_dumps = json.JSONEncoder(allow_nan=False, check_circular=False, separators=(",", ":")).encode

#: the callbacks Scrapy's own spiders name; every other name a Scrapy or scrapy-redis
#: class defines is machinery
SCRAPY_CALLBACKS = frozenset({"parse", "_parse", "_callback", "_errback", "parse_start_url",
                              "_parse_sitemap"})
#: lifecycle names of every spider, defined by the Scrapy version installed or not
SPIDER_LIFECYCLE = frozenset({"start", "start_requests", "closed", "make_requests_from_url",
                              "from_crawler", "_set_crawler", "update_settings",
                              "handles_request", "close", "log", "logger"})
_FRAMEWORKS = ("scrapy", "scrapy_redis")
_REFUSALS_PER_CLASS = 256  # names come from queue data: remember only so many refused


def _framework_class(cls: type) -> bool:
    module = cls.__module__
    return any(module == name or module.startswith(name + ".") for name in _FRAMEWORKS)


class _SpiderMethods:
    """What the callback rule decided for one spider class, by name and by function."""

    __slots__ = ("__weakref__", "by_function", "by_name", "cls", "machinery")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        machinery = set(SPIDER_LIFECYCLE)
        for base in cls.__mro__:
            if _framework_class(base):
                machinery.update(vars(base))
        self.machinery = frozenset(machinery - SCRAPY_CALLBACKS)
        self.by_name: dict[str, types.FunctionType | str] = {}
        self.by_function: dict[Any, str | tuple[str]] = {}

    def function(self, name: Any) -> types.FunctionType:
        """The function ``name`` may call; raises :class:`UnreadableRequest`."""
        decision = self.by_name.get(name) if type(name) is str else None
        if decision is None:
            decision = self._decide(name)
            if type(name) is str and (not isinstance(decision, str)
                                      or len(self.by_name) < _REFUSALS_PER_CLASS):
                self.by_name[name] = decision
        if isinstance(decision, str):
            raise UnreadableRequest(decision)
        return decision

    def _decide(self, name: Any) -> types.FunctionType | str:
        spider = self.cls.__qualname__
        if not isinstance(name, str) or not name.isidentifier():
            return "callback %r is not a method name" % (name,)
        if name.startswith("__") and name.endswith("__"):
            return "callback %r is a special method, never a callback" % (name,)
        if name in self.machinery:
            return ("callback %r is spider machinery (%s), never a callback"
                    % (name, self._defined_by(name)))
        found = inspect.getattr_static(self.cls, name, None)
        if found is None:
            return "callback %r is not a method of spider class %s" % (name, spider)
        if not inspect.isfunction(found):
            return ("callback %r is not a method of spider class %s: it is a %s"
                    % (name, spider, type(found).__name__))
        return found

    def _defined_by(self, name: str) -> str:
        for base in self.cls.__mro__:
            if _framework_class(base) and name in vars(base):
                return "%s.%s" % (base.__module__, base.__qualname__)
        return "a spider's lifecycle"

    def name_of(self, func: Any, key: str) -> str:
        """The name a bound method is stored as; raises :class:`UnserializableRequest`."""
        target = getattr(func, "__func__", None)
        decision = self.by_function.get(target) if target is not None else None
        if decision is None:
            decision = self._name_of(target, func)
            if target is not None:
                self.by_function[target] = decision  # keyed by functions: bounded by code
        if isinstance(decision, tuple):  # why not, after the key and the callback
            raise UnserializableRequest("%s %r %s" % (key, func, decision[0]), key=key,
                                        kind="callback")
        return decision

    def _name_of(self, target: Any, func: Any) -> str | tuple[str]:
        not_a_method = ("is not a method of spider class %s" % self.cls.__qualname__,)
        if not inspect.isfunction(target):
            return not_a_method
        name: str = target.__name__
        candidates = [name]
        if name.startswith("__") and not name.endswith("__"):  # name-mangled
            owner = target.__qualname__.rpartition(".")[0].rpartition(".")[2]
            candidates.insert(0, "_%s%s" % (owner.lstrip("_"), name))
        candidates += [n for base in self.cls.__mro__ for n, v in vars(base).items()
                       if v is target]  # an alias, or a decorator that renamed it
        for candidate in candidates:
            if inspect.getattr_static(self.cls, candidate, None) is target:
                try:
                    self.function(candidate)
                except UnreadableRequest as exc:
                    return ("is refused: %s" % exc,)
                return candidate
        return not_a_method


_SPIDER_METHODS: weakref.WeakKeyDictionary[type, _SpiderMethods] = weakref.WeakKeyDictionary()


def _methods(cls: type) -> _SpiderMethods:
    methods = _SPIDER_METHODS.get(cls)
    if methods is None:
        methods = _SPIDER_METHODS[cls] = _SpiderMethods(cls)
    return methods


def check_callback(spider: Spider, name: Any) -> Callable[..., Any]:
    """The spider's method ``name``, if the callback rule (module docstring) accepts it.

    Anyone who can write to Redis can write a queue entry: naming ``__init__``
    or any other attribute must not make a worker call it. The method is
    bound from the class, so an instance attribute cannot stand in for it.
    Raises :class:`UnreadableRequest`.
    """
    return types.MethodType(_methods(type(spider)).function(name), spider)


# --- which classes an entry may name --------------------------------------------

_DEFAULT_LISTS: weakref.WeakKeyDictionary[Spider, tuple[object, ClassAllowList]] = (
    weakref.WeakKeyDictionary())


def default_allow_list(spider: Spider) -> ClassAllowList:
    """Scrapy, the spider's own top-level package, and with a crawler, its settings'
    (SPIDER_MODULES' packages, FRONTIER_SAFE_CLASSES); built once per spider."""
    crawler = getattr(spider, "crawler", None)
    cached = _DEFAULT_LISTS.get(spider)
    if cached is not None and cached[0] is crawler:
        return cached[1]
    own = type(spider).__module__.split(".")[0]
    if crawler is not None:
        allowed = ClassAllowList.from_settings(crawler.settings).extended(own)
    else:
        allowed = ClassAllowList(["scrapy", own])
    _DEFAULT_LISTS[spider] = (crawler, allowed)
    return allowed


def check_request_class(spider: Spider, path: Any,
                        allowed: ClassAllowList | None = None) -> type[Request]:
    """The Request subclass ``path`` names, if allowed: nothing else is imported."""
    if not isinstance(path, str):
        raise UnreadableRequest("request class %r is not a dotted path" % (path,))
    if allowed is None:
        allowed = default_allow_list(spider)
    if not allowed.allows(path):
        raise UnreadableRequest("request class %r is neither Scrapy's nor the project's, nor"
                                " listed in %s: not imported" % (path, SAFE_CLASSES_SETTING))
    cls: type[Request] = codec_for(allowed).load_class("request", path)
    return cls


class _Layout:
    """How one Request class is stored: its ``_class`` and its attributes, in order."""

    __slots__ = ("fields", "own_init", "path")

    def __init__(self, cls: type[Request]) -> None:
        clashes = _ENTRY_KEYS.intersection(cls.attributes)
        if clashes:
            raise UnserializableRequest(
                "its class %s has attributes named like bloomcrawl's own keys of an entry: %s"
                % (cls.__qualname__, sorted(clashes)), key="_class", kind=cls.__qualname__)
        self.path = None if cls is ScrapyRequest else "%s.%s" % (cls.__module__, cls.__name__)
        self.fields = tuple(a for a in cls.attributes if a not in ("url", "callback", "errback"))
        # a constructor of the project's own: a reader calls it with the attributes stored
        own = (k for k in cls.__mro__[:cls.__mro__.index(ScrapyRequest)] if "__init__" in vars(k))
        self.own_init = any(not k.__module__.startswith("scrapy.") for k in own)


_LAYOUTS: weakref.WeakKeyDictionary[type, _Layout] = weakref.WeakKeyDictionary()


def _layout(cls: type[Request]) -> _Layout:
    layout = _LAYOUTS.get(cls)
    if layout is None:
        layout = _LAYOUTS[cls] = _Layout(cls)
    return layout


def _check_request_class_path(cls: type[Request], path: str, allowed: ClassAllowList) -> None:
    if not allowed.allows(path):
        raise UnserializableRequest(
            "its class %s is neither Scrapy's nor the project's: add %r (or its package) to %s"
            % (path, path, SAFE_CLASSES_SETTING), key="_class", kind=path)
    module = sys.modules.get(cls.__module__)
    if getattr(module, cls.__name__, None) is not cls:
        raise UnserializableRequest("its class %s cannot be imported by that name" % path,
                                    key="_class", kind=path)


# --- entries ------------------------------------------------------------------


def request_to_json(request: Request, spider: Spider,
                    allowed: ClassAllowList | None = None) -> str:
    """The queue entry of ``request``; raises :class:`UnserializableRequest`.

    ``allowed`` defaults to :func:`default_allow_list`.
    """
    try:
        codec = codec_for(allowed if allowed is not None else default_allow_list(spider))
        return _dumps(_entry(request, spider, codec))
    except UnserializableRequest as exc:
        raise UnserializableRequest("cannot queue %s: %s" % (request, exc), key=exc.key,
                                    kind=exc.kind) from None


def _headers(request: Request) -> dict[str, list[str]]:
    # dict() of Headers gives each name's list of values (its __getitem__, the last one)
    raw: dict[bytes, list[bytes]] = dict(request.headers)
    return {k.decode("latin-1"): [v.decode("latin-1") for v in vs] for k, vs in raw.items()}


def _entry(request: Request, spider: Spider, codec: ValueCodec,
           check: bool = True) -> dict[str, Any]:
    cls = type(request)
    layout = _layout(cls)
    methods = _methods(type(spider))
    callback, errback = request.callback, request.errback
    # a plain Request leaves out what its constructor gives anyway (no callback, GET,
    # utf-8, empty headers...): every reader rebuilds it with the constructor's
    # defaults. A subclass's constructor may derive one from another (a JsonRequest
    # with a body is a POST unless told GET), so its entries keep every field
    compact = layout.path is None
    entry: dict[str, Any] = {"url": request.url}
    if callback is not None or not compact:
        entry["callback"] = (methods.name_of(callback, "callback") if callable(callback)
                             else callback)
    if errback is not None or not compact:
        entry["errback"] = methods.name_of(errback, "errback") if callable(errback) else errback
    for name in layout.fields:
        value = getattr(request, name)
        if compact and ((not value and name in _EMPTY_BY_DEFAULT)
                        or value == _DEFAULT_TEXT.get(name, _NO_DEFAULT)):
            continue
        if name == "headers":
            entry[name] = _headers(request)
        elif name == "body":
            entry[name] = base64.b64encode(value).decode("ascii") if value else ""
        elif name == "meta":
            if not INTERNAL_META_KEYS.isdisjoint(value):
                value = {k: v for k, v in value.items() if k not in INTERNAL_META_KEYS}
                if compact and not value:
                    continue
            entry[name] = codec.encode(value, name)
        else:
            entry[name] = value if type(value) in _PLAIN else codec.encode(value, name)
    if layout.path is not None:
        _check_request_class_path(cls, layout.path, codec.allowed)
        entry["_class"] = layout.path
    # identical dont_filter requests stay distinct in a zset; one a page crawled twice made
    # twice is one entry (its visit)
    entry["_id"] = request.meta.get(VISIT_META_KEY) or os.urandom(8).hex()
    entry[VERSION_KEY] = FORMAT_VERSION
    if layout.own_init and check:
        _check_rebuilt(entry, spider, codec)
    return entry


def _check_rebuilt(entry: dict[str, Any], spider: Spider, codec: ValueCodec) -> None:
    """A request of a class with a constructor of its own (which takes other arguments,
    say): built again from its entry here, as a reader will, it must make the same entry;
    else no worker could read it, and it stays with the one that made it."""
    path = entry["_class"]
    try:
        again = _entry(request_from_json(_dumps(entry), spider, codec.allowed), spider, codec,
                       check=False)
    except Exception as exc:  # the project's constructor: anything
        raise UnserializableRequest(
            "its class %s cannot be built again from the attributes a queue entry holds"
            " (%s: %s)" % (path, type(exc).__name__, exc), key="_class", kind=path) from None
    again["_id"] = entry["_id"]
    if again != entry:
        raise UnserializableRequest(
            "its class %s, built again from the attributes a queue entry holds, is another"
            " request (its constructor changes them)" % path, key="_class", kind=path)


def request_from_json(data: str | bytes, spider: Spider,
                      allowed: ClassAllowList | None = None) -> Request:
    """The request a queue entry describes; raises :class:`UnreadableRequest`.

    ``allowed`` defaults to :func:`default_allow_list`.
    """
    try:
        d = json.loads(data)
    except ValueError as exc:
        raise UnreadableRequest("not JSON: %s" % exc) from exc
    if type(d) is not dict:
        raise UnreadableRequest("not a JSON object")
    version = d.pop(VERSION_KEY, None)
    if version not in (None, FORMAT_VERSION):
        raise UnreadableRequest("entry format %r is not one this bloomcrawl reads" % (version,))
    if allowed is None:
        allowed = default_allow_list(spider)
    request_cls: type[Request] = ScrapyRequest
    if "_class" in d:
        request_cls = check_request_class(spider, d["_class"], allowed)
    kwargs = {name: d[name] for name in request_cls.attributes if name in d}
    if version is not None and (_TAG_BYTES in data if isinstance(data, bytes)
                                else _TAG_TEXT in data):
        codec = codec_for(allowed)
        for name, value in kwargs.items():
            if (type(value) is dict or type(value) is list) and (
                    name not in _OWN_FIELDS or name == "meta"):
                kwargs[name] = codec.decode(value, name)
    methods = _methods(type(spider))
    for name in ("callback", "errback"):
        if kwargs.get(name):
            kwargs[name] = types.MethodType(methods.function(kwargs[name]), spider)
        else:
            kwargs.pop(name, None)
    try:
        body = kwargs.get("body") or ""
        kwargs["body"] = base64.b64decode(body) if body else b""
        # latin-1 both ways: the bytes come back as they were, whatever they are
        kwargs["headers"] = {k.encode("latin-1"): [v.encode("latin-1") for v in vs]
                             for k, vs in (kwargs.get("headers") or {}).items()}
        return request_cls(**kwargs)
    except (TypeError, ValueError, AttributeError) as exc:
        raise UnreadableRequest("cannot build a %s from it: %s" % (request_cls.__name__, exc)
                                ) from exc


def entry_id(payload: bytes | str) -> str:
    """The id of a queue entry (``_id``: random, one per entry written), read without
    parsing it: the last ``"_id"`` key, written after every field; "" when it has none."""
    raw = payload.encode() if isinstance(payload, str) else payload
    at = raw.rfind(b'"_id":"')
    return raw[at + 7:raw.find(b'"', at + 7)].decode("ascii", "replace") if at >= 0 else ""


def priority_score(request: Request) -> float:
    """Sort key for the priority queue: highest priority pops first (ZPOPMIN)."""
    try:
        score = -float(request.priority)
    except OverflowError:  # an int beyond a float: first or last of all
        score = -math.inf if request.priority > 0 else math.inf
    if math.isnan(score):
        return 0.0
    return score
