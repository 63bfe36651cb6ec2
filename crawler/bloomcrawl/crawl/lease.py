"""What the scheduler and the middlewares share about a leased request.

A request the scheduler leased carries its lease in ``meta[LEASE_META_KEY]``
as ``(partition, token)``. When its page is done
(:class:`~bloomcrawl.crawl.pages.PageTracker`), the :data:`request_finished`
signal goes out and the scheduler acks the lease.
"""

from __future__ import annotations

#: sent when a leased (or held) request's outcome is final; arguments: request, outcome
#: ("response", "spider_error", "download_error", "ignored")
request_finished = object()

#: meta key holding a leased request's ``(partition, token)``
LEASE_META_KEY = "_bloomcrawl_lease"
#: meta key marking a request the scheduler leased and handed back to itself
LOCAL_META_KEY = "_bloomcrawl_local"
#: meta key of a request a tracked page yielded: the page's number in the PageTracker
PARENT_META_KEY = "_bloomcrawl_parent"
#: meta key of a request this worker keeps (the frontier cannot share it): the number of
#: the page that waits for it (0: none)
HOLD_META_KEY = "_bloomcrawl_hold"
#: meta keys bloomcrawl uses internally; never written to Redis, never copied to children
INTERNAL_META_KEYS = frozenset({LEASE_META_KEY, LOCAL_META_KEY, PARENT_META_KEY,
                                HOLD_META_KEY})
