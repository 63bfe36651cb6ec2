"""The scrapyd client: every request bloomcrawl makes to a scrapyd node.

A :class:`Node` is one scrapyd (its URL and basic-auth credentials).
:meth:`Node.request` calls a JSON endpoint and raises :class:`ScrapydError`
on any failure; :meth:`Node.status` asks ``daemonstatus.json`` and never
raises (a node that does not answer is ``up=False`` with the reason). The
functions below act on many nodes at once, concurrently, in node order:
:func:`deploy` uploads one egg (built once by :func:`build_egg`, as
``scrapyd-deploy --build-egg`` does) and fails on a node where the project's
spiders do not import (:class:`ProjectLoadError`), :func:`schedule` starts
one job per node, :func:`job_states` and :func:`node_statuses` ask how they
are doing.

The CLI, the exporter and ``bloomcrawl status`` all go through this module,
which is what they import: building and checking an egg lives in
:mod:`~bloomcrawl.ops.scrapyd_eggs`, node URLs and their metric labels
(``host:port``) in :mod:`~bloomcrawl.ops.scrapyd_urls`, and both are
offered here too.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.noproxy import OPENER, opener_for
from bloomcrawl.ops.scrapyd_eggs import (
    BUILD_EGG_TIMEOUT,
    build_egg,
    check_egg,
    egg_packages,
    load_failure,
)
from bloomcrawl.ops.scrapyd_urls import (
    DEFAULT_PORT,
    check_node_url,
    node_label,
    node_labels_by_host,
    normalise_node_url,
    resolve_service,
)

__all__ = [
    "BUILD_EGG_TIMEOUT",
    "DEFAULT_PORT",
    "HTTP_TIMEOUT",
    "JOB_STATES",
    "MAX_PARALLEL",
    "STATUS_TIMEOUT",
    "Node",
    "NodeStatus",
    "ProjectLoadError",
    "ScrapydError",
    "build_egg",
    "check_egg",
    "check_node_url",
    "deploy",
    "egg_packages",
    "for_each_node",
    "job_entries",
    "job_states",
    "load_failure",
    "multipart",
    "node_label",
    "node_labels_by_host",
    "node_statuses",
    "normalise_node_url",
    "resolve_service",
    "schedule",
    "schedule_each",
    "states_of",
]

#: seconds for an endpoint that does work (addversion, schedule)
HTTP_TIMEOUT = 30.0
#: seconds for ``daemonstatus.json``: a node slower than this is reported down
STATUS_TIMEOUT = 2.0
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


class ProjectLoadError(ScrapydError):
    """A node stored the egg, but the project's spiders do not load there.

    scrapyd runs ``scrapy list`` on every egg it is given; ``reason`` is one
    line saying what went wrong (the module that does not import),
    ``traceback`` scrapyd's whole answer. The message names the node.
    """

    def __init__(self, url: str, reason: str, traceback: str) -> None:
        super().__init__(url, reason)
        self.traceback = traceback



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
    """One scrapyd: ``http://host:port`` or ``https://...`` (normalised), its basic-auth
    credentials and, for https, the CA its certificate must chain to (``ca_pem``, PEM
    text; empty: the system's trusted CAs)."""

    url: str
    username: str = ""
    password: str = field(default="", repr=False)
    ca_pem: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.url = normalise_node_url(self.url)
        self._opener = OPENER
        #: why no request can be made (a CA that does not load): each request fails with it
        self._unusable = ""
        if self.url.startswith("https://") and self.ca_pem:
            try:
                context = ssl.create_default_context(cadata=self.ca_pem)
            except (ssl.SSLError, ValueError) as exc:
                self._unusable = f"its CA certificate does not load: {exc}"
            else:
                self._opener = opener_for(context)

    def _failure(self, url: str, exc: BaseException) -> ScrapydError:
        """What a failed request says: an untrusted certificate or refused credentials
        named as such, else the node could not be reached."""
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLCertVerificationError):
            return ScrapydError(url, "its TLS certificate is not trusted (%s): give the CA that"
                                " signed it (bloomcrawl nodes add --ca-file)"
                                % reason.verify_message)
        if isinstance(exc, urllib.error.HTTPError) and exc.code == 401:
            return ScrapydError(url, "HTTP 401: the node refused the credentials (check"
                                " SCRAPYD_USERNAME and SCRAPYD_PASSWORD)")
        if isinstance(exc, urllib.error.HTTPError):
            detail = exc.read(500).decode(errors="replace").strip()
            return ScrapydError(url, f"HTTP {exc.code} {exc.reason}", detail)
        if isinstance(exc, http.client.HTTPException):
            return ScrapydError(url, str(exc) or type(exc).__name__)
        return ScrapydError(url, str(reason) or type(exc).__name__, unreachable=self.url)

    def _auth(self) -> dict[str, str]:
        """The basic-auth header, if the node has credentials."""
        if not self.username:
            return {}
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return {"Authorization": "Basic " + token}

    def _call(self, path: str, body: bytes | None, content_type: str | None,
              timeout: float) -> Any:
        """The decoded JSON answer of ``path``; :class:`ScrapydError` when there is none."""
        url = self.url + "/" + path
        if self._unusable:
            raise ScrapydError(url, self._unusable)
        request = urllib.request.Request(
            url, data=body, headers={"Accept": "application/json", **self._auth()})
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with self._opener.open(request, timeout=timeout) as response:
                raw = response.read()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise self._failure(url, exc) from exc
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
        return self._checked(path, self._call(path, body, content_type, timeout))

    def _checked(self, path: str, answer: Any) -> dict[str, Any]:
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            raise ScrapydError(self.url + "/" + path, _message(answer).strip()[-1500:])
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
        """Upload ``egg``; :class:`ProjectLoadError` when its spiders do not load on the node.

        scrapyd keeps an egg whose ``scrapy list`` failed, as the project's newest
        version: that version is deleted again, so that the node goes on with the
        version it had and no job ever starts the broken one.
        """
        body, content_type = multipart({"project": project, "version": version},
                                       {"egg": ("project.egg", egg)})
        answer = self._call("addversion.json", body, content_type, HTTP_TIMEOUT)
        message = _message(answer)
        if (isinstance(answer, dict) and answer.get("status") == "error"
                and "Traceback (most recent call last)" in message):
            reason = load_failure(message, egg_packages(egg))
            try:
                self.request("delversion.json", {"project": project, "version": version})
            except ScrapydError as exc:
                reason += f" (the version stays on the node: {exc.reason})"
            raise ProjectLoadError(self.url, reason, message)
        return self._checked("addversion.json", answer)

    def list_spiders(self, project: str, version: str | None = None) -> list[str]:
        query = {"project": project, **({"_version": version} if version else {})}
        answer = self.request("listspiders.json?" + urllib.parse.urlencode(query))
        return [str(name) for name in answer.get("spiders", [])]

    def list_projects(self, timeout: float = HTTP_TIMEOUT) -> list[str]:
        answer = self.request("listprojects.json", timeout=timeout)
        return [str(name) for name in answer.get("projects", [])]

    def list_jobs(self, project: str, timeout: float = 10.0) -> dict[str, Any]:
        return self.request(f"listjobs.json?project={urllib.parse.quote(project)}",
                            timeout=timeout)

    def log_tail(self, log_url: str, size: int = 16384, timeout: float = 10.0) -> str:
        """The last ``size`` bytes of a job's log (``log_url`` from listjobs.json)."""
        url = urllib.parse.urljoin(self.url + "/", log_url)
        headers = self._auth()
        try:
            # twisted's static files answer a suffix range (bytes=-N) with an error: the
            # length first, then the range from an offset
            head = urllib.request.Request(url, headers=headers, method="HEAD")
            with self._opener.open(head, timeout=timeout) as response:
                length = int(response.headers.get("Content-Length") or 0)
            start = max(0, length - size)
            request = urllib.request.Request(url, headers={**headers,
                                                           "Range": f"bytes={start}-"})
            with self._opener.open(request, timeout=timeout) as response:
                raw: bytes = response.read()
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise self._failure(url, exc) from exc
        return raw[-size:].decode(errors="replace")


