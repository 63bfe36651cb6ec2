"""Redis connections and typed settings shared by the Scrapy components."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis

from bloomcrawl.bloom import RedisUnavailableError, describe_redis, redis_errors

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


class SettingError(ValueError):
    """A setting has a value bloomcrawl cannot use; the message names it."""


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
    check_redis_url(url)
    params.setdefault("socket_connect_timeout", 5)
    params.setdefault("socket_timeout", 30)
    params.setdefault("health_check_interval", 30)
    try:
        return redis.Redis.from_url(url, **params)
    except ValueError as exc:
        raise SettingError("REDIS_URL %r: %s" % (url, exc)) from exc


def redis_from_settings(settings: BaseSettings) -> redis.Redis:
    """A client for REDIS_URL (plus REDIS_PARAMS), checked with a PING."""
    url = settings.get("REDIS_URL") or DEFAULT_REDIS_URL
    params = dict(settings.getdict("REDIS_PARAMS"))
    params.pop("decode_responses", None)
    client = redis_from_url(url, **params)
    ping(client)
    return client


def ping(client: redis.Redis) -> None:
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


def get_int(settings: BaseSettings, name: str, default: int, minimum: int | None = None) -> int:
    """An integer setting; 0 is a value, not "unset"."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
        if isinstance(raw, float) and raw != value:
            raise ValueError(raw)
    except (TypeError, ValueError) as exc:
        raise SettingError("%s must be an integer, got %r" % (name, raw)) from exc
    if minimum is not None and value < minimum:
        raise SettingError("%s must be >= %d, got %r" % (name, minimum, raw))
    return value


def get_optional_int(settings: BaseSettings, name: str) -> int | None:
    raw = settings.get(name)
    if raw is None or raw == "":
        return None
    return get_int(settings, name, 0)


def get_float(
    settings: BaseSettings,
    name: str,
    default: float,
    low: float | None = None,
    high: float | None = None,
) -> float:
    """A float setting, optionally in the open interval (low, high)."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError) as exc:
        raise SettingError("%s must be a number, got %r" % (name, raw)) from exc
    if (low is not None and value <= low) or (high is not None and value >= high):
        raise SettingError("%s must be in (%s, %s), got %r" % (name, low, high, raw))
    return value
