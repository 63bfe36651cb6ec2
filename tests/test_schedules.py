"""Recurring crawls: schedules in a real Redis, fired by real timer processes into a real
scrapyd, each firing a run with its own counters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
import redis
from faults.proxy import FaultProxy

from bloomcrawl.core.connection import redis_from_url
from bloomcrawl.core.errors import BloomcrawlError
from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.cli.target import Target
from bloomcrawl.ops.cluster.processes import free_port
from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.demo_site import RunningSite
from bloomcrawl.ops.runs import FINISHED, Run, RunStore, check_run
from bloomcrawl.ops.schedules import (
    CLAIM,
    ScheduleStore,
    Spec,
    parse_duration,
    redis_time,
    spec_from_options,
)
from bloomcrawl.ops.timer import Timer

from kit import ROOT
from kit.cli import run_cli
from kit.redis import RedisServer
from kit.scrapyd import PASSWORD, USERNAME, ScrapydNode
from kit.wait import wait_until


def spec(name: str = "news", **when: object) -> Spec:
    return Spec(name, "sleeper", "probe", arguments=["seconds=0"], **when).check()  # type: ignore[arg-type]


def test_every_slots_start_when_made_and_a_slot_is_claimed_once(
        redis_client: redis.Redis) -> None:
    store = ScheduleStore(redis_client)
    made = store.add(spec(every=10))
    c = made.created
    assert made.due_slot(c - 1) is None
    assert made.due_slot(c) == c
    assert made.due_slot(c + 35) == c + 30
    assert made.next_slot(c + 35) == c + 40
    assert store.claim("news", c, "timer-1")
    assert not store.claim("news", c, "timer-2")
    # down for three slots: the latest is due, and an older one never fires after it
    assert store.claim("news", c + 30, "timer-2")
    assert not store.claim("news", c + 20, "timer-1")
    store.set_paused("news", True)
    assert not store.claim("news", c + 40, "timer-1")
    store.set_paused("news", False)
    assert store.claim("news", c + 40, "timer-1")
    got = store.get("news")
    assert (got.last_slot, got.claimed_by) == (c + 40, "timer-1")
    store.remove("news")
    assert not store.claim("news", c + 50, "timer-1")
    assert store.all() == []


def test_cron_slots_are_cron_times_after_the_schedule_was_made(
        redis_client: redis.Redis) -> None:
    made = ScheduleStore(redis_client).add(spec(cron="*/15 * * * *"))
    c = made.created
    first = made.next_slot(c)
    assert first % 900 == 0 and c < first <= c + 900
    assert made.due_slot(first - 1) is None  # the quarter before it was made: never due
    assert made.due_slot(first + 901) == first + 900


@pytest.mark.parametrize(("argv", "message"), [
    (["--every", "soon"], "--every: not a duration: 'soon'"),
    (["--every", "0.5"], "--every must be at least 1 s, got 0.5"),
    (["--cron", "61 * * * *"], "not a cron expression: '61 * * * *'"),
    (["--every", "6h", "--name", "a{b}"], "schedule name 'a{b}': use 1-64 letters"),
    (["--every", "6h", "-s", "NOVALUE"], "setting 'NOVALUE': expected NAME=VALUE"),
    (["--every", "6h", "ftp://x/"], "not an http(s) URL: 'ftp://x/'"),
])
def test_a_bad_schedule_is_refused_naming_what_is_wrong(
        argv: list[str], message: str, redis_server: RedisServer,
        cli_env: dict[str, str]) -> None:
    name = [] if "--name" in argv else ["--name", "news"]
    run = run_cli("schedule", "--redis-url", redis_server.url, *name, *argv, env=cli_env)
    assert run.code == 1, run.output
    assert message in run.stderr, run.output
    assert ScheduleStore(redis_server.client()).all() == []


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "15m", "6h", "7d", "2w", "1.5h")] == [
        90, 90, 900, 21600, 604800, 1209600, 5400]
    with pytest.raises(OpsError, match="give one of --every and --cron"):
        spec_from_options("x", spider="s", project="p", every=None, cron=None, settings=[],
                          arguments=[], urls=[], allowed_domains=None, depth_limit=None,
                          max_idle=None)


# --- timers against a real scrapyd -------------------------------------------------------------


@pytest.fixture
def probe_node(scrapyd_nodes: Callable[..., ScrapydNode]) -> ScrapydNode:
    return scrapyd_nodes("scrapyd", probe=True, max_proc=4)


def jobs_of(node: ScrapydNode) -> list[str]:
    answer = node.node.list_jobs("probe")
    return [job["id"] for state in scrapyd.JOB_STATES for job in answer[state]]


@pytest.fixture
def timers(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``start(redis_url, nodes)``: a ``bloomcrawl timer`` process; all stopped by pid."""
    started: list[subprocess.Popen[bytes]] = []
    logs: list[IO[bytes]] = []
    env = dict(os.environ, SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD,
               BLOOMCRAWL_STATE_DIR=str(tmp_path / "state"),
               BLOOMCRAWL_ENV_FILE=str(tmp_path / "no.env"), BLOOMCRAWL_ROOT=str(ROOT))

    def start(redis_url: str, nodes: str) -> subprocess.Popen[bytes]:
        log = open(tmp_path / ("timer-%d.log" % len(started)), "wb")
        logs.append(log)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bloomcrawl.ops.cli", "timer", "--redis-url", redis_url,
             "--nodes", nodes, "--interval", "0.05"], cwd=ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    for log in logs:
        log.close()