def _message(answer: Any) -> str:
    """The ``message`` of a JSON answer (the answer itself when it has none)."""
    return str(answer.get("message", answer) if isinstance(answer, dict) else answer)


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
    """Upload ``egg`` as ``project`` ``version`` to every node: (node, answer, error).

    An answer's ``spider_names`` are the spiders the node lists for that
    version (absent when it would not say).
    """
    def upload(node: Node) -> dict[str, Any]:
        answer = node.add_version(project, version, egg)
        try:
            answer["spider_names"] = node.list_spiders(project, version)
        except ScrapydError:
            pass  # deployed all the same: the answer has the count
        return answer

    return for_each_node(nodes, upload)


def schedule_each(nodes: Sequence[Node], project: str, spider: str,
                  settings: Sequence[tuple[str, str]], spider_args: Sequence[tuple[str, str]]
                  ) -> list[tuple[Node, dict[str, Any] | None, str | None]]:
    """Start one job on every node: (node, answer, error) for each."""
    data: list[tuple[str, str]] = [("project", project), ("spider", spider)]
    data += [("setting", "{}={}".format(*pair)) for pair in settings]
    data += list(spider_args)
    return for_each_node(nodes, lambda node: node.request("schedule.json", data))


def schedule(nodes: Sequence[Node], project: str, spider: str,
             settings: Sequence[tuple[str, str]],
             spider_args: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Start one job on every node; {node url: job id}. Fails when any node fails, after
    cancelling the jobs the other nodes started: a crawl starts on all its nodes or on none
    (one that failed is run again once the cause is fixed, not added to)."""
    results = schedule_each(nodes, project, spider, settings, spider_args)
    errors = [error for _, _, error in results if error]
    if errors:
        failed = "scheduling %s failed on %d of %d node(s): %s" % (
            spider, len(errors), len(results), "; ".join(errors))
        started = [(node, str(answer["jobid"])) for node, answer, _ in results if answer]
        raise OpsError(failed + cancel_started(project, spider, started))
    return {node.url: str(answer["jobid"]) for node, answer, _ in results if answer}


def cancel_started(project: str, spider: str, started: Sequence[tuple[Node, str]]) -> str:
    """Cancel the jobs a failed :func:`schedule` started; what became of them, said for its
    error message."""
    if not started:
        return ""
    jobs = {node.url: job for node, job in started}
    results = for_each_node([node for node, _ in started],
                            lambda node: cancel_job(node, project, jobs[node.url]))
    cancelled = [f"{node.url} {jobs[node.url]}" for node, answer, _ in results if answer]
    left = [f"{node.url} {jobs[node.url]} ({error})" for node, answer, error in results
            if answer is None]
    said = ""
    if cancelled:
        said += f"; cancelled the job(s) started on the other node(s): {', '.join(cancelled)}"
    if left:
        said += (f"; still running: {', '.join(left)}: stop them with `bloomcrawl cancel"
                 f" --project {project} --spider {spider}`")
    return said


def cancel_job(node: Node, project: str, job: str, tries: int = 10) -> dict[str, Any]:
    """``cancel.json`` of a job just scheduled, until scrapyd finds it: one its poller took
    from the queue and is still starting is neither pending nor running for a moment, and
    a cancel then would leave it to run."""
    for _ in range(tries - 1):
        answer = node.request("cancel.json", [("project", project), ("job", job)])
        if answer.get("prevstate") is not None:
            return answer
        time.sleep(0.2)
    return node.request("cancel.json", [("project", project), ("job", job)])


def cancel_spider(nodes: Sequence[Node], project: str | None, spider: str
                  ) -> list[tuple[Node, list[str] | None, str | None]]:
    """Cancel every pending or running job of ``spider`` on every node, in ``project`` (None:
    in every project the node has): (node, the jobs cancelled, error) for each."""
    def cancel(node: Node) -> list[str]:
        cancelled = []
        for name in [project] if project is not None else node.list_projects():
            listed = node.list_jobs(name)
            jobs = [str(job["id"]) for state in ("pending", "running")
                    for job in listed.get(state, []) if job.get("spider") == spider]
            for job in jobs:
                node.request("cancel.json", [("project", name), ("job", job)])
            cancelled += jobs
        return cancelled

    return for_each_node(nodes, cancel)


def job_entries(nodes: Sequence[Node], project: str, jobs: dict[str, str]
                ) -> dict[str, tuple[str, dict[str, Any]]]:
    """{job id: (state, its listjobs.json entry)}; ``jobs`` is {node url: job id}.

    The state is pending, running or finished; ``gone`` when the job's node
    answered without it (scrapyd restarted and forgot it), ``unreachable``
    when the node did not answer (or is not among ``nodes``).
    """
    found: dict[str, tuple[str, dict[str, Any]]] = {
        job: ("unreachable", {}) for job in jobs.values()}
    asked = [node for node in nodes if node.url in jobs]
    for node, answer, _error in for_each_node(asked, lambda node: node.list_jobs(project)):
        if answer is None:
            continue
        job = jobs[node.url]
        found[job] = ("gone", {})
        for state in JOB_STATES:
            for entry in answer.get(state, []):
                if entry.get("id") == job:
                    found[job] = (state, entry)
    return found


def job_states(nodes: Sequence[Node], project: str, jobs: dict[str, str]) -> dict[str, str]:
    """{job id: pending | running | finished | unknown}; ``jobs`` is {node url: job id}."""
    return states_of(job_entries(nodes, project, jobs))


def states_of(entries: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """:func:`job_states` of what :func:`job_entries` found."""
    return {job: state if state in JOB_STATES else "unknown"
            for job, (state, _) in entries.items()}
