"""Which revisit window a request goes in (BLOOMFILTER_REVISIT_WINDOWS).

A crawl may name a few windows, for example ``{"listing": "1h", "article":
"never"}``. A request chooses one with ``meta["revisit"]``; a spider's
``revisit_window`` attribute is the default of its requests; without either,
a request is in the default window (BLOOMFILTER_REVISIT_AFTER, ``"default"``).

Each window is a ring of generations of its own in the filter: a request is a
duplicate only of what was queued in the same window. Its fingerprint is
mixed with the window's name (:func:`window_fingerprint`), so a worker's seen
cache tells the windows apart too.

A spider whose ``revisit_window`` names no window does not open. A request
whose meta names none is not dropped: it goes in the spider's default window,
and the first of each name is logged as an error naming the windows there are.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.errors import SettingError, UnknownWindow
from bloomcrawl.core.sizing import DEFAULT_WINDOW

if TYPE_CHECKING:
    from scrapy import Request, Spider

    from bloomcrawl.core.sizing import FilterParams

logger = logging.getLogger(__name__)

#: the request meta key naming its revisit window
REVISIT_META_KEY = "revisit"
#: the spider attribute naming its requests' default window
SPIDER_ATTRIBUTE = "revisit_window"


def window_fingerprint(fp: bytes, name: str) -> bytes:
    """A request's fingerprint in the named window ``name`` (the default one's is its own)."""
    return hashlib.sha1(b"revisit:" + name.encode() + b"\0" + fp).digest()


class RevisitWindows:
    """The window of each request of one spider: its flag for the filter's scripts
    (:meth:`~bloomcrawl.core.sizing.FilterParams.window_flag`) and its name."""

    def __init__(self, params: FilterParams, spider: Spider | None) -> None:
        self.params = params
        default = getattr(spider, SPIDER_ATTRIBUTE, None) if spider is not None else None
        try:
            self.default_flag = params.window_flag(default)
        except UnknownWindow as exc:
            raise SettingError("spider %r: %s = %r: %s" % (
                getattr(spider, "name", spider), SPIDER_ATTRIBUTE, default, exc)) from exc
        self.default_name = str(default) if self.default_flag != "0" else DEFAULT_WINDOW
        #: names already reported as unknown
        self._reported: set[Any] = set()
        #: unknown names met (each request of one is counted)
        self.unknown = 0

    def of(self, request: Request) -> tuple[str, str]:
        """``(flag, name)`` of the request's window."""
        name = request.meta.get(REVISIT_META_KEY)
        if name is None or name == self.default_name:
            return self.default_flag, self.default_name
        try:
            return self.params.window_flag(name), name
        except (UnknownWindow, TypeError) as exc:
            self.unknown += 1
            key = name if isinstance(name, str) else repr(name)
            if key not in self._reported:
                self._reported.add(key)
                logger.error("%s <%s>: meta[%r] = %r: %s; it goes in the %r window instead"
                             " (further requests naming it are counted in"
                             " bloomcrawl/unknown_revisit_window)",
                             request.method, request.url, REVISIT_META_KEY, name, exc,
                             self.default_name)
            return self.default_flag, self.default_name

    def fingerprint(self, fp: bytes, request: Request) -> tuple[bytes, str, str]:
        """The request's fingerprint in its window, the window's flag and its name."""
        flag, name = self.of(request)
        if flag == "0":
            return fp, flag, name
        return window_fingerprint(fp, name), flag, name
