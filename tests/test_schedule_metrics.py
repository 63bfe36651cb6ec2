"""The exporter's recurring-crawl metrics (bloomcrawl.ops.schedule_metrics): schedules and
runs made by the real stores in a real redis-server, read by a real exporter scrape."""

from __future__ import annotations

import logging
import time

import pytest
import redis
from prometheus_client import CollectorRegistry

from bloomcrawl.ops import schedule_metrics, timer
from bloomcrawl.ops.exporter import ClusterCollector, build_registry
from bloomcrawl.ops.exporter import redis_client as exporter_client
from bloomcrawl.ops.runs import FINISHED, Run, RunStore, run_key
from bloomcrawl.ops.schedules import Schedule, ScheduleStore, Spec, redis_time, schedule_key

from kit.cluster import RedisClusterProcesses
from kit.exporter import collector_registry
from kit.redis import RedisServer
from kit.wait import wait_until

RESULTS = ("started", "partly_started", "skipped", "failed", "under_way")


def spec(name: str, spider: str = "site", **when: object) -> Spec:
    return Spec(name, spider, "bloomcrawl", **when).check()  # type: ignore[arg-type]


def outcome_of(registry: CollectorRegistry, schedule: str, spider: str = "site"
               ) -> dict[str, float | None]:
    return {result: registry.get_sample_value(
        "bloomcrawl_schedule_last_outcome",
        {"schedule": schedule, "spider": spider, "result": result}) for result in RESULTS}


def outcome(slot: float, result: str, *, manual: bool = False, fired_at: float = 0.0
            ) -> dict[str, object]:
    """An outcome as the timer records it."""
    return timer.outcome_of(slot, fired_at or slot, manual, result)


def fired(store: ScheduleStore, name: str, every: float, result: str = "started") -> Schedule:
    """A schedule made now whose first slot a timer claimed and fired with ``result``."""
    made = store.add(spec(name, every=every))
    assert store.claim(name, made.created, "timer-1")
    store.record(name, outcome(made.created, result))
    return made


def test_each_schedule_s_last_and_next_fire_and_last_outcome(
        redis_server: RedisServer, redis_client: redis.Redis) -> None:
    store = ScheduleStore(redis_client)
    hourly = store.add(spec("hourly", every=3600))
    store.add(spec("nightly", spider="shop", cron="0 3 * * *"))
    store.set_paused("nightly", True)
    registry = collector_registry(redis_server.url)
    get = registry.get_sample_value
    h = {"schedule": "hourly", "spider": "site"}
    n = {"schedule": "nightly", "spider": "shop"}
    c = hourly.created

    before = redis_time(redis_client)
    assert get("bloomcrawl_schedules") == 2
    # made, not fired: its first slot (the moment it was made) waits for a timer
    overdue = get("bloomcrawl_schedule_overdue_seconds", h)
    assert overdue is not None and 0 <= overdue <= before - c + 1
    assert get("bloomcrawl_schedule_next_fire_timestamp_seconds", h) == c
    assert get("bloomcrawl_schedule_interval_seconds", h) == 3600
    assert get("bloomcrawl_schedule_paused", h) == 0
    assert get("bloomcrawl_schedule_firings_total", h) == 0
    assert get("bloomcrawl_schedule_last_fire_timestamp_seconds", h) is None
    assert get("bloomcrawl_schedule_last_slot_timestamp_seconds", h) is None
    assert outcome_of(registry, "hourly") == dict.fromkeys(RESULTS, 0)
    # paused: never overdue, no next fire; a cron schedule has no interval
    assert get("bloomcrawl_schedule_paused", n) == 1
    assert get("bloomcrawl_schedule_overdue_seconds", n) == 0
    assert get("bloomcrawl_schedule_next_fire_timestamp_seconds", n) is None
    assert get("bloomcrawl_schedule_interval_seconds", n) is None

    # a timer claims the slot: its firing is under way until the outcome is recorded
    assert store.claim("hourly", c, "timer-1")
    claimed = store.get("hourly")
    assert get("bloomcrawl_schedule_overdue_seconds", h) == 0
    assert get("bloomcrawl_schedule_last_fire_timestamp_seconds", h) == claimed.claimed_at
    assert get("bloomcrawl_schedule_last_slot_timestamp_seconds", h) == c
    assert get("bloomcrawl_schedule_next_fire_timestamp_seconds", h) == c + 3600
    assert outcome_of(registry, "hourly") == {**dict.fromkeys(RESULTS, 0), "under_way": 1}

    store.record("hourly", outcome(c, "partly started"))
    assert outcome_of(registry, "hourly") == {**dict.fromkeys(RESULTS, 0), "partly_started": 1}
    assert get("bloomcrawl_schedule_firings_total", h) == 1

    # run by hand after the claim: its outcome is the last one
    by_hand = redis_time(redis_client)
    store.record("hourly", outcome(by_hand, "failed", manual=True, fired_at=by_hand))
    assert outcome_of(registry, "hourly") == {**dict.fromkeys(RESULTS, 0), "failed": 1}
    assert get("bloomcrawl_schedule_firings_total", h) == 2
    # the paused schedule is still never fired
    assert outcome_of(registry, "nightly", "shop") == dict.fromkeys(RESULTS, 0)

    store.remove("nightly")
    assert get("bloomcrawl_schedules") == 1
    assert get("bloomcrawl_schedule_paused", n) is None
    assert get("bloomcrawl_recurring_read_errors") == 0


