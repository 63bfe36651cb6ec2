"""HTTP to the cluster's own services, never through a proxy.

The scrapyd nodes, the exporter, Prometheus and the demo site are on
127.0.0.1 or on the cluster's own network: an ``http_proxy`` in the
environment must not reroute them.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def opener_for(context: ssl.SSLContext) -> urllib.request.OpenerDirector:
    """Like :data:`OPENER`, with ``context`` for https (a cluster's own CA)."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                       urllib.request.HTTPSHandler(context=context))


def http_ok(url: str, timeout: float = 3.0) -> bool:
    """Whether ``GET url`` answers 2xx; raises :class:`OSError` when nothing answers."""
    with OPENER.open(url, timeout=timeout) as response:
        return bool(200 <= response.status < 300)


def get_json(url: str, timeout: float = 10.0) -> Any:
    with OPENER.open(url, timeout=timeout) as response:
        return json.loads(response.read())


def post(url: str, timeout: float = 10.0) -> None:
    """``POST url`` with an empty body; the answer is not read."""
    request = urllib.request.Request(url, data=b"", method="POST")
    OPENER.open(request, timeout=timeout).close()
