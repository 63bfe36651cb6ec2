"""Requests as JSON: never pickle, so writing to Redis is not running code.

Callbacks and errbacks travel by name (spider methods only); meta and
cb_kwargs must be JSON-safe. A request that is not raises
:class:`UnserializableRequest` naming the request and the offending key.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from typing import TYPE_CHECKING, Any

from scrapy import Request as ScrapyRequest
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

from bloomcrawl.crawl.lease import INTERNAL_META_KEYS

if TYPE_CHECKING:
    from scrapy import Request, Spider


class UnserializableRequest(ValueError):
    """A request bloomcrawl cannot store as JSON."""


def _check_json(value: Any, where: str, request: Request) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UnserializableRequest(
            "cannot queue %s: %s is not JSON-serializable (%s)" % (request, where, exc)
        ) from exc


def _find_bad_key(mapping: dict[str, Any], name: str, request: Request) -> None:
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise UnserializableRequest(
                "cannot queue %s: %s key %r is not a string" % (request, name, key))
        _check_json(value, "%s[%r]" % (name, key), request)


def request_to_json(request: Request, spider: Spider) -> str:
    """Serialize ``request``; raises :class:`UnserializableRequest`."""
    try:
        d = request.to_dict(spider=spider)
    except ValueError as exc:
        raise UnserializableRequest("cannot queue %s: %s" % (request, exc)) from exc
    meta = {k: v for k, v in (d.get("meta") or {}).items() if k not in INTERNAL_META_KEYS}
    d["meta"] = meta
    body = d.get("body") or b""
    d["body"] = base64.b64encode(body).decode("ascii") if body else ""
    d["headers"] = {
        k.decode("latin-1"): [v.decode("latin-1") for v in vs]
        for k, vs in (d.get("headers") or {}).items()
    }
    d["_id"] = uuid.uuid4().hex[:16]  # identical dont_filter requests stay distinct in a zset
    try:
        return json.dumps(d, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        _find_bad_key(meta, "meta", request)
        _find_bad_key(d.get("cb_kwargs") or {}, "cb_kwargs", request)
        for key in ("cookies", "flags"):
            _check_json(d.get(key), key, request)
        raise UnserializableRequest("cannot queue %s: not JSON-serializable" % (request,)) from None


class UnreadableRequest(ValueError):
    """A queue entry bloomcrawl will not turn into a request; the message says why."""


def check_callback(spider: Spider, name: Any) -> None:
    """Only a public method of the spider's class may be named as a callback or errback.

    Anyone who can write to Redis can write a queue entry: naming ``__init__``
    or any other attribute must not make a worker call it.
    """
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise UnreadableRequest("callback %r is not a public spider method name" % (name,))
    if not callable(getattr(type(spider), name, None)):
        raise UnreadableRequest("callback %r is not a method of spider %r" % (name, spider.name))


def check_request_class(spider: Spider, path: Any) -> None:
    """A request class must be Scrapy's or the spider's own: nothing else is imported."""
    if not isinstance(path, str):
        raise UnreadableRequest("request class %r is not a dotted path" % (path,))
    module = path.rpartition(".")[0]
    own = type(spider).__module__
    if not (module == "scrapy" or module.startswith("scrapy.") or module == own):
        raise UnreadableRequest("request class %r is neither Scrapy's nor in %s" % (path, own))
    cls = load_object(path)
    if not (isinstance(cls, type) and issubclass(cls, ScrapyRequest)):
        raise UnreadableRequest("%r is not a Request class" % (path,))


def request_from_json(data: str | bytes, spider: Spider) -> Request:
    """The request a queue entry describes; raises :class:`UnreadableRequest` (or ValueError)."""
    d = json.loads(data)
    if not isinstance(d, dict):
        raise UnreadableRequest("not a JSON object")
    for key in ("callback", "errback"):
        if d.get(key):
            check_callback(spider, d[key])
    if "_class" in d:
        check_request_class(spider, d["_class"])
    d.pop("_id", None)
    body = d.get("body") or ""
    d["body"] = base64.b64decode(body) if body else b""
    d["headers"] = {k: vs for k, vs in (d.get("headers") or {}).items()}
    return request_from_dict(d, spider=spider)


def priority_score(request: Request) -> float:
    """Sort key for the priority queue: highest priority pops first (ZPOPMIN)."""
    try:
        score = -float(request.priority)
    except OverflowError:  # an int beyond a float: first or last of all
        score = -math.inf if request.priority > 0 else math.inf
    if math.isnan(score):
        return 0.0
    return score
