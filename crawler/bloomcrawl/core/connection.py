"""Redis clients: URL checks, server descriptions without passwords, one error mapping."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis

from bloomcrawl.core import defaults
from bloomcrawl.core.errors import RedisUnavailableError, SettingError


def describe_redis(client: Any) -> str:
    """A redis:// URL naming the server a client talks to, without its password."""
    try:
        kwargs = client.connection_pool.connection_kwargs
    except AttributeError:
        return repr(client)
    if "path" in kwargs:
        return "unix://%s?db=%s" % (kwargs["path"], kwargs.get("db", 0))
    scheme = "rediss" if kwargs.get("ssl") else "redis"
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
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise SettingError(
            "REDIS_URL %r: scheme must be redis://, rediss:// or unix://, got %r"
            % (url, parts.scheme)
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise SettingError("REDIS_URL %r has no host" % (url,))
    try:
        _ = parts.port
    except ValueError as exc:
        raise SettingError("REDIS_URL %r has an invalid port: %s" % (url, exc)) from exc
    return url


def redis_from_url(url: str, **params: Any) -> redis.Redis:
    """A client for ``url`` with bounded timeouts unless ``params`` say otherwise."""
    check_redis_url(url)
    params.setdefault("socket_connect_timeout", defaults.REDIS_SOCKET_CONNECT_TIMEOUT)
    params.setdefault("socket_timeout", defaults.REDIS_SOCKET_TIMEOUT)
    params.setdefault("health_check_interval", defaults.REDIS_HEALTH_CHECK_INTERVAL)
    try:
        return redis.Redis.from_url(url, **params)
    except ValueError as exc:
        raise SettingError("REDIS_URL %r: %s" % (url, exc)) from exc


def ping(client: redis.Redis) -> None:
    """PING, or raise :class:`RedisUnavailableError` saying whether it was the credentials."""
    try:
        with redis_errors(client):
            client.ping()
    except RedisUnavailableError as exc:
        # AuthenticationError is a ConnectionError: say which it was
        if isinstance(exc.__cause__, redis.AuthenticationError):
            raise RedisUnavailableError(
                "Redis at %s refused the credentials: %s" % (describe_redis(client), exc.__cause__)
            ) from exc.__cause__
        raise


class OutageLog:
    """Logs a Redis outage once when it starts and once when it ends, whatever the retries.

    ``consequence`` says what the caller does meanwhile (``"retrying; nothing
    leased is lost"``); ``extra`` goes to every log record (Scrapy's spider).
    """

    def __init__(self, logger: logging.Logger, client: Any, consequence: str,
                 extra: dict[str, Any] | None = None) -> None:
        self.logger = logger
        self.client = client
        self.consequence = consequence
        self.extra = extra
        self.down_since: float | None = None

    def failed(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.logger.warning("Redis at %s unreachable (%s): %s", describe_redis(self.client),
                                exc, self.consequence, extra=self.extra)

    def ok(self) -> None:
        if self.down_since is not None:
            self.logger.warning("Redis at %s is back after %.1f s", describe_redis(self.client),
                                time.monotonic() - self.down_since, extra=self.extra)
            self.down_since = None
