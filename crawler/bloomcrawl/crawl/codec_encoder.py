"""The value codec's encoding side: a request's values into JSON-ready data.

The format is described in :mod:`bloomcrawl.crawl.codec`. The encoder decides
once per class how its instances are stored, or why they cannot be; the
classes come from code, not from queue data, so that memory is bounded by the
code loaded.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import enum
import inspect
import sys
import uuid
import zoneinfo
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attr  # Twisted, so Scrapy, depends on attrs
from scrapy.item import Item

from bloomcrawl.crawl.codec_base import (
    SAFE_CLASSES_SETTING,
    TAG,
    CodecFailure,
    Fields,
    UnserializableRequest,
    attrs_fields,
    dataclass_fields,
    type_name,
)

if TYPE_CHECKING:
    from bloomcrawl.crawl.codec import ClassAllowList

_SCALARS: frozenset[type] = frozenset({str, int, bool, type(None)})
_SUPPORTED = ("JSON values, Items, dataclasses, attrs classes, Enums, named tuples, tuples,"
              " sets, bytes, datetime/date/time/timedelta, Decimal and UUID")


class _Refused:
    """A class the encoder will not store, and why (the value's key is added later)."""

    __slots__ = ("kind", "reason")

    def __init__(self, reason: str, kind: str) -> None:
        self.reason = reason
        self.kind = kind


class _Layout:
    """How a class's instances are stored: its tag, path and fields."""

    __slots__ = ("fields", "path", "tag")

    def __init__(self, tag: str, path: str, fields: Fields = ()) -> None:
        self.tag = tag
        self.path = path
        self.fields = fields  # (attribute, init parameter, passed to __init__)


def _importable(cls: type) -> bool:
    """Whether ``load_object("<module>.<qualname>")`` gives ``cls`` back."""
    name = cls.__qualname__
    return "." not in name and getattr(sys.modules.get(cls.__module__), name, None) is cls


def _takes_only_fields(cls: type, fields: Fields) -> bool:
    """Whether ``cls(**init fields)`` can be called: no required InitVar, say."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {param for _, param, passed in fields if passed}
    return all(p.name in names or p.default is not p.empty
               or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)


class ValueEncoder:
    """Encodes values into JSON-ready ones, for one :class:`ClassAllowList`.

    :meth:`encode` returns a plain value unchanged (the same object): a dict of
    strings and numbers costs one look at each value.
    """

    def __init__(self, allowed: ClassAllowList) -> None:
        self.allowed = allowed
        self._layouts: dict[type, _Layout | _Refused] = {}

    def encode(self, value: Any, key: str) -> Any:
        """``value`` as JSON-ready data; raises :class:`UnserializableRequest` naming ``key``."""
        try:
            return self._encode(value)
        except CodecFailure as exc:
            where = exc.where(key)
            raise UnserializableRequest("%s %s" % (where, exc.reason), key=where,
                                        kind=exc.kind) from None
        except RecursionError:
            raise UnserializableRequest("%s is nested too deeply (or contains itself)" % key,
                                        key=key, kind="recursion") from None

    def _encode(self, value: Any) -> Any:
        t = type(value)
        if t in _SCALARS:
            return value
        if t is float:
            return value if value - value == 0.0 else {TAG: "float", "v": repr(value)}
        if t is dict:
            return self._encode_dict(value)
        if t is list:
            return self._encode_list(value)
        encoder = _ENCODERS.get(t)
        if encoder is not None:
            return encoder(self, value)
        return self._encode_object(value, t)

    def _encode_dict(self, value: dict[Any, Any]) -> Any:
        out = None
        for k, x in value.items():
            if type(k) is not str or k == TAG:
                return self._encode_pairs(value)
            t = type(x)
            if t in _SCALARS or (t is float and x - x == 0.0):
                continue
            try:
                y = self._encode(x)
            except CodecFailure as exc:
                exc.path.append("[%r]" % (k,))
                raise
            if y is not x:
                if out is None:
                    out = dict(value)  # the request's own dict stays as it was
                out[k] = y
        return value if out is None else out

    def _encode_pairs(self, value: dict[Any, Any]) -> dict[str, Any]:
        pairs = []
        for k, x in value.items():
            try:
                ek = self._encode(k)
            except CodecFailure as exc:
                exc.path.append("[%r] (the key)" % (k,))
                raise
            try:
                pairs.append([ek, self._encode(x)])
            except CodecFailure as exc:
                exc.path.append("[%r]" % (k,))
                raise
        return {TAG: "dict", "v": pairs}

    def _encode_list(self, value: list[Any]) -> list[Any]:
        out = None
        for i, x in enumerate(value):
            t = type(x)
            if t in _SCALARS or (t is float and x - x == 0.0):
                continue
            try:
                y = self._encode(x)
            except CodecFailure as exc:
                exc.path.append("[%d]" % i)
                raise
            if y is not x:
                if out is None:
                    out = list(value)
                out[i] = y
        return value if out is None else out

    def _encode_members(self, value: Iterable[Any]) -> list[Any]:
        out = []
        for x in value:
            try:
                out.append(self._encode(x))
            except CodecFailure as exc:
                exc.path.append("{...}")
                raise
        return out

    def _encode_object(self, value: Any, t: type) -> Any:
        layout = self._layouts.get(t)
        if layout is None:
            layout = self._layouts[t] = self._layout(t)  # keyed by classes: bounded by code
        if isinstance(layout, _Refused):
            raise CodecFailure(layout.reason, layout.kind)
        tag = layout.tag
        if tag == "scalar":
            # the base class's own conversion: an exact str, int or float, whatever the
            # subclass's __str__ says
            if isinstance(value, str):
                return str.__str__(value)
            if isinstance(value, int):
                return int.__int__(value)
            return self._encode(float.__float__(value))
        if tag == "item":
            return {TAG: tag, "cls": layout.path, "v": self._encode_dict(dict(value))}
        if tag == "enum":
            if t.__members__.get(value.name) is value:  # type: ignore[attr-defined]
                return {TAG: tag, "cls": layout.path, "v": value.name}
            # a combination of flags has no name of its own
            return {TAG: tag, "cls": layout.path, "value": self._encode(value.value)}
        if tag == "namedtuple":
            return {TAG: tag, "cls": layout.path, "v": self._encode_list(list(value))}
        init: dict[str, Any] = {}
        later: dict[str, Any] = {}
        for name, param, passed in layout.fields:
            try:
                x = getattr(value, name)
            except AttributeError:  # an init=False field that was never set
                continue
            try:
                y = self._encode(x)
            except CodecFailure as exc:
                exc.path.append("." + name)
                raise
            if passed:
                init[param] = y
            else:
                later[name] = y
        out = {TAG: tag, "cls": layout.path, "v": init}
        if later:
            out["set"] = later
        return out

    def _layout(self, t: type) -> _Layout | _Refused:
        kind = type_name(t)
        fields: Fields = ()
        if issubclass(t, enum.Enum):
            tag = "enum"
        elif issubclass(t, str | int | float):
            # lxml's smart strings (CrawlSpider's link_text), numpy's float64: the value is
            # what matters, and JSON always stored them as the plain type
            return _Layout("scalar", "", ())
        elif issubclass(t, Item):
            tag = "item"
        elif dataclasses.is_dataclass(t):
            tag, fields = "dataclass", dataclass_fields(t)
        elif attr.has(t):
            tag, fields = "attrs", attrs_fields(t)
        elif issubclass(t, tuple) and isinstance(getattr(t, "_fields", None), tuple):
            tag = "namedtuple"
        else:
            return _Refused("is of type %s, which a queue entry cannot hold (it holds %s)"
                            % (kind, _SUPPORTED), kind)
        if not _importable(t):
            return _Refused("is of type %s, a class that cannot be imported by its name"
                            " (defined in a function or in another class?)" % kind, kind)
        if fields and not _takes_only_fields(t, fields):
            return _Refused("is of type %s, whose __init__ takes more than its fields (an"
                            " InitVar?): it cannot be built again from them" % kind, kind)
        path = "%s.%s" % (t.__module__, t.__qualname__)
        if not self.allowed.allows(path):
            return _Refused("is of type %s, a class bloomcrawl may not rebuild from a queue"
                            " entry: add %r (or its package) to %s"
                            % (kind, path, SAFE_CLASSES_SETTING), kind)
        return _Layout(tag, path, fields)

    def _encode_tz(self, tz: datetime.tzinfo, out: dict[str, Any], what: str,
                   value: datetime.datetime | datetime.time) -> None:
        if type(tz) is datetime.timezone:
            name = tz.tzname(None)
            if name != datetime.timezone(tz.utcoffset(None)).tzname(None):
                out["tzname"] = name
            out["v"] = value.isoformat()
        elif type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
            out["v"] = value.replace(tzinfo=None).isoformat()
            out["zone"] = tz.key
        else:
            kind = type_name(type(tz))
            raise CodecFailure("is a %s in a %s time zone: only datetime.timezone offsets and"
                               " zoneinfo.ZoneInfo zones (with a key) can be stored"
                               % (what, kind), kind)


# --- the tags, by type ----------------------------------------------------------------


def _enc_tuple(encoder: ValueEncoder, value: tuple[Any, ...]) -> Any:
    return {TAG: "tuple", "v": encoder._encode_list(list(value))}


def _enc_set(encoder: ValueEncoder, value: set[Any]) -> Any:
    return {TAG: "set", "v": encoder._encode_members(value)}


def _enc_frozenset(encoder: ValueEncoder, value: frozenset[Any]) -> Any:
    return {TAG: "frozenset", "v": encoder._encode_members(value)}


def _enc_bytes(encoder: ValueEncoder, value: bytes) -> Any:
    return {TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}


def _enc_bytearray(encoder: ValueEncoder, value: bytearray) -> Any:
    return {TAG: "bytearray", "v": base64.b64encode(value).decode("ascii")}


def _enc_clock(tag: str, encoder: ValueEncoder, value: datetime.datetime | datetime.time
               ) -> Any:
    """A datetime or a time: naive as ISO text, aware with its zone, and its fold."""
    out: dict[str, Any] = {TAG: tag}
    if value.tzinfo is None:
        out["v"] = value.isoformat()
    else:
        encoder._encode_tz(value.tzinfo, out, tag, value)
    if value.fold:
        out["fold"] = 1
    return out


def _enc_datetime(encoder: ValueEncoder, value: datetime.datetime) -> Any:
    return _enc_clock("datetime", encoder, value)


def _enc_time(encoder: ValueEncoder, value: datetime.time) -> Any:
    return _enc_clock("time", encoder, value)


def _enc_date(encoder: ValueEncoder, value: datetime.date) -> Any:
    return {TAG: "date", "v": value.isoformat()}


def _enc_timedelta(encoder: ValueEncoder, value: datetime.timedelta) -> Any:
    return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}


def _enc_decimal(encoder: ValueEncoder, value: decimal.Decimal) -> Any:
    return {TAG: "decimal", "v": str(value)}


def _enc_uuid(encoder: ValueEncoder, value: uuid.UUID) -> Any:
    return {TAG: "uuid", "v": str(value)}


#: by exact type: a subclass (an OrderedDict, a str Enum) is not what its base is
_ENCODERS: dict[type, Callable[[ValueEncoder, Any], Any]] = {
    tuple: _enc_tuple,
    set: _enc_set,
    frozenset: _enc_frozenset,
    bytes: _enc_bytes,
    bytearray: _enc_bytearray,
    datetime.datetime: _enc_datetime,
    datetime.date: _enc_date,
    datetime.time: _enc_time,
    datetime.timedelta: _enc_timedelta,
    decimal.Decimal: _enc_decimal,
    uuid.UUID: _enc_uuid,
}
