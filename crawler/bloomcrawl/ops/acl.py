"""The Redis ACL users of the cluster's roles, as docs/scale.md gives them.

A Redis published off the machine (``bloomcrawl up --redis-bind``) gets one
user per role, each with its password from ``.env`` (``REDIS_<ROLE>_PASSWORD``):
a remote worker host gets ``bloomcrawl-worker``, which reaches its spiders'
keys alone, never the other roles' commands. ``tests/test_acl_roles.py``
checks these rules against the document, and the document's against real
crawls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

ROLES = ("worker", "exporter", "timer", "operator")

#: each role's rules after ``on >PASSWORD``; ``{keys}``: the worker's spiders' key patterns
RULES = {
    "worker": "resetkeys resetchannels -@all {keys} +ping +info +role +command +cluster|slots"
              " +cluster|shards +asking +script|load +evalsha +multi +exec +module|list +hget"
              " +hmget +hset +hsetnx +hgetall +hincrby +hdel +exists +strlen +getrange +setrange"
              " +incr +incrby +time +zadd +zrem +zpopmin +zcard +zscore +zrangebyscore +rpush"
              " +lpush +lpop +rpop +llen +sadd +sismember +get +decr +zincrby +zrange"
              " +zremrangebyscore +set +pexpire",
    "exporter": "resetkeys resetchannels -@all %R~* +ping +info +command +cluster|slots"
                " +cluster|shards +asking +scan +dbsize +time +hgetall +hmget +hget +hlen +get"
                " +strlen +llen +zcard +zcount +scard +script|load +evalsha_ro +zrevrange"
                " +hscan +zrangebyscore +zscore +hvals +smembers +lrange",
    "timer": "resetkeys resetchannels -@all ~{bloomcrawl:* ~*:start_urls %R~*:stats +ping"
             " +info +command +cluster|slots +cluster|shards +asking +script|load +evalsha"
             " +time +multi +exec +exists +del +hget +hgetall +hset +hincrby +sadd +srem"
             " +smembers +lpush +lrem +lrange +ltrim +rpush",
    "operator": "resetkeys resetchannels ~* +@all -@dangerous -@admin +info +role",
}

DEFAULT_SPIDERS = ("site",)
#: the ``.env`` setting naming the spiders (comma-separated) whose keys the worker user reaches
SPIDERS_VARIABLE = "REDIS_WORKER_SPIDERS"


def worker_spiders(env: dict[str, str]) -> list[str]:
    """The spiders of :data:`SPIDERS_VARIABLE` in ``env``, else :data:`DEFAULT_SPIDERS`."""
    names = [name.strip() for name in env.get(SPIDERS_VARIABLE, "").split(",") if name.strip()]
    return names or list(DEFAULT_SPIDERS)


def config_lines(env: dict[str, str]) -> list[str]:
    """Every role's ``user`` directive, the passwords and spiders from ``env`` (``.env``)."""
    spiders = worker_spiders(env)
    return [config_line(role, env[password_variable(role)], spiders) for role in ROLES]


def user_name(role: str) -> str:
    return "bloomcrawl-" + role


def password_variable(role: str) -> str:
    """The ``.env`` name of the role's password."""
    return "REDIS_%s_PASSWORD" % role.upper()


def rules(role: str, spiders: Sequence[str] = DEFAULT_SPIDERS) -> list[str]:
    """The role's ACL rules, without the user's name, state and password."""
    keys = " ".join("~%s:* ~{%s:*" % (spider, spider) for spider in spiders)
    return RULES[role].replace("{keys}", keys).split()


def config_line(role: str, password: str, spiders: Sequence[str] = DEFAULT_SPIDERS) -> str:
    """A redis.conf ``user`` directive; it holds the password's SHA-256 (``#<hex>``), never
    the password, and goes in a file, never on a command line."""
    if not password:
        raise ValueError("a role's password must not be empty")
    digest = hashlib.sha256(password.encode()).hexdigest()
    return " ".join(["user", user_name(role), "on", "#" + digest, *rules(role, spiders)])
