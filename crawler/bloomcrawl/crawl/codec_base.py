"""What the value codec's encoder and decoder share: the tag key, the errors, field layouts.

The format itself is described in :mod:`bloomcrawl.crawl.codec`, the module
callers import; :mod:`~bloomcrawl.crawl.codec_encoder` and
:mod:`~bloomcrawl.crawl.codec_decoder` each do one direction of it.
"""

from __future__ import annotations

import dataclasses

import attr  # Twisted, so Scrapy, depends on attrs

#: the key of a tagged object
TAG = "$bc"
#: the setting listing the classes (or their modules and packages) allowed besides
#: Scrapy's and the project's
SAFE_CLASSES_SETTING = "FRONTIER_SAFE_CLASSES"
#: caches of decisions taken for names read from queue data stop growing here
CACHE_LIMIT = 4096

#: how a class's fields are stored: (attribute, init parameter, passed to __init__)
Fields = tuple[tuple[str, str, bool], ...]


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


class CodecFailure(Exception):
    """Raised deep in a value; each container on the way out adds where it was.

    Never leaves the codec: :class:`~bloomcrawl.crawl.codec.ValueCodec` turns it
    into :class:`UnserializableRequest` or :class:`UnreadableRequest`, naming the
    key the caller gave.
    """

    def __init__(self, reason: str, kind: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.path: list[str] = []  # innermost first

    def where(self, key: str) -> str:
        return key + "".join(reversed(self.path))


def type_name(cls: type) -> str:
    """``"_thread.lock"``, ``"shop.items.Product"``; builtins by their bare name."""
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def dataclass_fields(cls: type) -> Fields:
    return tuple((f.name, f.name, f.init) for f in dataclasses.fields(cls))


def attrs_fields(cls: type) -> Fields:
    return tuple((a.name, getattr(a, "alias", None) or a.name.lstrip("_"), a.init)
                 for a in attr.fields(cls))