def test_two_timers_fire_each_slot_once(redis_server: RedisServer, redis_client: redis.Redis,
                                        probe_node: ScrapydNode,
                                        timers: Callable[..., subprocess.Popen[bytes]]) -> None:
    store = ScheduleStore(redis_client)
    store.add(spec(every=1))
    procs = [timers(redis_server.url, probe_node.url) for _ in range(2)]
    wait_until(lambda: len(store.firings("news")) >= 5, 60, interval=0.1,
               what=lambda: "5 firings: %s" % store.firings("news"))
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    assert [proc.wait(10) for proc in procs] == [0, 0]
    firings = store.firings("news")
    slots = [f["slot"] for f in firings]
    assert len(slots) == len(set(slots)), firings  # no slot fired twice
    assert {f["result"] for f in firings} <= {"started", "skipped"}, firings
    started = [f for f in firings if f["result"] == "started"]
    assert started, firings
    # one job per started firing (a skipped one names the run still going), none more
    assert sorted(jobs_of(probe_node)) == sorted(
        job for f in started for job in f["started"].values())
    assert all("still running" in f["reason"] for f in firings if f["result"] == "skipped")
    assert store.get("news").fired == len(firings)


def test_schedules_outlive_a_timer_and_a_redis_restart(tmp_path: Path,
                                                       probe_node: ScrapydNode) -> None:
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        client = server.client()
        nodes = [scrapyd.Node(probe_node.url, USERNAME, PASSWORD)]

        def target() -> Target:
            return Target(server.url, nodes, None, None)

        store = ScheduleStore(client)
        store.add(spec("hourly", every=3600))
        store.add(spec("paused", every=3600))
        store.set_paused("paused", True)
        assert Timer(client, target).tick() == ["hourly"]
        server.restart()
        client = server.client()
        again = Timer(client, target)  # another timer process, after the restart
        assert again.tick() == []  # this slot was fired before the restart
        kept = {s.name: s for s in ScheduleStore(client).all()}
        assert set(kept) == {"hourly", "paused"}
        assert kept["paused"].paused and kept["paused"].last_slot is None
        assert kept["hourly"].fired == 1 and kept["hourly"].outcome is not None
        assert kept["hourly"].outcome["result"] == "started"
        assert len(jobs_of(probe_node)) == 1