def test_a_due_slot_no_timer_claims_is_overdue_until_claimed(
        redis_server: RedisServer, redis_client: redis.Redis) -> None:
    store = ScheduleStore(redis_client)
    made = fired(store, "often", 1)
    registry = collector_registry(redis_server.url)
    labels = {"schedule": "often", "spider": "site"}

    # no timer runs: the slots come and none is claimed
    def overdue() -> float | None:
        value = registry.get_sample_value("bloomcrawl_schedule_overdue_seconds", labels)
        return value if value is not None and value >= 2.2 else None

    # counted from the first slot missed (created + 1), not from the latest one due
    wait_until(overdue, 15, interval=0.1, what="a slot overdue by 2.2 s")
    before = redis_time(redis_client)
    families = {f.name: f for f in registry.collect()}
    after = redis_time(redis_client)
    [late] = families["bloomcrawl_schedule_overdue_seconds"].samples
    assert before - (made.created + 1) - 0.01 <= late.value <= after - (made.created + 1) + 0.01
    # the slot a timer fires next is the latest one due: in the past, at most 1 s ago
    [next_fire] = families["bloomcrawl_schedule_next_fire_timestamp_seconds"].samples
    assert next_fire.value == made.due_slot(next_fire.value + 0.5)
    assert before - 1.01 <= next_fire.value <= after
    # the last recorded outcome stays what it was: overdue is the signal of a missed firing
    assert outcome_of(registry, "often")["started"] == 1

    # paused, the waiting slot is no longer late
    store.set_paused("often", True)
    assert registry.get_sample_value("bloomcrawl_schedule_overdue_seconds", labels) == 0
    store.set_paused("often", False)
    # claimed by a timer, it is not overdue (the next slot is due within the second)
    now = redis_time(redis_client)
    slot = store.get("often").due_slot(now + 5)
    assert slot is not None and store.claim("often", slot, "timer-1")
    assert registry.get_sample_value("bloomcrawl_schedule_overdue_seconds", labels) == 0


def run(schedule: str, n: int, started: float, *, spider: str = "site") -> Run:
    return Run("%s-%d" % (schedule, n), schedule, spider, "bloomcrawl", slot=started - 1,
               started=started, jobs={"http://127.0.0.1:6800": "job%d" % n},
               stats_start={"pages": 100 * n, "items": 10 * n},
               stats_end={"pages": 100 * n + n, "items": 10 * n + 2 * n, "errors": 1})


