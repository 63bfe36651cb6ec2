"""Redis clients: URL checks, server descriptions without passwords, one error mapping."""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.cluster
from redis.cluster import ClusterNode
from redis.connection import parse_url

from bloomcrawl.core import defaults
from bloomcrawl.core.errors import RedisUnavailableError, SettingError

#: URL schemes of a Redis Cluster: ``redis+cluster://host:port[,host:port...]``
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(client: Any) -> bool:
    """True for a redis-py RedisCluster client."""
    return isinstance(client, redis.cluster.RedisCluster)


def describe_redis(client: Any) -> str:
    """A URL naming the server (or cluster) a client talks to, without its password."""
    if is_cluster(client):
        kwargs = client.nodes_manager.connection_kwargs
        scheme = "rediss+cluster" if kwargs.get("ssl") else "redis+cluster"
        # the nodes it was given: redis-py adds every node it discovers to its own list
        nodes = getattr(client, "bloomcrawl_startup_nodes", None) or sorted(
            node.name for node in client.nodes_manager.startup_nodes.values())
        return "%s://%s" % (scheme, ",".join(nodes))
    try:
        kwargs = client.connection_pool.connection_kwargs
    except AttributeError:
        return repr(client)
    if "path" in kwargs:
        return "unix://%s?db=%s" % (kwargs["path"], kwargs.get("db", 0))
    # from_url("rediss://...") sets the pool's connection class, not an ssl argument
    tls = kwargs.get("ssl") or issubclass(
        getattr(client.connection_pool, "connection_class", object), redis.SSLConnection)
    scheme = "rediss" if tls else "redis"
    return "%s://%s:%s/%s" % (
        scheme,
        kwargs.get("host", "localhost"),
        kwargs.get("port", 6379),
        kwargs.get("db", 0),
    )


@contextmanager
def redis_errors(client: Any) -> Iterator[None]:
    """Turn connection failures into :class:`RedisUnavailableError` naming the server."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnavailableError(
            "cannot reach Redis at %s: %s" % (describe_redis(client), exc)
        ) from exc


def check_redis_url(url: str) -> str:
    """Return ``url`` if redis-py can use it, else raise :class:`SettingError`."""
    if not isinstance(url, str) or not url:
        raise SettingError("REDIS_URL must be a redis:// URL, got %r" % (url,))
    parts = urlsplit(url)
    if parts.scheme in CLUSTER_SCHEMES:
        _cluster_nodes(url)
        return url
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise SettingError(
            "REDIS_URL %r: scheme must be redis://, rediss://, unix://, redis+cluster:// or"
            " rediss+cluster://, got %r" % (url, parts.scheme)
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise SettingError("REDIS_URL %r has no host" % (url,))
    try:
        _ = parts.port
    except ValueError as exc:
        raise SettingError("REDIS_URL %r has an invalid port: %s" % (url, exc)) from exc
    return url


def _cluster_nodes(url: str) -> list[tuple[str, int]]:
    """The startup nodes of a ``redis+cluster://[user:password@]host:port[,host:port]`` URL."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    nodes = []
    for entry in hosts.split(","):
        host, _, port = entry.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingError("REDIS_URL %r: cluster node %r must be host:port" % (url, entry))
        nodes.append((host, int(port)))
    if parts.path not in ("", "/", "/0"):
        raise SettingError("REDIS_URL %r: Redis Cluster has database 0 only, got %r"
                           % (url, parts.path))
    return nodes


def cluster_url(nodes: Any) -> str:
    """A ``redis+cluster://`` URL for REDIS_CLUSTER_NODES (``"h:p,h:p"`` or a list)."""
    if isinstance(nodes, str):
        nodes = [n for n in nodes.split(",") if n.strip()]
    if not isinstance(nodes, list | tuple) or not nodes or not all(
            isinstance(n, str) for n in nodes):
        raise SettingError("REDIS_CLUSTER_NODES must be host:port entries, got %r" % (nodes,))
    url = "redis+cluster://" + ",".join(n.strip() for n in nodes)
    try:
        check_redis_url(url)
    except SettingError as exc:
        raise SettingError("REDIS_CLUSTER_NODES: %s" % exc) from exc
    return url


