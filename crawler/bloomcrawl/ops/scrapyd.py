"""The scrapyd client: every request bloomcrawl makes to a scrapyd node.

A :class:`Node` is one scrapyd (its URL and basic-auth credentials).
:meth:`Node.request` calls a JSON endpoint and raises :class:`ScrapydError`
on any failure; :meth:`Node.status` asks ``daemonstatus.json`` and never
raises (a node that does not answer is ``up=False`` with the reason). The
functions below act on many nodes at once, concurrently, in node order:
:func:`deploy` uploads one egg (built once by :func:`build_egg`, as
``scrapyd-deploy --build-egg`` does), :func:`schedule` starts one job per
node, :func:`job_states` and :func:`node_statuses` ask how they are doing.

The CLI, the exporter and ``bloomcrawl status`` all go through this module;
node URLs and their metric labels (``host:port``) come from here too.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.noproxy import OPENER

DEFAULT_PORT = 6800
#: seconds for an endpoint that does work (addversion, schedule)
HTTP_TIMEOUT = 30.0
#: seconds for ``daemonstatus.json``: a node slower than this is reported down
STATUS_TIMEOUT = 2.0
BUILD_EGG_TIMEOUT = 300.0
#: nodes asked at once
MAX_PARALLEL = 32
JOB_STATES = ("pending", "running", "finished")

T = TypeVar("T")


class ScrapydError(OpsError):
    """A scrapyd endpoint failed; ``reason`` is the short cause, the message names the URL.

    ``unreachable`` is the node's URL when no answer came at all (connection
    refused, a timeout): the message then says the node could not be reached.
    """

    def __init__(self, url: str, reason: str, detail: str = "", *,
                 unreachable: str | None = None) -> None:
        if unreachable:
            message = f"cannot reach the scrapyd node {unreachable}: {reason}"
        else:
            message = f"{url}: {reason}" + (f" {detail}" if detail else "")
        super().__init__(message)
        self.url = url
        self.reason = reason


@dataclass
class NodeStatus:
    """A scrapyd node's ``daemonstatus.json``; counts are 0 when it is not ``up``."""

    url: str
    node: str
    up: bool
    pending: int = 0
    running: int = 0
    finished: int = 0
    node_name: str | None = None
    #: why it is not up, in short (``[Errno 111] Connection refused``)
    error: str | None = None
    #: the same as one line naming the node (``cannot reach the scrapyd node http://...: ...``)
    failure: str | None = None
    duration_seconds: float = 0.0