def test_a_timer_down_for_several_slots_fires_once(redis_client: redis.Redis,
                                                   probe_node: ScrapydNode) -> None:
    store = ScheduleStore(redis_client)
    made = store.add(spec(every=1))
    nodes = [scrapyd.Node(probe_node.url, USERNAME, PASSWORD)]
    timer = Timer(redis_client, lambda: Target("", nodes, None, None))
    wait_until(lambda: made.due_slot(redis_time(redis_client)) >= made.created + 3, 10,
               interval=0.05, what="three slots to pass")
    assert timer.tick() == ["news"]
    timer.tick()  # fires again only if the next slot has come meanwhile
    firings = store.firings("news")
    slots = [f["slot"] for f in firings]
    # the slots missed while no timer ran never fire: the latest one fired, once
    assert min(slots) >= made.created + 3, firings
    assert len(slots) == len(set(slots)), firings
    assert firings[-1]["result"] == "started", firings


def test_a_run_ends_with_its_counters_and_reason(redis_server: RedisServer,
                                                 redis_client: redis.Redis,
                                                 probe_node: ScrapydNode) -> None:
    store = ScheduleStore(redis_client)
    store.add(spec(every=3600))
    nodes = [scrapyd.Node(probe_node.url, USERNAME, PASSWORD)]
    assert Timer(redis_client, lambda: Target("", nodes, None, None)).tick() == ["news"]
    runs = RunStore(redis_client)
    [run] = runs.recent()
    assert run.schedule == "news" and list(run.jobs) == [probe_node.url]
    # the spider's shared stats grow while it runs: the run counts only that growth
    redis_client.hset("sleeper:stats", mapping={"pages": 7, "items": 3, "queued": 9,
                                                "revisited": 2})
    wait_until(lambda: check_run(redis_client, runs, run, nodes), 60, interval=0.2,
               what="the run's job to end")
    done = runs.get(run.id)
    assert done is not None and done.status == FINISHED
    # of the requests the filter queued, those queued again after their window
    assert done.counters == {"pages": 7, "new": 7, "revisited": 2, "items": 3, "errors": 0,
                             "filtered": 0, "requeued": 0}
    assert done.finish_reason == "finished"
    assert done.duration is not None and done.duration > 0
    listed = run_cli("runs", "--redis-url", redis_server.url)
    assert listed.code == 0, listed.output
    assert run.id in listed.stdout and "pages 7" in listed.stdout


def test_schedules_command_lists_pauses_resumes_and_removes(
        redis_server: RedisServer, redis_client: redis.Redis, cli_env: dict[str, str]) -> None:
    url = redis_server.url
    made = run_cli("schedule", "--redis-url", url, "--name", "news", "--every", "6h",
                   "--spider", "site", "https://news.example/", env=cli_env)
    assert made.code == 0, made.output
    assert "schedule news: site on every node, every 6h; next fire" in made.stdout
    again = run_cli("schedule", "--redis-url", url, "--name", "news", "--every", "6h",
                    env=cli_env)
    assert again.code == 1 and "a schedule named news exists" in again.stderr
    for action in ("pause", "resume"):
        assert run_cli("schedules", "--redis-url", url, action, "news", env=cli_env).code == 0
        listed = run_cli("schedules", "--redis-url", url, env=cli_env)
        assert ("paused" in listed.stdout) == (action == "pause"), listed.stdout
        # its first slot (when it was made) is due and no timer claimed it: said so
        assert ("(due now: a timer fires it)" in listed.stdout) == (action == "resume")
    assert "news: site bloomcrawl, every 6h; last never" in listed.stdout
    assert run_cli("schedules", "--redis-url", url, "remove", "news", env=cli_env).code == 0
    gone = run_cli("schedules", "--redis-url", url, "pause", "news", env=cli_env)
    assert gone.code == 1 and "no schedule named news" in gone.stderr
    assert redis_client.keys("{bloomcrawl:schedules}*") == []


# --- a real crawl, fired twice --------------------------------------------------------------