#: set to 1 to allow plain text (redis://, http://) to addresses off this machine
INSECURE_ENV = "BLOOMCRAWL_INSECURE"


def insecure_allowed() -> bool:
    """Whether :data:`INSECURE_ENV` allows plain text off this machine (``--insecure``
    sets it for the command and what it starts)."""
    return os.environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


def is_local_host(host: str) -> bool:
    """Whether traffic to ``host`` stays on this machine or in a container network.

    Loopback addresses, ``localhost`` and ``*.localhost`` (RFC 6761) stay on
    the machine. A name without a dot (``redis``, ``worker``, ``redis-2``) is
    a compose or Swarm service name: it resolves only inside the project's
    own network, whose addresses (and those found from the name, as the
    exporter finds every worker) are not checked either. Any other address
    or name may be another machine.
    """
    host = host.strip().strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return bool(host) and "." not in host
    return address.is_loopback


def check_plaintext(what: str, url: str, scheme_hint: str, insecure: bool | None = None
                    ) -> None:
    """:class:`SettingError` when ``url`` is plain text to a host off this machine.

    ``what`` names the setting (``REDIS_URL``), ``scheme_hint`` what to use
    instead (``rediss://``). ``insecure`` None: :func:`insecure_allowed`.
    """
    parts = urlsplit(url)
    # a cluster URL lists several host:port entries
    hosts = [urlsplit("//" + entry.strip()).hostname or entry.strip()
             for entry in parts.netloc.rpartition("@")[2].split(",") if entry.strip()]
    remote = [host for host in hosts if not is_local_host(host)]
    if not remote or (insecure if insecure is not None else insecure_allowed()):
        return
    shown = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    raise SettingError(
        "%s %s is plain text to %s, which is not a loopback address: passwords and data would"
        " cross the network unencrypted. Use %s (make certs; see docs/deploy.md), or allow it"
        " with --insecure (%s=1)" % (what, shown, ", ".join(remote), scheme_hint, INSECURE_ENV))


def redis_from_url(url: str, *, insecure: bool | None = None, **params: Any) -> Any:
    """A client for ``url`` with bounded timeouts unless ``params`` say otherwise.

    ``redis+cluster://`` (``rediss+cluster://`` for TLS) gives redis-py's
    RedisCluster: it follows MOVED and ASK, and finds the new master after
    a failover. A plain-text URL (``redis://``) to a host off this machine
    is refused (:func:`check_plaintext`) unless ``insecure`` (None:
    :data:`INSECURE_ENV`) allows it.
    """
    check_redis_url(url)
    if urlsplit(url).scheme in ("redis", "redis+cluster"):
        check_plaintext("REDIS_URL", url, "rediss://", insecure)
    params.setdefault("socket_connect_timeout", defaults.REDIS_SOCKET_CONNECT_TIMEOUT)
    params.setdefault("socket_timeout", defaults.REDIS_SOCKET_TIMEOUT)
    params.setdefault("health_check_interval", defaults.REDIS_HEALTH_CHECK_INTERVAL)
    scheme = urlsplit(url).scheme
    try:
        if scheme in CLUSTER_SCHEMES:
            return _cluster_from_url(url, **params)
        return redis.Redis.from_url(url, **params)
    except ValueError as exc:
        raise SettingError("REDIS_URL %r: %s" % (url, exc)) from exc


