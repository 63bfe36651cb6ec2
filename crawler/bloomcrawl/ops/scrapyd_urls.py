"""Where a scrapyd node is and what it is called: its URL, and its ``host:port`` label.

Node URLs are normalised and checked here (plain http only to this machine,
unless allowed); metric labels are ``host:port``, never a path or a job id.
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Iterable

from bloomcrawl.core.connection import check_plaintext
from bloomcrawl.core.errors import SettingError
from bloomcrawl.ops.console import OpsError

DEFAULT_PORT = 6800


def check_node_url(url: str, insecure: bool | None = None) -> str:
    """``url`` normalised; :class:`OpsError` when it is not http(s), or plain http to a host
    off this machine unless ``insecure`` (None: BLOOMCRAWL_INSECURE) allows it."""
    url = normalise_node_url(url)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OpsError(f"scrapyd node {url!r}: must be http(s)://host:port")
    if parts.scheme == "http":
        try:
            check_plaintext("scrapyd node", url, "https://", insecure)
        except SettingError as exc:
            raise OpsError(str(exc)) from exc
    return url


def normalise_node_url(url: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port`` (no trailing slash)."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def node_label(url: str) -> str:
    """``host:port`` of a node URL: a bounded label value (never a path or a job id)."""
    parts = urllib.parse.urlsplit(normalise_node_url(url))
    host = parts.hostname or "unknown"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return f"{host}:{port}"


def node_labels_by_host(nodes: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Worker host name -> node label, from ``(node label, node_name)`` pairs.

    scrapyd's ``node_name`` defaults to the host name the scheduler records in
    ``<spider>:pages_by_node``. A name that several nodes report (several
    scrapyd on one machine) maps to none of them: their pages cannot be told
    apart.
    """
    nodes_of: dict[str, set[str]] = {}
    for node, node_name in nodes:
        nodes_of.setdefault(node_name, set()).add(node)
    return {name: next(iter(found)) for name, found in nodes_of.items() if len(found) == 1}


def resolve_service(name: str, port: int = DEFAULT_PORT) -> list[str]:
    """``http://IP:port`` for every IPv4 address of ``name`` (each replica of a compose service).

    Raises :class:`OSError` when the name does not resolve.
    """
    infos = socket.getaddrinfo(name, port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    addresses = sorted({str(info[4][0]) for info in infos},
                       key=lambda a: tuple(int(x) for x in a.split(".")))
    return [f"http://{address}:{port}" for address in addresses]