def test_the_last_runs_of_each_schedule_by_how_long_ago(
        redis_server: RedisServer, redis_client: redis.Redis) -> None:
    runs = RunStore(redis_client)
    now = redis_time(redis_client)
    made = []
    for n in range(7):  # news-0 is the oldest
        made.append(run("news", n, now - 1000 + 100 * n))
        runs.start(made[-1])
        if n == 3:
            runs.start(run("shop", 0, now - 650, spider="shop"))
    for n, reasons in ((0, {"a": "finished"}), (4, {"a": "finished", "b": "shutdown"}),
                       (5, {"a": "my own reason"})):
        made[n].status, made[n].finished, made[n].reasons = FINISHED, now - 50, reasons
        runs.save(made[n])
    registry = collector_registry(redis_server.url)
    get = registry.get_sample_value

    def at(ago: int, schedule: str = "news", spider: str = "site") -> dict[str, str]:
        return {"schedule": schedule, "spider": spider, "ago": str(ago)}

    # ago 0 is the newest run (news-6, still running), ago 4 is news-2; news-0, 1 are left out
    for ago, n in enumerate((6, 5, 4, 3, 2)):
        assert get("bloomcrawl_run_start_timestamp_seconds", at(ago)) == made[n].started
        assert get("bloomcrawl_run_slot_timestamp_seconds", at(ago)) == made[n].slot
        assert get("bloomcrawl_run_pages", at(ago)) == n
        assert get("bloomcrawl_run_items", at(ago)) == 2 * n
        assert get("bloomcrawl_run_errors", at(ago)) == 1
        assert get("bloomcrawl_run_requests_filtered", at(ago)) == 0
        assert get("bloomcrawl_run_leases_requeued", at(ago)) == 0
        assert get("bloomcrawl_run_jobs", at(ago)) == 1
        assert get("bloomcrawl_run_refused_nodes", at(ago)) == 0
    assert get("bloomcrawl_run_pages", at(5)) is None
    # a running run: no end, its duration runs on to now
    assert get("bloomcrawl_run_running", at(0)) == 1
    assert get("bloomcrawl_run_end_timestamp_seconds", at(0)) is None
    duration = get("bloomcrawl_run_duration_seconds", at(0))
    assert duration is not None and 400 <= duration <= redis_time(redis_client) - now + 400
    # a finished one: its end and its own duration
    assert get("bloomcrawl_run_running", at(1)) == 0
    assert get("bloomcrawl_run_end_timestamp_seconds", at(1)) == now - 50
    assert get("bloomcrawl_run_duration_seconds", at(2)) == pytest.approx(
        now - 50 - made[4].started)
    # its jobs by their finish reason, any unknown reason as "other"
    reasons = {(s.labels["ago"], s.labels["reason"]): s.value for f in registry.collect()
               for s in f.samples if s.name == "bloomcrawl_run_finished_jobs"}
    assert reasons == {("1", "other"): 1, ("2", "finished"): 1, ("2", "shutdown"): 1}
    # each schedule has its own ago
    assert get("bloomcrawl_run_start_timestamp_seconds", at(0, "shop", "shop")) == now - 650
    assert get("bloomcrawl_run_running", at(1, "shop", "shop")) is None
    # a run id is never a label value
    ids = {r.id for r in runs.recent()}
    values = {v for f in registry.collect() for s in f.samples for v in s.labels.values()}
    assert ids and not ids & values