def _cluster_from_url(url: str, **params: Any) -> redis.cluster.RedisCluster:
    parts = urlsplit(url)
    nodes = _cluster_nodes(url)
    userinfo = parts.netloc.rpartition("@")[0]
    # redis-py parses credentials and query options of a one-host URL
    single = urlunsplit((CLUSTER_SCHEMES[parts.scheme],
                         (userinfo + "@" if userinfo else "") + "%s:%d" % nodes[0],
                         "", parts.query, ""))
    options = parse_url(single)  # type: ignore[no-untyped-call]
    for name in ("host", "port", "db", "connection_class"):
        options.pop(name, None)
    if parts.scheme == "rediss+cluster":
        options["ssl"] = True
    options.update(params)
    try:
        client = redis.cluster.RedisCluster(
            startup_nodes=[ClusterNode(host, port)  # type: ignore[no-untyped-call]
                           for host, port in nodes], **options)
        client.bloomcrawl_startup_nodes = ["%s:%d" % node for node in nodes]  # type: ignore[attr-defined]
        return client
    except (redis.exceptions.RedisClusterException, redis.ConnectionError,
            redis.TimeoutError) as exc:
        raise RedisUnavailableError("cannot reach Redis Cluster at %s: %s" % (
            url.replace(userinfo + "@", "") if userinfo else url, exc)) from exc


def refused_credentials(client: Any, exc: BaseException) -> str | None:
    """"Redis at ... refused the credentials: ..." when ``exc`` (or the error it wraps) is
    Redis refusing the password or user given, or asking for one; else None.

    AuthenticationError is a ConnectionError: without this it reads as an unreachable server.
    """
    cause = exc if isinstance(exc, redis.AuthenticationError) else exc.__cause__
    if isinstance(cause, redis.AuthenticationError):
        return "Redis at %s refused the credentials: %s" % (describe_redis(client), cause)
    return None


def ping(client: redis.Redis) -> None:
    """PING, or raise :class:`RedisUnavailableError` saying whether it was the credentials."""
    try:
        with redis_errors(client):
            client.ping()
    except RedisUnavailableError as exc:
        refused = refused_credentials(client, exc)
        if refused is not None:
            raise RedisUnavailableError(refused) from exc.__cause__
        raise


#: maxmemory policies under which Redis deletes keys it holds: the frontier's
#: queue, leases and filter would silently lose requests
EVICTING_POLICIES = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random"})


def server_info(client: Any) -> dict[str, Any]:
    """INFO server and memory (run_id, maxmemory_policy, ...), one round trip on Redis 7."""
    with redis_errors(client):
        try:
            info: dict[str, Any] = client.info("server", "memory")
        except redis.ResponseError:  # Redis < 7: one section a call
            info = {**client.info("server"), **client.info("memory")}
    return info


def server_infos(client: Any) -> dict[str, dict[str, Any]]:
    """:func:`server_info` of every master: ``{"host:port": info}`` (one for one Redis)."""
    if not is_cluster(client):
        return {describe_redis(client): server_info(client)}
    infos = {}
    with redis_errors(client):
        for node in client.get_primaries():
            infos[node.name] = client.info("server", "memory", target_nodes=node)
    return infos


def check_eviction_policy(info: dict[str, Any], client: Any, allow: bool) -> None:
    """Refuse a Redis that evicts keys, unless ``allow`` (REDIS_ALLOW_EVICTION) says so."""
    policy = info.get("maxmemory_policy", "noeviction")
    if policy in EVICTING_POLICIES and not allow:
        raise SettingError(
            "Redis at %s evicts keys when full (maxmemory-policy %s): the frontier would lose"
            " queued requests, leases and filter bits without a word. Set maxmemory-policy"
            " noeviction (or volatile-*), or REDIS_ALLOW_EVICTION=True to accept the loss"
            % (describe_redis(client), policy))


class ServerChangedError(redis.RedisError):
    """The Redis behind the client is another server: the call was not sent.

    Not a ConnectionError, so redis-py's retries do not send it on: the
    caller first decides what no longer holds (see :class:`ServerWatch`).
    """


def ask_run_id(connection: Any) -> str:
    """The ``run_id`` of the server behind ``connection`` (a redis-py Connection)."""
    connection.send_command("INFO", "server")
    reply = connection.read_response()
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("run_id:")), "")


