"""The values a request carries (meta, cb_kwargs, cookies, ...) as JSON, with their types.

Plain JSON values (``str``, ``int``, finite ``float``, ``bool``, ``None``,
lists, dicts with ``str`` keys) are stored as they are, so a queue entry stays
text anyone can read; so are subclasses of ``str``, ``int`` and ``float`` that
are not Enums (lxml's smart strings, numpy's ``float64``), which come back as
the plain type, as they always did in JSON. Subclasses of the containers
(``OrderedDict``, ``defaultdict``) are refused: they would come back as
something else. Anything else is a tagged object, ``{"$bc": <tag>, ...}``:

============== ==========================================================
tag            stored as
============== ==========================================================
``tuple``      ``"v": [...]``
``set``        ``"v": [...]`` (also ``frozenset``)
``dict``       ``"v": [[key, value], ...]``: a dict with a key that is not
               a ``str`` (``1`` stays ``1``, never ``"1"``) or that is
               ``"$bc"`` itself
``float``      ``"v": "nan"``, ``"inf"`` or ``"-inf"``
``bytes``      ``"v"``: base64 (also ``bytearray``)
``datetime``   ``"v"``: ISO 8601 with its UTC offset; ``"zone"``: the key of
               a :class:`zoneinfo.ZoneInfo` (then ``"v"`` is the wall time);
               ``"tzname"``: a named :class:`datetime.timezone`; ``"fold"``
``time``       as ``datetime``
``date``       ``"v"``: ISO 8601
``timedelta``  ``"v": [days, seconds, microseconds]``
``decimal``    ``"v": str(value)`` (``"19.90"`` stays ``19.90``)
``uuid``       ``"v": str(value)``
``item``       ``"cls"``: dotted path of a :class:`scrapy.Item` subclass,
               ``"v"``: its set fields
``dataclass``  ``"cls"``, ``"v"``: the init fields (passed to the class),
               ``"set"``: the others (set afterwards, frozen or not)
``attrs``      the same for an attrs class (``attr.has``)
``namedtuple`` ``"cls"``, ``"v": [...]``
``enum``       ``"cls"``, ``"v"``: the member's name (``"value"`` for a
               combination of flags)
============== ==========================================================

A class is rebuilt from a queue entry only if a :class:`ClassAllowList`
allows its dotted path, checked before anything is imported; once imported it
must be a class of the tag's kind, so an allowed module does not let queue
data call just any function in it. Encoding a value of a class the list does
not allow is refused (:class:`UnserializableRequest`): the worker that made
the request keeps it rather than queue what no worker would read.
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
from scrapy.http import Request
from scrapy.item import Item
from scrapy.utils.misc import load_object

from bloomcrawl.core.errors import SettingError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: the key of a tagged object
TAG = "$bc"
#: the setting listing the classes (or their modules and packages) allowed besides
#: Scrapy's and the project's
SAFE_CLASSES_SETTING = "FRONTIER_SAFE_CLASSES"

_SCALARS: frozenset[type] = frozenset({str, int, bool, type(None)})
#: caches of decisions taken for names read from queue data stop growing here
_CACHE_LIMIT = 4096
_SUPPORTED = ("JSON values, Items, dataclasses, attrs classes, Enums, named tuples, tuples,"
              " sets, bytes, datetime/date/time/timedelta, Decimal and UUID")


class UnserializableRequest(ValueError):
    """A request bloomcrawl cannot store in Redis.

    ``key`` says where the value is (``"meta['lock']"``,
    ``"cb_kwargs['item']['x']"``, ``"callback"``); ``kind`` what it is (a type
    name such as ``"_thread.lock"``, or ``"callback"``), so that a caller can
    warn once per kind.
    """

    def __init__(self, message: str, *, key: str = "", kind: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.kind = kind


class UnreadableRequest(ValueError):
    """A queue entry bloomcrawl will not turn into a request; the message says why."""


def type_name(cls: type) -> str:
    """``"_thread.lock"``, ``"shop.items.Product"``; builtins by their bare name."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def _is_dotted_name(path: str) -> bool:
    return bool(path) and all(part.isidentifier() for part in path.split("."))


