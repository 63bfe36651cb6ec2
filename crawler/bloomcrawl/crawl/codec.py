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

This module is what callers import: the allow list and :class:`ValueCodec`.
The two directions live apart, since they trust different things: the
encoder (:mod:`~bloomcrawl.crawl.codec_encoder`) reads the worker's own
objects, the decoder (:mod:`~bloomcrawl.crawl.codec_decoder`) queue data any
worker or tool may have written; :mod:`~bloomcrawl.crawl.codec_base` holds
what they share.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.errors import SettingError
from bloomcrawl.crawl.codec_base import (
    CACHE_LIMIT,
    SAFE_CLASSES_SETTING,
    TAG,
    UnreadableRequest,
    UnserializableRequest,
    type_name,
)
from bloomcrawl.crawl.codec_decoder import ValueDecoder
from bloomcrawl.crawl.codec_encoder import ValueEncoder

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "SAFE_CLASSES_SETTING",
    "TAG",
    "ClassAllowList",
    "UnreadableRequest",
    "UnserializableRequest",
    "ValueCodec",
    "codec_for",
    "type_name",
]


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
            if len(self._decisions) < CACHE_LIMIT:  # paths come from queue data too
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


class ValueCodec:
    """Encodes values into JSON-ready ones and back, for one :class:`ClassAllowList`.

    :meth:`encode` returns a plain value unchanged (the same object): a dict of
    strings and numbers costs one look at each value. Each direction keeps its
    own memory: the encoder's per class met, the decoder's per name read.
    """

    def __init__(self, allowed: ClassAllowList) -> None:
        self.allowed = allowed
        self.encoder = ValueEncoder(allowed)
        self.decoder = ValueDecoder(allowed)

    def encode(self, value: Any, key: str) -> Any:
        """``value`` as JSON-ready data; raises :class:`UnserializableRequest` naming ``key``."""
        return self.encoder.encode(value, key)

    def decode(self, value: Any, key: str) -> Any:
        """What :meth:`encode` was given; raises :class:`UnreadableRequest` naming ``key``.

        ``value`` is the parsed JSON, changed in place.
        """
        return self.decoder.decode(value, key)

    def load_class(self, tag: str, path: Any) -> type:
        """The class ``path`` names for ``tag`` (``"request"``, ``"item"``, ``"dataclass"``...):
        allowed, then imported, then checked; raises :class:`UnreadableRequest`."""
        return self.decoder.load_class(tag, path)