def on_each_connection(client: redis.Redis, told: Callable[[Any, str], None]) -> None:
    """Have every new connection of ``client`` (one Redis, not a cluster) ask its
    server's ``run_id`` before its first command and tell ``told(connection, run_id)``,
    which may raise to fail that command (a hook on redis-py's connect)."""
    pool = client.connection_pool
    previous = pool.connection_kwargs.get("redis_connect_func")

    def connected(connection: Any) -> None:
        if previous is not None:
            previous(connection)
        else:
            connection.on_connect()
        told(connection, ask_run_id(connection))

    pool.connection_kwargs["redis_connect_func"] = connected
    pool.disconnect()  # reset() forgets connections without closing their sockets
    pool.reset()  # connections made before the hook would not call it


class ServerWatch:
    """Tells when the Redis behind a client is another server than before.

    A restart or a failover (to a replica, maybe lagging) may roll state
    back, and any of them breaks the client's connections: every new
    connection asks the server's ``run_id`` before its first command (a
    hook on redis-py's connect). On a change, :attr:`epoch` goes up and that
    first call fails with :class:`ServerChangedError` before anything of it
    is sent, so nothing meant for the old state (an ack of work whose
    results the rollback lost) reaches the new one unchecked.

    On Redis Cluster, what matters is who the masters are: :meth:`prime`
    remembers their run_ids, and a connection later made to a master none
    of them was (a replica promoted after its master failed: it is reached
    at its own address, so addresses do not tell) is the change. A client
    may reach a promoted replica over a connection it opened while it was
    a replica, so :meth:`check_masters` asks every master too (the
    scheduler does, with each reaping).
    """

    def __init__(self, client: Any) -> None:
        self.run_id: str | None = None
        self.epoch = 0
        self.cluster = is_cluster(client)
        self._known: set[str] = set()
        self._primed = False
        if self.cluster:
            # RedisCluster runs its own connect first, then this one
            self._previous_hook = client.user_on_connect_func
            client.user_on_connect_func = self._on_cluster_connect
            client.disconnect_connection_pools()  # made before the hook: reconnect through it
            return
        on_each_connection(client, self._on_connect)

    def prime(self, infos: dict[str, dict[str, Any]]) -> None:
        """The servers behind the client now (``infos``, :func:`server_infos`) are known ones."""
        if not self.cluster:
            self.run_id = next(iter(infos.values())).get("run_id")
            return
        self._known.update(str(info.get("run_id")) for info in infos.values())
        self._primed = True

    def check_masters(self, infos: dict[str, dict[str, Any]]) -> bool:
        """True, and :attr:`epoch` up, when a master in ``infos`` was not one before."""
        new = {str(info.get("run_id")) for info in infos.values()} - self._known
        if not new:
            return False
        self._known |= new
        self.run_id = sorted(new)[0]
        if self._primed:
            self.epoch += 1
        return self._primed

    def _on_connect(self, connection: Any, run_id: str) -> None:
        if run_id != self.run_id:
            previous, self.run_id = self.run_id, run_id
            if previous is not None:
                self._changed(connection, "run_id %s, was %s" % (run_id, previous))

    def _on_cluster_connect(self, connection: Any) -> None:
        if self._previous_hook is not None:
            self._previous_hook(connection)
        run_id = ask_run_id(connection)
        if run_id in self._known:
            return
        connection.send_command("ROLE")
        role = connection.read_response()[0]
        if role not in (b"master", "master"):
            return  # a replica answers reads and the slot map, never our writes
        self._known.add(run_id)
        self.run_id = run_id
        if self._primed:
            self._changed(connection, "run_id %s, not a master of the cluster before" % run_id)

    def _changed(self, connection: Any, why: str) -> None:
        self.epoch += 1
        raise ServerChangedError("Redis at %s:%s is another server (%s)" % (
            getattr(connection, "host", "?"), getattr(connection, "port", "?"), why))