@pytest.mark.parametrize("demo_site", [{"pages": 40}], indirect=True)
def test_each_firing_is_a_run_of_its_own(redis_server: RedisServer, redis_client: redis.Redis,
                                         scrapyd_nodes: Callable[..., ScrapydNode],
                                         demo_site: RunningSite, tmp_path: Path) -> None:
    """The bundled project deployed to a real scrapyd; its schedule fired by a timer, then
    run by hand: each run crawls under its own id with its own counters."""
    node = scrapyd_nodes("scrapyd", redis_url=redis_server.url)
    env = dict(os.environ, SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD,
               BLOOMCRAWL_STATE_DIR=str(tmp_path / "state"),
               BLOOMCRAWL_ENV_FILE=str(tmp_path / "no.env"), BLOOMCRAWL_ROOT=str(ROOT))
    deployed = run_cli("deploy", "--nodes", node.url, env=env)
    assert deployed.code == 0, deployed.output
    made = run_cli("schedule", "--redis-url", redis_server.url, "--nodes", node.url,
                   "--name", "demo", "--every", "1h", "--max-idle", "1",
                   "-s", "REMOTE_CONTROL_ENABLED=False", "-s", "TELNETCONSOLE_ENABLED=False",
                   "-s", "BLOOMFILTER_ERROR_RATE=1e-6", demo_site.url, env=env)
    assert made.code == 0, made.output
    nodes = [scrapyd.Node(node.url, USERNAME, PASSWORD)]
    assert Timer(redis_client, lambda: Target(redis_server.url, nodes, None, None)).tick() == [
        "demo"]
    runs = RunStore(redis_client)

    def finished(run_id: str) -> bool:
        run = runs.get(run_id)
        assert run is not None
        return check_run(redis_client, runs, run, nodes)

    [first] = runs.recent()
    wait_until(lambda: finished(first.id), 120, interval=0.5, what="the first run to end")
    # every page once; the start URL also as a link to "/" (a dont_filter start request is
    # fetched under its run's id, not as the page's own fingerprint: as Scrapy does)
    assert demo_site.hits() == [2] + [1] * 39
    again = run_cli("schedules", "--redis-url", redis_server.url, "--nodes", node.url,
                    "run-now", "demo", env=env)
    assert again.code == 0, again.output
    second = runs.recent()[0]
    assert second.id != first.id and "-now-" in second.id
    wait_until(lambda: finished(second.id), 120, interval=0.5, what="the second run to end")
    done = {run.id: run for run in runs.recent()}
    one, two = done[first.id], done[second.id]
    assert (one.finish_reason, two.finish_reason) == ("finished", "finished")
    assert (one.counters["pages"], one.counters["items"]) == (41, 41)
    # the second run fetches its start URL again (its own crawl id); every link is seen
    assert (two.counters["pages"], two.counters["items"]) == (1, 1)
    assert two.counters["filtered"] >= 1
    assert demo_site.hits() == [3] + [1] * 39
    listed = run_cli("runs", "--redis-url", redis_server.url, env=env)
    assert listed.code == 0, listed.output
    lines = listed.stdout.splitlines()
    assert lines[0].startswith(second.id) and lines[1].startswith(first.id), listed.stdout
    assert "pages 41, new 41, revisited 0, items 41" in lines[1], listed.stdout
    assert "finished" in lines[1], listed.stdout


def test_a_run_whose_node_stops_answering_ends_after_the_give_up_time(
        redis_client: redis.Redis) -> None:
    """A job on a node that does not answer (nothing listens on its port) is waited for,
    then the run ends with the reason ``unreachable``, not ``running`` for good."""
    runs = RunStore(redis_client)
    gone = scrapyd.Node("http://127.0.0.1:%d" % free_port(), USERNAME, PASSWORD)
    run = Run(id="news-gone", schedule="news", spider="sleeper", project="demo",
              slot=0.0, started=redis_time(redis_client), jobs={gone.url: "job-1"})
    runs.start(run)
    assert not check_run(redis_client, runs, run, [gone], give_up_s=1.0)
    saved = runs.get(run.id)
    assert saved is not None and saved.status != FINISHED and "job-1" in saved.unreachable
    wait_until(lambda: check_run(redis_client, runs, saved, [gone], give_up_s=1.0), 10,
               interval=0.2, what="the give-up time")
    done = runs.get(run.id)
    assert done is not None and done.status == FINISHED
    assert done.finish_reason == "unreachable"


