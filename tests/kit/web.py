"""One HTTP request to a site the test started on 127.0.0.1, answered whatever its status.

:func:`fetch` speaks ``http.client`` directly: no proxy from the environment, no
redirect followed, no exception for a 404, and another ``Host`` header when
the site serves several hosts on one port (the demo site's, the hosts site's).
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from urllib.parse import urlsplit

TIMEOUT_S = 10


def fetch(url: str, *, method: str = "GET", host: str | None = None,
          headers: Mapping[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    """One request to ``url`` (on 127.0.0.1), optionally with another ``Host`` header: its
    status, body and headers."""
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1", url
    path = parts.path + ("?" + parts.query if parts.query else "")
    conn = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=TIMEOUT_S)
    try:
        conn.request(method, path or "/", headers={**({"Host": host} if host else {}),
                                                   **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        conn.close()
