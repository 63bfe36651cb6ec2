"""Recurring crawls: schedules stored in Redis, each fired once per slot.

A schedule says what to crawl (spider, project, Scrapy settings, spider
arguments, start URLs) and when: ``every`` seconds from the moment it was
made (the first slot is that moment), or a cron expression (UTC, parsed by
croniter). Its *slots* are those times. Slots before the schedule was made
are never due.

A timer (:mod:`bloomcrawl.ops.timer`) asks each schedule for its due slot,
the latest slot not after now (Redis ``TIME``, never a host's clock), and
*claims* it with one script: the claim succeeds when the slot is newer than
the last one claimed and the schedule is not paused. Any number of timers
may run; each slot is claimed once. A claim whose reply was lost is sent
again by its timer, and Redis answers it yes again until that timer records
the slot's firing (``fired_slot``). A timer that was down for several slots
finds only the latest one due: it catches up once. A claim is made before
the jobs start, so a timer that dies between the two leaves the slot
claimed and unfired (at most once, never twice); the slot's outcome then
never comes, and ``bloomcrawl_schedule_last_outcome`` says so.

Keys (one hash tag: one slot on Redis Cluster):

``{bloomcrawl:schedules}:names``      set   schedule names
``{bloomcrawl:schedules}:s:<name>``   hash  ``spec`` (JSON), ``created``,
                                            ``paused``, ``last_slot``, ``claimed_by``,
                                            ``claimed_at``, ``outcome`` (JSON), ``fired``,
                                            ``fired_slot`` (the slot of that outcome)
``{bloomcrawl:schedules}:log:<name>`` list  the last :data:`KEEP_FIRINGS` outcomes,
                                            newest first
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
from croniter import croniter

from bloomcrawl.core.scripts import Script, ScriptCall, run_scripts
from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.redis_masters import redis_time_ms

TAG = "{bloomcrawl:schedules}"
NAMES_KEY = TAG + ":names"
#: the shortest interval a schedule may have, in seconds
MIN_EVERY_S = 1.0
#: a schedule name: what a Redis key and a Prometheus label can hold plainly
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")

CLAIM = Script("schedule_claim.lua")


#: firings kept in a schedule's log
KEEP_FIRINGS = 100


def schedule_key(name: str) -> str:
    return "%s:s:%s" % (TAG, name)


def firings_key(name: str) -> str:
    return "%s:log:%s" % (TAG, name)


def parse_duration(text: str) -> float:
    """Seconds from ``"90"``, ``"90s"``, ``"15m"``, ``"6h"``, ``"7d"`` or ``"2w"``."""
    match = _DURATION_RE.match(str(text))
    if not match:
        raise ValueError("not a duration: %r (seconds, or a number with s, m, h, d or w:"
                         " 90, 15m, 6h, 7d)" % (text,))
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise OpsError("schedule name %r: use 1-64 letters, digits, '_', '.', '-',"
                       " starting with a letter or digit" % (name,))
    return name


@dataclass
class Spec:
    """What a schedule crawls, and when."""

    name: str
    spider: str
    project: str
    #: seconds between slots (None: ``cron`` gives them)
    every: float | None = None
    #: a five-field cron expression, in UTC
    cron: str | None = None
    #: ``NAME=VALUE`` Scrapy settings and spider arguments, as ``bloomcrawl crawl`` takes them
    settings: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    allowed_domains: str | None = None
    depth_limit: int | None = None
    max_idle: float | None = None

    def check(self) -> Spec:
        check_name(self.name)
        if (self.every is None) == (self.cron is None):
            raise OpsError("schedule %s: give one of --every and --cron" % self.name)
        if self.every is not None and not (math.isfinite(self.every)
                                           and self.every >= MIN_EVERY_S):
            raise OpsError("schedule %s: --every must be at least %g s, got %r"
                           % (self.name, MIN_EVERY_S, self.every))
        if self.cron is not None and not croniter.is_valid(self.cron):
            raise OpsError("schedule %s: not a cron expression: %r (five fields: minute hour"
                           " day-of-month month day-of-week, in UTC)" % (self.name, self.cron))
        return self

    def when(self) -> str:
        return "every %s" % describe_seconds(self.every) if self.every is not None else (
            "cron %r (UTC)" % self.cron)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Spec:
        data = json.loads(raw)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def describe_seconds(seconds: float) -> str:
    for unit in ("w", "d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return "%d%s" % (seconds // size, unit)
    return "%gs" % seconds


@dataclass
class Schedule:
    """A stored schedule and what its timers recorded."""

    spec: Spec
    created: float
    paused: bool = False
    #: the last slot claimed (None: none yet)
    last_slot: float | None = None
    claimed_by: str = ""
    claimed_at: float | None = None
    #: what the last firing did (``Outcome`` as a dict), once recorded
    outcome: dict[str, Any] | None = None
    fired: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    def due_slot(self, now: float) -> float | None:
        """The latest slot not after ``now`` and not before the schedule was made."""
        if now < self.created:
            return None
        if self.spec.every is not None:
            every = self.spec.every
            return self.created + math.floor((now - self.created) / every) * every
        assert self.spec.cron is not None
        slot = float(croniter(self.spec.cron, now + 1e-6).get_prev(float))
        return slot if slot >= self.created else None

    def next_slot(self, now: float) -> float:
        """The first slot after ``now``."""
        if self.spec.every is not None:
            every = self.spec.every
            if now < self.created:
                return self.created
            return self.created + (math.floor((now - self.created) / every) + 1) * every
        assert self.spec.cron is not None
        return float(croniter(self.spec.cron, max(now, self.created - 1e-6)).get_next(float))


def redis_time(client: redis.Redis) -> float:
    """Now in seconds by Redis's clock (``TIME``), the one every timer and worker shares."""
    return redis_time_ms(client) / 1000