def test_a_spider_the_project_lacks_is_refused_and_a_refused_firing_says_why(
        redis_server: RedisServer, redis_client: redis.Redis, probe_node: ScrapydNode,
        cli_env: dict[str, str]) -> None:
    """``schedule --project P --spider S`` asks the nodes whether P has S, as it does
    without ``--project``; a firing every node refused lists what each said."""
    env = dict(cli_env, SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD)
    for project in (["--project", "probe"], []):
        run = run_cli("schedule", "--redis-url", redis_server.url, "--nodes", probe_node.url,
                      "--name", "typo", "--every", "10m", *project, "--spider", "nosuch",
                      env=env)
        run.assert_failed_with("bloomcrawl schedule: no deployed project has a spider nosuch"
                               " (deployed: probe): pass --spider, or --project NAME")
    assert ScheduleStore(redis_client).all() == []

    # made before the spider went away (or by hand): its firing fails on every node
    store = ScheduleStore(redis_client)
    store.add(Spec("typo", "nosuch", "probe", every=3600).check())
    nodes = [scrapyd.Node(probe_node.url, USERNAME, PASSWORD)]
    assert Timer(redis_client, lambda: Target("", nodes, None, None)).tick() == ["typo"]
    listed = run_cli("schedules", "--redis-url", redis_server.url, env=env)
    assert listed.code == 0, listed.output
    assert (f"failed (no node started a job; refused by {probe_node.url}: {probe_node.url}"
            "/schedule.json: spider 'nosuch' not found)") in listed.stdout, listed.stdout


def test_a_claim_whose_reply_is_lost_fires_its_slot_once(
        redis_server: RedisServer, redis_client: redis.Redis, probe_node: ScrapydNode) -> None:
    """Redis applied the timer's claim of a slot, and the reply never came back (a
    connection closed under it): the timer asks again and fires the slot, once, instead of
    taking its own claim for another timer's and leaving the slot unfired."""
    store = ScheduleStore(redis_client)
    store.add(spec("hourly", every=3600))
    nodes = [scrapyd.Node(probe_node.url, USERNAME, PASSWORD)]
    redis_client.script_load(CLAIM.source)  # loaded, as after a timer's first claim
    with FaultProxy(redis_server.port) as proxy:
        client = redis_from_url("redis://127.0.0.1:%d/0" % proxy.port)
        timer = Timer(client, lambda: Target("", nodes, None, None))
        proxy.drop_replies(CLAIM.sha.encode(), count=1)
        try:
            fired = timer.tick()
        except (redis.RedisError, BloomcrawlError):
            fired = []  # run_forever logs it and ticks again
        assert proxy.drops_pending == 0, "the claim's reply was not dropped: no fault"
        fired += timer.tick()
        assert fired == ["hourly"]
        assert timer.tick() == []  # fired: its claim wins no more
        client.close()
    assert store.get("hourly").fired == 1
    assert len(jobs_of(probe_node)) == 1


def test_a_firing_that_fails_after_its_claim_is_not_repeated(
        redis_client: redis.Redis, probe_node: ScrapydNode) -> None:
    """At most once: the claim was heard, and the firing then failed before its outcome
    was recorded (here the nodes could not be read). The next tick leaves the slot alone:
    only a claim sent without an answer is sent again."""
    store = ScheduleStore(redis_client)
    store.add(spec("hourly", every=3600))
    nodes = [scrapyd.Node(probe_node.url, USERNAME, PASSWORD)]
    calls = []

    def target() -> Target:
        calls.append(1)
        if len(calls) == 1:
            raise redis.ConnectionError("the nodes could not be read")
        return Target("", nodes, None, None)

    timer = Timer(redis_client, target)
    with pytest.raises(redis.ConnectionError):
        timer.tick()
    assert store.get("hourly").last_slot is not None  # claimed
    assert timer.tick() == []
    assert store.get("hourly").fired == 0
    assert jobs_of(probe_node) == []
