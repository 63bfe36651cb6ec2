"""Scrapyd nodes on other hosts, listed in Redis where every part of the cluster reads them.

``bloomcrawl nodes add URL`` records a node a worker host runs
(``make worker-host``), ``nodes remove URL`` forgets it. ``deploy``,
``schedule``, ``status``, the timer (at each firing) and the exporter (at
each scrape) add these nodes to the cluster's own. They live in Redis, not
in the state directory, because the compose timer and exporter run in
containers that only Redis reaches.

``{bloomcrawl:nodes}`` (hash): node URL -> JSON ``{"ca": PEM, "added": unix
time}``. ``ca`` is the certificate of the CA the node's TLS certificate must
chain to (public; empty: the system's CAs). The node's basic-auth
credentials are the cluster's own (SCRAPYD_USERNAME, SCRAPYD_PASSWORD), never
stored here: the exporter's read-only user may read every key.
"""

from __future__ import annotations

import json
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bloomcrawl.ops import inspection, scrapyd
from bloomcrawl.ops.console import OpsError

KEY = "{bloomcrawl:nodes}"


@dataclass
class RemoteNode:
    url: str
    ca_pem: str = field(default="", repr=False)
    added: float = 0.0

    def node(self, username: str, password: str) -> scrapyd.Node:
        return scrapyd.Node(self.url, username, password, ca_pem=self.ca_pem)


def read_ca(path: Path) -> str:
    """The PEM text of ``path``; :class:`OpsError` unless it holds a certificate ssl loads."""
    try:
        pem = path.read_text()
        ssl.create_default_context(cadata=pem)
    except (OSError, UnicodeDecodeError, ssl.SSLError, ValueError) as exc:
        raise OpsError(f"--ca-file {path}: not a readable PEM certificate ({exc})") from exc
    return pem


def add(client: Any, url: str, ca_pem: str = "") -> RemoteNode:
    """Record ``url`` (checked: https, or http on this machine or with --insecure)."""
    node = RemoteNode(scrapyd.check_node_url(url), ca_pem, time.time())
    if ca_pem and not node.url.startswith("https://"):
        raise OpsError(f"{node.url}: a CA file is for https:// nodes")
    with inspection.reachable(client):
        client.hset(KEY, node.url, json.dumps({"ca": ca_pem, "added": node.added}))
    return node


def remove(client: Any, url: str) -> bool:
    """Forget ``url``; False when it was not listed."""
    with inspection.reachable(client):
        return bool(client.hdel(KEY, scrapyd.normalise_node_url(url)))


def listed(client: Any) -> list[RemoteNode]:
    """The recorded nodes, by URL; an entry that is not the JSON above keeps its URL alone."""
    with inspection.reachable(client):
        raw: dict[bytes, bytes] = client.hgetall(KEY)
    nodes = []
    for url, value in sorted(raw.items()):
        try:
            entry = json.loads(value)
            ca, added = str(entry.get("ca") or ""), float(entry.get("added") or 0)
        except (ValueError, TypeError, AttributeError):
            ca, added = "", 0.0
        nodes.append(RemoteNode(url.decode(errors="replace"), ca, added))
    return nodes
