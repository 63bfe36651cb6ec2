"""The value codec's decoding side: queue data back into the values it was made of.

The format is described in :mod:`bloomcrawl.crawl.codec`. Everything read
here is queue data, so anything may be wrong with it: a class name is checked
against the :class:`~bloomcrawl.crawl.codec.ClassAllowList` before anything is
imported, and once imported the class must be of its tag's kind.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import uuid
import zoneinfo
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attr  # Twisted, so Scrapy, depends on attrs
from scrapy.http import Request
from scrapy.item import Item
from scrapy.utils.misc import load_object

from bloomcrawl.crawl.codec_base import (
    CACHE_LIMIT,
    SAFE_CLASSES_SETTING,
    TAG,
    CodecFailure,
    UnreadableRequest,
    attrs_fields,
    dataclass_fields,
)

if TYPE_CHECKING:
    from bloomcrawl.crawl.codec import ClassAllowList


class ValueDecoder:
    """Decodes what :class:`~bloomcrawl.crawl.codec_encoder.ValueEncoder` made, for one
    :class:`ClassAllowList`."""

    def __init__(self, allowed: ClassAllowList) -> None:
        self.allowed = allowed
        self._classes: dict[tuple[str, str], type] = {}

    def decode(self, value: Any, key: str) -> Any:
        """What the encoder was given; raises :class:`UnreadableRequest` naming ``key``.

        ``value`` is the parsed JSON, changed in place.
        """
        try:
            return self._decode(value)
        except CodecFailure as exc:
            raise UnreadableRequest("%s: %s" % (exc.where(key), exc.reason)) from exc.__cause__
        except RecursionError:
            raise UnreadableRequest("%s is nested too deeply" % key) from None

    def _decode(self, value: Any) -> Any:
        t = type(value)
        if t is dict:
            if TAG in value:
                return self._decode_tagged(value)
            for k, x in value.items():
                if type(x) is dict or type(x) is list:
                    try:
                        value[k] = self._decode(x)
                    except CodecFailure as exc:
                        exc.path.append("[%r]" % (k,))
                        raise
        elif t is list:
            for i, x in enumerate(value):
                if type(x) is dict or type(x) is list:
                    try:
                        value[i] = self._decode(x)
                    except CodecFailure as exc:
                        exc.path.append("[%d]" % i)
                        raise
        return value

    def _decode_tagged(self, value: dict[str, Any]) -> Any:
        tag = value[TAG]
        decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
        if decoder is None:
            raise CodecFailure("unknown tag %r" % (tag,))
        try:
            return decoder(self, value)
        except CodecFailure:
            raise
        except Exception as exc:  # queue data: anything may be wrong with it
            raise CodecFailure("not a valid %s (%s: %s)"
                               % (tag, type(exc).__name__, exc)) from exc

    def _decode_list(self, value: dict[str, Any], name: str = "v") -> list[Any]:
        items = value[name]
        if type(items) is not list:
            raise CodecFailure("%r of a %s is not a list" % (name, value[TAG]))
        out: list[Any] = self._decode(items)
        return out

    def _decode_fields(self, value: dict[str, Any], name: str) -> dict[str, Any]:
        fields = value.get(name, {})
        if type(fields) is not dict:
            raise CodecFailure("%r of a %s is not an object" % (name, value[TAG]))
        out: dict[str, Any] = self._decode(fields)
        if type(out) is not dict:
            raise CodecFailure("%r of a %s is not an object" % (name, value[TAG]))
        return out

    def _decode_tz(self, value: dict[str, Any],
                   parsed: datetime.datetime | datetime.time) -> Any:
        zone = value.get("zone")
        if zone is not None:
            parsed = parsed.replace(tzinfo=zoneinfo.ZoneInfo(zone))
        elif "tzname" in value:
            offset = parsed.utcoffset()
            if offset is None:
                raise CodecFailure("a time zone name %r without an offset" % (value["tzname"],))
            parsed = parsed.replace(tzinfo=datetime.timezone(offset, value["tzname"]))
        if value.get("fold"):
            parsed = parsed.replace(fold=1)
        return parsed

    def load_class(self, tag: str, path: Any) -> type:
        """The class ``path`` names for ``tag`` (``"request"``, ``"item"``, ``"dataclass"``...):
        allowed, then imported, then checked; raises :class:`UnreadableRequest`."""
        try:
            return self._load_class(tag, path)
        except CodecFailure as exc:
            raise UnreadableRequest(exc.reason) from exc.__cause__

    def _load_class(self, tag: str, path: Any) -> type:
        cls = self._classes.get((tag, path)) if isinstance(path, str) else None
        if cls is not None:
            return cls
        if not isinstance(path, str):
            raise CodecFailure("%s class %r is not a dotted path" % (tag, path))
        # checked before importing: the name comes from queue data
        if not self.allowed.allows(path):
            raise CodecFailure("%s class %r is neither Scrapy's nor the project's, nor listed in"
                               " %s: not imported" % (tag, path, SAFE_CLASSES_SETTING))
        try:
            obj = load_object(path)
        except Exception as exc:
            raise CodecFailure("%s class %r cannot be imported (%s: %s)"
                               % (tag, path, type(exc).__name__, exc)) from exc
        is_kind, what = _KINDS[tag]
        if not (isinstance(obj, type) and is_kind(obj)):
            raise CodecFailure("%r is not %s" % (path, what))
        canonical = "%s.%s" % (obj.__module__, obj.__qualname__)
        if canonical != path and not self.allowed.allows(canonical):
            # an allowed module that imported a class from elsewhere does not make it allowed
            raise CodecFailure("%r is %s, which is not allowed" % (path, canonical))
        if len(self._classes) < CACHE_LIMIT:
            self._classes[(tag, path)] = obj
        return obj


# --- the tags ---------------------------------------------------------------------


def _string(value: dict[str, Any], name: str = "v") -> str:
    text = value[name]
    if type(text) is not str:
        raise CodecFailure("%r of a %s is not a string" % (name, value[TAG]))
    return text


def _dec_dict(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    out = {}
    for pair in decoder._decode_list(value):
        if type(pair) is not list or len(pair) != 2:
            raise CodecFailure("a dict's pair is not [key, value]")
        out[pair[0]] = pair[1]
    return out


def _dec_datetime(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    return decoder._decode_tz(value, datetime.datetime.fromisoformat(_string(value)))


def _dec_time(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    return decoder._decode_tz(value, datetime.time.fromisoformat(_string(value)))


def _dec_timedelta(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    days, seconds, microseconds = value["v"]
    if not all(type(n) is int for n in (days, seconds, microseconds)):
        raise CodecFailure("a timedelta's parts are not integers")
    return datetime.timedelta(days=days, seconds=seconds, microseconds=microseconds)


def _dec_float(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    text = _string(value)
    if text not in ("nan", "inf", "-inf"):
        raise CodecFailure("a float tag holds %r, not nan, inf or -inf" % (text,))
    return float(text)


def _dec_enum(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    cls: Any = decoder._load_class("enum", value["cls"])
    if "value" in value:
        return cls(decoder._decode(value["value"]))
    return cls[_string(value)]


def _dec_item(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    cls = decoder._load_class("item", value["cls"])
    item = cls()
    for name, x in decoder._decode_fields(value, "v").items():
        item[name] = x  # KeyError for a field the class does not declare
    return item


def _dec_structure(tag: str, names: Callable[[type], Iterable[tuple[str, str, bool]]]
                   ) -> Callable[[ValueDecoder, dict[str, Any]], Any]:
    def decode(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
        cls = decoder._load_class(tag, value["cls"])
        obj = cls(**decoder._decode_fields(value, "v"))
        later = decoder._decode_fields(value, "set")
        if later:
            settable = {name for name, _, passed in names(cls) if not passed}
            for name, x in later.items():
                if name not in settable:  # never just any attribute, such as __class__
                    raise CodecFailure("%r is not a field of %s set after __init__"
                                       % (name, cls))
                object.__setattr__(obj, name, x)  # frozen ones too
        return obj

    return decode


def _dec_namedtuple(decoder: ValueDecoder, value: dict[str, Any]) -> Any:
    cls = decoder._load_class("namedtuple", value["cls"])
    return cls(*decoder._decode_list(value))


_DECODERS: dict[str, Callable[[ValueDecoder, dict[str, Any]], Any]] = {
    "tuple": lambda decoder, value: tuple(decoder._decode_list(value)),
    "set": lambda decoder, value: set(decoder._decode_list(value)),
    "frozenset": lambda decoder, value: frozenset(decoder._decode_list(value)),
    "dict": _dec_dict,
    "float": _dec_float,
    "bytes": lambda decoder, value: base64.b64decode(_string(value), validate=True),
    "bytearray": lambda decoder, value: bytearray(base64.b64decode(_string(value),
                                                                   validate=True)),
    "datetime": _dec_datetime,
    "date": lambda decoder, value: datetime.date.fromisoformat(_string(value)),
    "time": _dec_time,
    "timedelta": _dec_timedelta,
    "decimal": lambda decoder, value: decimal.Decimal(_string(value)),
    "uuid": lambda decoder, value: uuid.UUID(_string(value)),
    "enum": _dec_enum,
    "item": _dec_item,
    "dataclass": _dec_structure("dataclass", dataclass_fields),
    "attrs": _dec_structure("attrs", attrs_fields),
    "namedtuple": _dec_namedtuple,
}


def _is_attrs(cls: type) -> bool:
    return bool(attr.has(cls))


#: what a class named by each tag must be, once imported
_KINDS: dict[str, tuple[Callable[[type], bool], str]] = {
    "request": (lambda cls: issubclass(cls, Request), "a Request class"),
    "enum": (lambda cls: issubclass(cls, enum.Enum), "an Enum"),
    "item": (lambda cls: issubclass(cls, Item), "a scrapy.Item class"),
    "dataclass": (dataclasses.is_dataclass, "a dataclass"),
    "attrs": (_is_attrs, "an attrs class"),
    "namedtuple": (lambda cls: issubclass(cls, tuple)
                   and isinstance(getattr(cls, "_fields", None), tuple), "a named tuple"),
}
