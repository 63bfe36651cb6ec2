"""What the scheduler and the middlewares share about a leased request.

A request the scheduler leased carries its lease in ``meta[LEASE_META_KEY]``
as ``(partition, token)``. When its page is done
(:class:`~bloomcrawl.crawl.pages.PageTracker`), the :data:`request_finished`
signal goes out and the scheduler acks the lease.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Outcome(StrEnum):
    """How a leased (or held) request ended; :data:`request_finished` carries it."""

    #: downloaded, its callback's output all handled
    RESPONSE = "response"
    #: downloaded, its callback raised (what it yielded before still counts)
    SPIDER_ERROR = "spider_error"
    #: the download failed for good (no middleware retried it)
    DOWNLOAD_ERROR = "download_error"
    #: a middleware raised IgnoreRequest
    IGNORED = "ignored"


class LeaseRef(NamedTuple):
    """What a leased request carries in ``meta[LEASE_META_KEY]``: enough to ack it.

    A tuple, so it round-trips through Scrapy's meta copies unchanged.
    """

    partition: int
    token: str


#: sent when a leased (or held) request's outcome is final; arguments: request, outcome
#: (an :class:`Outcome`)
request_finished = object()

#: meta key holding a leased request's :class:`LeaseRef`
LEASE_META_KEY = "_bloomcrawl_lease"
#: meta key marking a request the scheduler leased and handed back to itself
LOCAL_META_KEY = "_bloomcrawl_local"
#: meta key of a request a tracked page yielded: the page's number in the PageTracker
PARENT_META_KEY = "_bloomcrawl_parent"
#: meta key of a request this worker keeps (the frontier cannot share it): the number of
#: the page that waits for it (0: none), and the hold's own number
HOLD_META_KEY = "_bloomcrawl_hold"
#: meta key of a leased request: its queue entry's id (one visit of its URL; a page
#: crawled twice for one entry, its first worker having died, is the same visit)
ENTRY_META_KEY = "_bloomcrawl_entry"
#: meta key of a ``dont_filter`` request a tracked page yielded: the id of its visit, made
#: from the page's and the request's position in its output, so the page crawled twice
#: (its worker died) makes the same visit again; its queue entry's id
VISIT_META_KEY = "_bloomcrawl_visit"
#: meta keys bloomcrawl uses internally; never written to Redis, never copied to children
INTERNAL_META_KEYS = frozenset({LEASE_META_KEY, LOCAL_META_KEY, PARENT_META_KEY,
                                HOLD_META_KEY, ENTRY_META_KEY, VISIT_META_KEY})