class ClassAllowList:
    """The classes a queue entry may name: those under one of ``entries``.

    An entry is a dotted module or package (``"shopcrawl"`` allows
    ``shopcrawl.items.Product``) or a dotted class path (allowing that class
    only). :meth:`allows` says yes to a path equal to an entry or below one.
    """

    def __init__(self, entries: Iterable[str]) -> None:
        cleaned = []
        for entry in entries:
            if not (isinstance(entry, str) and _is_dotted_name(entry)):
                raise ValueError("%r is not a dotted module or class path" % (entry,))
            if entry not in cleaned:
                cleaned.append(entry)
        self.entries: tuple[str, ...] = tuple(cleaned)
        self._prefixes = tuple(entry + "." for entry in self.entries)
        self._decisions: dict[str, bool] = {}
        self._codec: ValueCodec | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ClassAllowList:
        """Scrapy's classes, the project's (top-level packages of SPIDER_MODULES)
        and FRONTIER_SAFE_CLASSES (a list, or a comma-separated string)."""
        projects = [module.split(".")[0] for module in settings.getlist("SPIDER_MODULES")]
        extra = [entry.strip() for entry in settings.getlist(SAFE_CLASSES_SETTING)]
        for entry in extra:
            if entry and not _is_dotted_name(entry):
                raise SettingError("%s must list dotted module or class paths, got %r in %r"
                                   % (SAFE_CLASSES_SETTING, entry,
                                      settings.get(SAFE_CLASSES_SETTING)))
        return cls(["scrapy", *projects, *(entry for entry in extra if entry)])

    def extended(self, *entries: str) -> ClassAllowList:
        """A list allowing ``entries`` as well."""
        return ClassAllowList([*self.entries, *entries])

    def allows(self, dotted_path: str) -> bool:
        decision = self._decisions.get(dotted_path)
        if decision is None:
            decision = _is_dotted_name(dotted_path) and (
                dotted_path in self.entries or dotted_path.startswith(self._prefixes))
            if len(self._decisions) < _CACHE_LIMIT:  # paths come from queue data too
                self._decisions[dotted_path] = decision
        return decision

    def __repr__(self) -> str:
        return "ClassAllowList(%r)" % (list(self.entries),)


def codec_for(allowed: ClassAllowList) -> ValueCodec:
    """The codec of ``allowed``, built once (it remembers its decisions per class)."""
    codec = allowed._codec
    if codec is None:
        codec = allowed._codec = ValueCodec(allowed)
    return codec