def test_a_malformed_schedule_or_run_is_left_out_and_logged_once(
        redis_server: RedisServer, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    store = ScheduleStore(redis_client)
    store.add(spec("good", every=60))
    store.add(spec("bad", every=60))
    redis_client.hset(schedule_key("bad"), "spec", "{not json")
    runs = RunStore(redis_client)
    now = redis_time(redis_client)
    runs.start(run("good", 1, now))
    runs.start(run("good", 2, now + 1))
    redis_client.hset(run_key("good-1"), "started", "yesterday")
    collector = ClusterCollector(exporter_client(redis_server.url))
    registry = build_registry(collector)
    with caplog.at_level(logging.WARNING, logger="bloomcrawl.ops.exporter"):
        for _ in range(3):
            assert registry.get_sample_value("bloomcrawl_up") == 1
    get = registry.get_sample_value
    assert get("bloomcrawl_recurring_read_errors") == 2
    assert get("bloomcrawl_schedules") == 1
    assert get("bloomcrawl_schedule_paused", {"schedule": "good", "spider": "site"}) == 0
    assert get("bloomcrawl_run_start_timestamp_seconds",
               {"schedule": "good", "spider": "site", "ago": "0"}) == now + 1
    assert get("bloomcrawl_run_start_timestamp_seconds",
               {"schedule": "good", "spider": "site", "ago": "1"}) is None
    logged = sorted(r.getMessage() for r in caplog.records)
    assert len(logged) == 2, logged
    assert logged[0].startswith("run good-1: its hash cannot be read (ValueError"), logged
    assert logged[1].startswith("schedule bad: its hash cannot be read (JSONDecodeError"), logged


def test_redis_refusing_the_schedule_keys_is_redis_down_for_the_scrape(
        redis_server: RedisServer, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    """A user that may read every key but the schedules' (``{...``): the read of the
    schedules fails inside the exporter's Redis read, and the scrape answers."""
    ScheduleStore(redis_client).add(spec("hourly", every=3600))
    redis_client.execute_command("ACL", "SETUSER", "noschedules", "on", ">secret",
                                 "~[^{]*", "+@all")
    try:
        host, port = redis_server.url.split("//")[1].split("/")[0].split(":")
        registry = collector_registry("redis://noschedules:secret@%s:%s/0" % (host, port))
        with caplog.at_level(logging.WARNING, logger="bloomcrawl.ops.exporter"):
            names = {f.name for f in registry.collect()}
        assert registry.get_sample_value("bloomcrawl_up") == 0
        assert "bloomcrawl_exporter_build_info" in names
        assert not {n for n in names if n.startswith(("bloomcrawl_schedule", "bloomcrawl_run"))}
        assert any("NOPERM" in r.getMessage() or "permission" in r.getMessage().lower()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        # the same user sees the schedules once it may read them
        redis_client.execute_command("ACL", "SETUSER", "noschedules", "~*")
        assert registry.get_sample_value("bloomcrawl_up") == 1
        assert registry.get_sample_value(
            "bloomcrawl_schedule_interval_seconds", {"schedule": "hourly", "spider": "site"}
        ) == 3600
    finally:
        redis_client.execute_command("ACL", "DELUSER", "noschedules")


def test_the_metric_names_follow_the_naming_rules(
        redis_server: RedisServer, redis_client: redis.Redis) -> None:
    store = ScheduleStore(redis_client)
    fired(store, "hourly", 3600)
    runs = RunStore(redis_client)
    done = run("hourly", 1, time.time())
    done.status, done.finished, done.reasons = FINISHED, done.started + 5, {"a": "finished"}
    runs.start(done)
    families = schedule_metrics.families(schedule_metrics.read(
        redis_client, redis_time(redis_client)))
    assert len(families) == len({f.name for f in families})
    for family in families:
        assert family.name.startswith(("bloomcrawl_schedule", "bloomcrawl_run_",
                                       "bloomcrawl_recurring_")), family.name
        assert family.samples or family.name == "bloomcrawl_run_end_timestamp_seconds", \
            family.name
        assert (family.type == "counter") == all(
            sample.name.endswith("_total") for sample in family.samples), family.name
        assert "timestamp" not in family.name or family.name.endswith("_timestamp_seconds")
        for sample in family.samples:
            assert set(sample.labels) <= {"schedule", "spider", "result", "ago", "reason"}
            assert sample.labels.get("ago", "0") in {"0", "1", "2", "3", "4"}


def test_on_redis_cluster_the_schedules_and_runs_are_read_from_their_slots(
        clean_cluster: RedisClusterProcesses) -> None:
    client = clean_cluster.cluster_client()
    store = ScheduleStore(client)
    made = fired(store, "hourly", 3600, "skipped")
    RunStore(client).start(run("hourly", 1, made.created))
    registry = collector_registry(clean_cluster.startup_url)
    labels = {"schedule": "hourly", "spider": "site"}
    assert registry.get_sample_value("bloomcrawl_up") == 1
    assert outcome_of(registry, "hourly")["skipped"] == 1
    assert registry.get_sample_value("bloomcrawl_schedule_next_fire_timestamp_seconds",
                                     labels) == made.created + 3600
    assert registry.get_sample_value("bloomcrawl_run_start_timestamp_seconds",
                                     {**labels, "ago": "0"}) == made.created