class ScheduleStore:
    """The schedules in one Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def add(self, spec: Spec, *, replace: bool = False) -> Schedule:
        spec.check()
        key = schedule_key(spec.name)
        if not replace and self.client.exists(key):
            raise OpsError("a schedule named %s exists: remove it first, or pass --replace"
                           % spec.name)
        now = redis_time(self.client)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, mapping={"spec": spec.to_json(), "created": repr(now), "paused": "0",
                                "fired": 0})
        pipe.sadd(NAMES_KEY, spec.name)
        pipe.execute()
        return Schedule(spec, now)

    def get(self, name: str) -> Schedule:
        raw: dict[bytes, bytes] = self.client.hgetall(schedule_key(name))  # type: ignore[assignment]
        if not raw:
            raise OpsError("no schedule named %s (bloomcrawl schedules lists them)" % name)
        return self._load(raw)

    def all(self) -> list[Schedule]:
        names = sorted(n.decode() for n in self.client.smembers(NAMES_KEY))  # type: ignore[union-attr]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(schedule_key(name))
        out = []
        for raw in pipe.execute():
            if raw:
                out.append(self._load(raw))
        return out

    def set_paused(self, name: str, paused: bool) -> None:
        self.get(name)
        self.client.hset(schedule_key(name), "paused", "1" if paused else "0")

    def remove(self, name: str) -> None:
        self.get(name)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(schedule_key(name), firings_key(name))
        pipe.srem(NAMES_KEY, name)
        pipe.execute()

    def claim(self, name: str, slot: float, timer: str) -> bool:
        """Claim ``slot`` for ``timer``: True once per slot, whichever timer asks first (and
        again to that timer until it records the firing: a claim sent again after its reply
        was lost)."""
        (won,) = run_scripts(self.client, [ScriptCall(CLAIM, [schedule_key(name)],
                                                      [repr(slot), timer])])
        return bool(won)

    def record(self, name: str, outcome: dict[str, Any]) -> None:
        """What the firing of the last claimed slot did."""
        key = schedule_key(name)
        text = json.dumps(outcome, sort_keys=True)
        pipe = self.client.pipeline(transaction=True)
        pipe.exists(key)
        # the slot fired: a claim of it sent again by the same timer wins no more
        pipe.hset(key, mapping={"outcome": text, "fired_slot": repr(outcome["slot"])})
        pipe.hincrby(key, "fired", 1)
        pipe.lpush(firings_key(name), text)
        pipe.ltrim(firings_key(name), 0, KEEP_FIRINGS - 1)
        exists, *_ = pipe.execute()
        if not exists:  # removed while firing: leave no half hash behind
            self.client.delete(key, firings_key(name))

    def firings(self, name: str) -> list[dict[str, Any]]:
        """The last outcomes of ``name``, newest first."""
        raw = self.client.lrange(firings_key(name), 0, -1)
        return [json.loads(r) for r in raw]

    @staticmethod
    def _load(raw: dict[bytes, bytes]) -> Schedule:
        def text(name: str) -> str:
            return raw.get(name.encode(), b"").decode()

        last = text("last_slot")
        claimed_at = text("claimed_at")
        outcome = text("outcome")
        return Schedule(Spec.from_json(raw[b"spec"]), float(text("created")),
                        paused=text("paused") == "1",
                        last_slot=float(last) if last else None,
                        claimed_by=text("claimed_by"),
                        claimed_at=float(claimed_at) if claimed_at else None,
                        outcome=json.loads(outcome) if outcome else None,
                        fired=int(text("fired") or 0))


def spec_from_options(name: str, *, spider: str, project: str, every: str | None,
                      cron: str | None, settings: Sequence[str], arguments: Sequence[str],
                      urls: Sequence[str], allowed_domains: str | None,
                      depth_limit: int | None, max_idle: float | None) -> Spec:
    """A checked :class:`Spec` from the command line's values."""
    seconds = None
    if every is not None:
        try:
            seconds = parse_duration(every)
        except ValueError as exc:
            raise OpsError("--every: %s" % exc) from None
    return Spec(check_name(name), spider, project, every=seconds, cron=cron,
                settings=list(settings),
                arguments=list(arguments), urls=list(urls), allowed_domains=allowed_domains,
                depth_limit=depth_limit, max_idle=max_idle).check()