#: error replies that say "not now" (memory, a replica, a busy script, loading):
#: the same call may succeed later, so they are retried like a lost connection
TRANSIENT_REPLIES = frozenset({"OOM", "READONLY", "MISCONF", "BUSY", "LOADING", "MASTERDOWN",
                               "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "MOVED", "ASK"})
#: what a loop talking to Redis catches: every failure redis-py reports, and ours
REDIS_ERRORS: tuple[type[BaseException], ...] = (
    redis.RedisError, RedisUnavailableError,
    # not a RedisError: a slot no master serves (mid-failover), a cluster it cannot map
    redis.exceptions.RedisClusterException)


#: redis-py strips these codes from the message and raises its own class instead
_REPLY_CLASSES = {name: code for name, code in (
    ("OutOfMemoryError", "OOM"), ("ReadOnlyError", "READONLY"), ("NoScriptError", "NOSCRIPT"),
    ("TryAgainError", "TRYAGAIN"), ("ClusterDownError", "CLUSTERDOWN"),
    ("MasterDownError", "MASTERDOWN"), ("NoPermissionError", "NOPERM"),
    # Redis Cluster: redirections redis-py did not follow, a slot no master serves
    ("MovedError", "MOVED"), ("AskError", "ASK"), ("SlotNotCoveredError", "CLUSTERDOWN"))}


def error_kind(exc: BaseException) -> str:
    """A short name for a Redis failure: "unreachable", the reply's code ("OOM"), or the type."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | RedisUnavailableError):
        return "unreachable"
    for cls in type(exc).__mro__:
        if cls.__name__ in _REPLY_CLASSES and cls.__module__ == "redis.exceptions":
            return _REPLY_CLASSES[cls.__name__]
    if isinstance(exc, redis.ResponseError):
        return str(exc).split(" ", 1)[0] or "ResponseError"
    return type(exc).__name__


class RedisErrorPolicy:
    """One policy for every loop that talks to Redis: log each kind once, back off, resume.

    A loop calls :meth:`failed` with any error it caught (it never re-raises:
    a loop that dies leaves a worker wedged) and waits the delay it returns;
    :meth:`ok` after a success logs the recovery once. ``consequence`` says
    what the caller does meanwhile (``"retrying; nothing leased is lost"``);
    ``extra`` goes to every log record (Scrapy's spider).
    """

    def __init__(self, logger: logging.Logger, client: Any, consequence: str,
                 extra: dict[str, Any] | None = None, *, first_delay: float = 0.05,
                 max_delay: float = 2.0) -> None:
        self.logger = logger
        self.client = client
        self.consequence = consequence
        self.extra = extra
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.down_since: float | None = None
        self.failures = 0
        self._kinds: set[str] = set()
        self._delay = first_delay

    def failed(self, exc: BaseException) -> float:
        """Log ``exc`` if its kind is new in this outage; returns the delay before a retry."""
        if isinstance(exc, ServerChangedError):
            return 0.0  # not a failure: the caller says what changed, and tries again at once
        kind = error_kind(exc)
        self.failures += 1
        if self.down_since is None:
            self.down_since = time.monotonic()
        if kind not in self._kinds:
            self._kinds.add(kind)
            where = describe_redis(self.client)
            refused = refused_credentials(self.client, exc)
            if refused is not None:
                self.logger.error("%s: %s", refused, self.consequence, extra=self.extra)
            elif kind == "unreachable":
                self.logger.warning("Redis at %s unreachable (%s): %s", where, exc,
                                    self.consequence, extra=self.extra)
            elif kind in TRANSIENT_REPLIES:
                self.logger.warning("Redis at %s refused a command (%s): %s", where, exc,
                                    self.consequence, extra=self.extra)
            else:
                self.logger.error("Redis at %s failed a command (%s: %s): %s", where, kind, exc,
                                  self.consequence, extra=self.extra,
                                  exc_info=not isinstance(exc, REDIS_ERRORS))
        delay = self._delay
        self._delay = min(self.max_delay, self._delay * 2)
        return delay

    def ok(self) -> None:
        if self.down_since is not None:
            self.logger.warning("Redis at %s is back after %.1f s", describe_redis(self.client),
                                time.monotonic() - self.down_since, extra=self.extra)
            self.down_since = None
            self._kinds.clear()
        self._delay = self.first_delay