class _Failure(Exception):
    """Raised deep in a value; each container on the way out adds where it was."""

    def __init__(self, reason: str, kind: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.path: list[str] = []  # innermost first

    def where(self, key: str) -> str:
        return key + "".join(reversed(self.path))


class _Refused:
    """A class the encoder will not store, and why (the value's key is added later)."""

    __slots__ = ("kind", "reason")

    def __init__(self, reason: str, kind: str) -> None:
        self.reason = reason
        self.kind = kind


class _Layout:
    """How a class's instances are stored: its tag, path and fields."""

    __slots__ = ("fields", "path", "tag")

    def __init__(self, tag: str, path: str,
                 fields: tuple[tuple[str, str, bool], ...] = ()) -> None:
        self.tag = tag
        self.path = path
        self.fields = fields  # (attribute, init parameter, passed to __init__)


def _importable(cls: type) -> bool:
    """Whether ``load_object("<module>.<qualname>")`` gives ``cls`` back."""
    name = cls.__qualname__
    return "." not in name and getattr(sys.modules.get(cls.__module__), name, None) is cls


def _dataclass_fields(cls: type) -> tuple[tuple[str, str, bool], ...]:
    return tuple((f.name, f.name, f.init) for f in dataclasses.fields(cls))


def _takes_only_fields(cls: type, fields: tuple[tuple[str, str, bool], ...]) -> bool:
    """Whether ``cls(**init fields)`` can be called: no required InitVar, say."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {param for _, param, passed in fields if passed}
    return all(p.name in names or p.default is not p.empty
               or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)


def _attrs_fields(cls: type) -> tuple[tuple[str, str, bool], ...]:
    return tuple((a.name, getattr(a, "alias", None) or a.name.lstrip("_"), a.init)
                 for a in attr.fields(cls))


class ValueCodec:
    """Encodes values into JSON-ready ones and back, for one :class:`ClassAllowList`.

    :meth:`encode` returns a plain value unchanged (the same object): a dict of
    strings and numbers costs one look at each value.
    """

    def __init__(self, allowed: ClassAllowList) -> None:
        self.allowed = allowed
        self._layouts: dict[type, _Layout | _Refused] = {}
        self._classes: dict[tuple[str, str], type] = {}

    # --- encoding ---------------------------------------------------------------

    def encode(self, value: Any, key: str) -> Any:
        """``value`` as JSON-ready data; raises :class:`UnserializableRequest` naming ``key``."""
        try:
            return self._encode(value)
        except _Failure as exc:
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
            except _Failure as exc:
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
            except _Failure as exc:
                exc.path.append("[%r] (the key)" % (k,))
                raise
            try:
                pairs.append([ek, self._encode(x)])
            except _Failure as exc:
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
            except _Failure as exc:
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
            except _Failure as exc:
                exc.path.append("{...}")
                raise
        return out

    def _encode_object(self, value: Any, t: type) -> Any:
        layout = self._layouts.get(t)
        if layout is None:
            layout = self._layouts[t] = self._layout(t)  # keyed by classes: bounded by code
        if isinstance(layout, _Refused):
            raise _Failure(layout.reason, layout.kind)
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
            except _Failure as exc:
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
        fields: tuple[tuple[str, str, bool], ...] = ()
        if issubclass(t, enum.Enum):
            tag = "enum"
        elif issubclass(t, str | int | float):
            # lxml's smart strings (CrawlSpider's link_text), numpy's float64: the value is
            # what matters, and JSON always stored them as the plain type
            return _Layout("scalar", "", ())
        elif issubclass(t, Item):
            tag = "item"
        elif dataclasses.is_dataclass(t):
            tag, fields = "dataclass", _dataclass_fields(t)
        elif attr.has(t):
            tag, fields = "attrs", _attrs_fields(t)
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
            raise _Failure("is a %s in a %s time zone: only datetime.timezone offsets and"
                           " zoneinfo.ZoneInfo zones (with a key) can be stored"
                           % (what, kind), kind)

    # --- decoding ---------------------------------------------------------------

    def decode(self, value: Any, key: str) -> Any:
        """What :meth:`encode` was given; raises :class:`UnreadableRequest` naming ``key``.

        ``value`` is the parsed JSON, changed in place.
        """
        try:
            return self._decode(value)
        except _Failure as exc:
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
                    except _Failure as exc:
                        exc.path.append("[%r]" % (k,))
                        raise
        elif t is list:
            for i, x in enumerate(value):
                if type(x) is dict or type(x) is list:
                    try:
                        value[i] = self._decode(x)
                    except _Failure as exc:
                        exc.path.append("[%d]" % i)
                        raise
        return value

    def _decode_tagged(self, value: dict[str, Any]) -> Any:
        tag = value[TAG]
        decoder = _DECODERS.get(tag) if isinstance(tag, str) else None
        if decoder is None:
            raise _Failure("unknown tag %r" % (tag,))
        try:
            return decoder(self, value)
        except _Failure:
            raise
        except Exception as exc:  # queue data: anything may be wrong with it
            raise _Failure("not a valid %s (%s: %s)" % (tag, type(exc).__name__, exc)) from exc

    def _decode_list(self, value: dict[str, Any], name: str = "v") -> list[Any]:
        items = value[name]
        if type(items) is not list:
            raise _Failure("%r of a %s is not a list" % (name, value[TAG]))
        out: list[Any] = self._decode(items)
        return out

    def _decode_fields(self, value: dict[str, Any], name: str) -> dict[str, Any]:
        fields = value.get(name, {})
        if type(fields) is not dict:
            raise _Failure("%r of a %s is not an object" % (name, value[TAG]))
        out: dict[str, Any] = self._decode(fields)
        if type(out) is not dict:
            raise _Failure("%r of a %s is not an object" % (name, value[TAG]))
        return out

    def _decode_tz(self, value: dict[str, Any],
                   parsed: datetime.datetime | datetime.time) -> Any:
        zone = value.get("zone")
        if zone is not None:
            parsed = parsed.replace(tzinfo=zoneinfo.ZoneInfo(zone))
        elif "tzname" in value:
            offset = parsed.utcoffset()
            if offset is None:
                raise _Failure("a time zone name %r without an offset" % (value["tzname"],))
            parsed = parsed.replace(tzinfo=datetime.timezone(offset, value["tzname"]))
        if value.get("fold"):
            parsed = parsed.replace(fold=1)
        return parsed

    def load_class(self, tag: str, path: Any) -> type:
        """The class ``path`` names for ``tag`` (``"request"``, ``"item"``, ``"dataclass"``...):
        allowed, then imported, then checked; raises :class:`UnreadableRequest`."""
        try:
            return self._load_class(tag, path)
        except _Failure as exc:
            raise UnreadableRequest(exc.reason) from exc.__cause__

    def _load_class(self, tag: str, path: Any) -> type:
        cls = self._classes.get((tag, path)) if isinstance(path, str) else None
        if cls is not None:
            return cls
        if not isinstance(path, str):
            raise _Failure("%s class %r is not a dotted path" % (tag, path))
        # checked before importing: the name comes from queue data
        if not self.allowed.allows(path):
            raise _Failure("%s class %r is neither Scrapy's nor the project's, nor listed in %s:"
                           " not imported" % (tag, path, SAFE_CLASSES_SETTING))
        try:
            obj = load_object(path)
        except Exception as exc:
            raise _Failure("%s class %r cannot be imported (%s: %s)"
                           % (tag, path, type(exc).__name__, exc)) from exc
        is_kind, what = _KINDS[tag]
        if not (isinstance(obj, type) and is_kind(obj)):
            raise _Failure("%r is not %s" % (path, what))
        canonical = "%s.%s" % (obj.__module__, obj.__qualname__)
        if canonical != path and not self.allowed.allows(canonical):
            # an allowed module that imported a class from elsewhere does not make it allowed
            raise _Failure("%r is %s, which is not allowed" % (path, canonical))
        if len(self._classes) < _CACHE_LIMIT:
            self._classes[(tag, path)] = obj
        return obj


# --- the tags ---------------------------------------------------------------------


def _enc_tuple(codec: ValueCodec, value: tuple[Any, ...]) -> Any:
    return {TAG: "tuple", "v": codec._encode_list(list(value))}


def _enc_set(codec: ValueCodec, value: set[Any]) -> Any:
    return {TAG: "set", "v": codec._encode_members(value)}


def _enc_frozenset(codec: ValueCodec, value: frozenset[Any]) -> Any:
    return {TAG: "frozenset", "v": codec._encode_members(value)}


def _enc_bytes(codec: ValueCodec, value: bytes) -> Any:
    return {TAG: "bytes", "v": base64.b64encode(value).decode("ascii")}


def _enc_bytearray(codec: ValueCodec, value: bytearray) -> Any:
    return {TAG: "bytearray", "v": base64.b64encode(value).decode("ascii")}


def _enc_datetime(codec: ValueCodec, value: datetime.datetime) -> Any:
    out: dict[str, Any] = {TAG: "datetime"}
    if value.tzinfo is None:
        out["v"] = value.isoformat()
    else:
        codec._encode_tz(value.tzinfo, out, "datetime", value)
    if value.fold:
        out["fold"] = 1
    return out


def _enc_time(codec: ValueCodec, value: datetime.time) -> Any:
    out: dict[str, Any] = {TAG: "time"}
    if value.tzinfo is None:
        out["v"] = value.isoformat()
    else:
        codec._encode_tz(value.tzinfo, out, "time", value)
    if value.fold:
        out["fold"] = 1
    return out


def _enc_date(codec: ValueCodec, value: datetime.date) -> Any:
    return {TAG: "date", "v": value.isoformat()}


def _enc_timedelta(codec: ValueCodec, value: datetime.timedelta) -> Any:
    return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}


def _enc_decimal(codec: ValueCodec, value: decimal.Decimal) -> Any:
    return {TAG: "decimal", "v": str(value)}


def _enc_uuid(codec: ValueCodec, value: uuid.UUID) -> Any:
    return {TAG: "uuid", "v": str(value)}


#: by exact type: a subclass (an OrderedDict, a str Enum) is not what its base is
_ENCODERS: dict[type, Callable[[ValueCodec, Any], Any]] = {
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


def _string(value: dict[str, Any], name: str = "v") -> str:
    text = value[name]
    if type(text) is not str:
        raise _Failure("%r of a %s is not a string" % (name, value[TAG]))
    return text


def _dec_dict(codec: ValueCodec, value: dict[str, Any]) -> Any:
    out = {}
    for pair in codec._decode_list(value):
        if type(pair) is not list or len(pair) != 2:
            raise _Failure("a dict's pair is not [key, value]")
        out[pair[0]] = pair[1]
    return out


def _dec_datetime(codec: ValueCodec, value: dict[str, Any]) -> Any:
    return codec._decode_tz(value, datetime.datetime.fromisoformat(_string(value)))


def _dec_time(codec: ValueCodec, value: dict[str, Any]) -> Any:
    return codec._decode_tz(value, datetime.time.fromisoformat(_string(value)))


def _dec_timedelta(codec: ValueCodec, value: dict[str, Any]) -> Any:
    days, seconds, microseconds = value["v"]
    if not all(type(n) is int for n in (days, seconds, microseconds)):
        raise _Failure("a timedelta's parts are not integers")
    return datetime.timedelta(days=days, seconds=seconds, microseconds=microseconds)


def _dec_float(codec: ValueCodec, value: dict[str, Any]) -> Any:
    text = _string(value)
    if text not in ("nan", "inf", "-inf"):
        raise _Failure("a float tag holds %r, not nan, inf or -inf" % (text,))
    return float(text)


def _dec_enum(codec: ValueCodec, value: dict[str, Any]) -> Any:
    cls: Any = codec._load_class("enum", value["cls"])
    if "value" in value:
        return cls(codec._decode(value["value"]))
    return cls[_string(value)]


def _dec_item(codec: ValueCodec, value: dict[str, Any]) -> Any:
    cls = codec._load_class("item", value["cls"])
    item = cls()
    for name, x in codec._decode_fields(value, "v").items():
        item[name] = x  # KeyError for a field the class does not declare
    return item


def _dec_structure(tag: str, names: Callable[[type], Iterable[tuple[str, str, bool]]]
                   ) -> Callable[[ValueCodec, dict[str, Any]], Any]:
    def decode(codec: ValueCodec, value: dict[str, Any]) -> Any:
        cls = codec._load_class(tag, value["cls"])
        obj = cls(**codec._decode_fields(value, "v"))
        later = codec._decode_fields(value, "set")
        if later:
            settable = {name for name, _, passed in names(cls) if not passed}
            for name, x in later.items():
                if name not in settable:  # never just any attribute, such as __class__
                    raise _Failure("%r is not a field of %s set after __init__" % (name, cls))
                object.__setattr__(obj, name, x)  # frozen ones too
        return obj

    return decode


def _dec_namedtuple(codec: ValueCodec, value: dict[str, Any]) -> Any:
    cls = codec._load_class("namedtuple", value["cls"])
    return cls(*codec._decode_list(value))


_DECODERS: dict[str, Callable[[ValueCodec, dict[str, Any]], Any]] = {
    "tuple": lambda codec, value: tuple(codec._decode_list(value)),
    "set": lambda codec, value: set(codec._decode_list(value)),
    "frozenset": lambda codec, value: frozenset(codec._decode_list(value)),
    "dict": _dec_dict,
    "float": _dec_float,
    "bytes": lambda codec, value: base64.b64decode(_string(value), validate=True),
    "bytearray": lambda codec, value: bytearray(base64.b64decode(_string(value),
                                                                 validate=True)),
    "datetime": _dec_datetime,
    "date": lambda codec, value: datetime.date.fromisoformat(_string(value)),
    "time": _dec_time,
    "timedelta": _dec_timedelta,
    "decimal": lambda codec, value: decimal.Decimal(_string(value)),
    "uuid": lambda codec, value: uuid.UUID(_string(value)),
    "enum": _dec_enum,
    "item": _dec_item,
    "dataclass": _dec_structure("dataclass", _dataclass_fields),
    "attrs": _dec_structure("attrs", _attrs_fields),
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
