"""Entries of a spider's start list (``<spider>:start_urls``): what one may hold.

An entry is a URL, or a JSON object ``{"url", "meta", "priority", "dont_filter"}``
(:func:`parse_start_entry`); whatever request a spider makes of one is checked
by :func:`check_seed` before it is queued.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

START_ENTRY_FIELDS = frozenset({"url", "meta", "priority", "dont_filter"})
#: priorities a start entry may carry: what a float (a queue score) holds exactly
MAX_PRIORITY = 2**53
#: meta keys of this prefix are bloomcrawl's own (leases): a seed may not set them
INTERNAL_META_PREFIX = "_bloomcrawl"


def check_seed(url: str, meta: Mapping[Any, Any]) -> None:
    """A start entry's request: an http(s) URL with a host, no meta key of bloomcrawl's."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL: %r" % url)
    internal = sorted(k for k in meta if str(k).startswith(INTERNAL_META_PREFIX))
    if internal:
        raise ValueError("meta keys %s are bloomcrawl's own" % internal)


def parse_start_entry(raw: bytes | str) -> dict[str, Any]:
    """One ``<spider>:start_urls`` entry: a URL, or JSON ``{"url", "meta", "priority"}``."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    text = text.strip()
    if text.startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        unknown = set(data) - START_ENTRY_FIELDS
        if unknown:
            raise ValueError("unknown fields %s" % sorted(unknown))
    else:
        data = {"url": text}
    url = data.get("url")
    if not isinstance(url, str):
        raise ValueError("no url")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise ValueError("meta must be an object")
    check_seed(url, meta)
    priority = data.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError("priority must be an integer")
    if abs(priority) > MAX_PRIORITY:
        raise ValueError("priority must be within +-2**53, got %d digits" % len(str(priority)))
    if not isinstance(data.get("dont_filter", False), bool):
        raise ValueError("dont_filter must be true or false")
    return data