@dataclass
class Node:
    """One scrapyd: ``http://host:port`` (normalised) and its basic-auth credentials."""

    url: str
    username: str = ""
    password: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.url = normalise_node_url(self.url)

    def _call(self, path: str, body: bytes | None, content_type: str | None,
              timeout: float) -> Any:
        """The decoded JSON answer of ``path``; :class:`ScrapydError` when there is none."""
        url = self.url + "/" + path
        request = urllib.request.Request(url, data=body, headers={"Accept": "application/json"})
        if content_type:
            request.add_header("Content-Type", content_type)
        if self.username:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            request.add_header("Authorization", "Basic " + token)
        try:
            with OPENER.open(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read(500).decode(errors="replace").strip()
            raise ScrapydError(url, f"HTTP {exc.code} {exc.reason}", detail) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = str(getattr(exc, "reason", exc)) or type(exc).__name__
            raise ScrapydError(url, reason, unreachable=self.url) from exc
        except http.client.HTTPException as exc:
            raise ScrapydError(url, str(exc) or type(exc).__name__) from exc
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ScrapydError(url, f"not JSON: {raw[:200]!r}") from exc

    def request(self, path: str, data: dict[str, Any] | Sequence[tuple[str, str]] | None = None,
                *, body: bytes | None = None, content_type: str | None = None,
                timeout: float = HTTP_TIMEOUT) -> dict[str, Any]:
        """A JSON endpoint whose answer must say ``"status": "ok"``; else :class:`ScrapydError`.

        ``data`` is sent form-encoded; ``body`` and ``content_type`` as they are.
        """
        if data is not None:
            body = urllib.parse.urlencode(data).encode()
            content_type = "application/x-www-form-urlencoded"
        answer = self._call(path, body, content_type, timeout)
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            message = answer.get("message", answer) if isinstance(answer, dict) else answer
            raise ScrapydError(self.url + "/" + path, str(message).strip()[-1500:])
        return answer

    def status(self, timeout: float = STATUS_TIMEOUT) -> NodeStatus:
        """``daemonstatus.json``; any failure gives ``up=False`` and the reason."""
        status = NodeStatus(url=self.url, node=node_label(self.url), up=False)
        started = time.monotonic()
        try:
            body = self._call("daemonstatus.json", None, None, timeout)
        except ScrapydError as exc:
            status.error = exc.reason
            status.failure = str(exc)
        else:
            if isinstance(body, dict) and body.get("status", "ok") == "ok":
                status.up = True
                status.pending = _int(body.get("pending"))
                status.running = _int(body.get("running"))
                status.finished = _int(body.get("finished"))
                name = body.get("node_name")
                status.node_name = str(name) if name is not None else None
            else:
                status.error = f"unexpected answer: {body!r:.200}"
                status.failure = f"scrapyd node {self.url} gave an {status.error}"
        status.duration_seconds = time.monotonic() - started
        return status

    def add_version(self, project: str, version: str, egg: bytes) -> dict[str, Any]:
        body, content_type = multipart({"project": project, "version": version},
                                       {"egg": ("project.egg", egg)})
        return self.request("addversion.json", body=body, content_type=content_type)

    def list_jobs(self, project: str, timeout: float = 10.0) -> dict[str, Any]:
        return self.request(f"listjobs.json?project={urllib.parse.quote(project)}",
                            timeout=timeout)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body and its content type."""
    boundary = uuid.uuid4().hex
    parts: list[bytes] = []
    for name, value in fields.items():
        parts.append((f"--{boundary}\r\nContent-Disposition: form-data;"
                      f' name="{name}"\r\n\r\n{value}\r\n').encode())
    for name, (filename, content) in files.items():
        head = (f"--{boundary}\r\nContent-Disposition: form-data;"
                f' name="{name}"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n")
        parts.append(head.encode() + content + b"\r\n")
    parts.append((f"--{boundary}--\r\n").encode())
    return b"".join(parts), "multipart/form-data; boundary=" + boundary


# --- many nodes at once -----------------------------------------------------------


def for_each_node(nodes: Sequence[Node], action: Callable[[Node], T]
                  ) -> list[tuple[Node, T | None, str | None]]:
    """``action(node)`` on every node at once: (node, result, error) in node order."""
    def attempt(node: Node) -> tuple[Node, T | None, str | None]:
        try:
            return node, action(node), None
        except ScrapydError as exc:
            return node, None, str(exc)

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(nodes)),
                            thread_name_prefix="scrapyd") as pool:
        return list(pool.map(attempt, nodes))


def node_statuses(nodes: Sequence[Node], timeout: float = STATUS_TIMEOUT) -> list[NodeStatus]:
    """Every node's status (each URL once), asked concurrently, in node order.

    Takes about ``timeout`` at most, however many nodes are down.
    """
    unique = list({node.url: node for node in nodes}.values())
    results = for_each_node(unique, lambda node: node.status(timeout))
    return [status for _, status, _ in results if status is not None]


def deploy(nodes: Sequence[Node], project: str, version: str, egg: bytes
           ) -> list[tuple[Node, dict[str, Any] | None, str | None]]:
    """Upload ``egg`` as ``project`` ``version`` to every node: (node, answer, error)."""
    return for_each_node(nodes, lambda node: node.add_version(project, version, egg))


def schedule(nodes: Sequence[Node], project: str, spider: str,
             settings: Sequence[tuple[str, str]],
             spider_args: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Start one job on every node; {node url: job id}. Fails when any node fails."""
    data: list[tuple[str, str]] = [("project", project), ("spider", spider)]
    data += [("setting", "{}={}".format(*pair)) for pair in settings]
    data += list(spider_args)
    results = for_each_node(nodes, lambda node: node.request("schedule.json", data))
    errors = [error for _, _, error in results if error]
    if errors:
        raise OpsError("scheduling %s failed on %d of %d node(s): %s" % (
            spider, len(errors), len(results), "; ".join(errors)))
    return {node.url: str(answer["jobid"]) for node, answer, _ in results if answer}


def job_states(nodes: Sequence[Node], project: str, jobs: dict[str, str]) -> dict[str, str]:
    """{job id: pending | running | finished | unknown}; ``jobs`` is {node url: job id}."""
    states = dict.fromkeys(jobs.values(), "unknown")
    asked = [node for node in nodes if node.url in jobs]
    for _node, answer, _error in for_each_node(asked, lambda node: node.list_jobs(project)):
        if answer is None:
            continue
        for state in JOB_STATES:
            for job in answer.get(state, []):
                if job.get("id") in states:
                    states[job["id"]] = state
    return states


def build_egg(project_dir: Path, out: Path) -> None:
    """``scrapyd-deploy --build-egg``: the same egg ``scrapyd-deploy`` would upload."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "scrapyd_client.deploy", "--build-egg", str(out)],
            cwd=project_dir, capture_output=True, text=True, timeout=BUILD_EGG_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise OpsError(f"building the egg in {project_dir} timed out after"
                       f" {BUILD_EGG_TIMEOUT:g}s") from exc
    if result.returncode != 0 or not out.is_file():
        raise OpsError(f"building the egg in {project_dir} failed:\n"
                       f"{result.stdout[-2000:]}{result.stderr[-2000:]}")


# --- node URLs and labels -----------------------------------------------------------


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
