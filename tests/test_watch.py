"""``bloomcrawl crawl --wait``: a job that never started its spider is a failure.

A real scrapyd node runs the probe project's ``sleeper``, whose constructor
raises on a bad argument: scrapyd lists that job as finished like any other,
and only its log says the spider never opened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis

from bloomcrawl.ops.cli import status
from bloomcrawl.ops.cli.target import Target
from bloomcrawl.ops.demo_site import RunningSite

from kit.cli import run_cli
from kit.redis import RedisServer
from kit.scrapyd import PASSWORD, USERNAME, ScrapydNode
from kit.wait import wait_until
from kit.workers import WorkerPool


def target_of(node: ScrapydNode, redis_server: RedisServer) -> Target:
    return Target(redis_server.url, [node.node], None, None)


def schedule(node: ScrapydNode, seconds: str) -> str:
    answer = node.post("schedule.json", project="probe", spider="sleeper", seconds=seconds)
    assert answer["status"] == "ok", answer
    return str(answer["jobid"])


def test_a_job_whose_spider_never_opened_fails_the_wait_naming_its_error(
        scrapyd_node: ScrapydNode, redis_server: RedisServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    job = schedule(scrapyd_node, "abc")  # float("abc") raises in the spider's constructor
    rc = status.watch(target_of(scrapyd_node, redis_server), "sleeper", "probe",
                      {scrapyd_node.url: job}, timeout=90)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"job {job} ended without its spider closing" in err, err
    assert "ValueError: could not convert string to float: 'abc'" in err, err
    assert f"/logs/probe/sleeper/{job}.log" in err, err


def test_a_job_that_closed_its_spider_passes_the_wait(
        scrapyd_node: ScrapydNode, redis_server: RedisServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    job = schedule(scrapyd_node, "0")
    rc = status.watch(target_of(scrapyd_node, redis_server), "sleeper", "probe",
                      {scrapyd_node.url: job}, timeout=90)
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "ended without" not in err, err


def test_a_cancelled_job_fails_the_wait_saying_it_was_stopped(
        scrapyd_node: ScrapydNode, redis_server: RedisServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A job cancelled while the wait watches it (scrapyd stops it: Scrapy closes the
    spider with reason "shutdown"): the crawl is not done, and the wait says so."""
    answer = scrapyd_node.post("schedule.json", project="probe", spider="waiter", seconds="60")
    job = str(answer["jobid"])

    def cancel_once_running() -> None:
        wait_until(lambda: any(j["id"] == job for j in
                               scrapyd_node.node.request("listjobs.json?project=probe")
                               ["running"]), 30, what="the job to run")
        log = scrapyd_node.workdir / "logs" / "probe" / "waiter" / ("%s.log" % job)
        # its spider open (cancelled before, the job would end as it ends when done), and
        # its engine running (a signal right as the spider opens stops Scrapy without
        # closing the spider): the spider logs its first idle
        wait_until(lambda: log.exists() and "waiter: open and idle" in log.read_text(), 30,
                   what="the job's spider to open and go idle")
        assert scrapyd_node.post("cancel.json", project="probe", job=job)["status"] == "ok"

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    try:
        rc = status.watch(target_of(scrapyd_node, redis_server), "waiter", "probe",
                          {scrapyd_node.url: job}, timeout=90)
    finally:
        canceller.join()
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"job {job} was stopped before its crawl ended (Spider closed (shutdown)" in err, err


def test_the_error_named_is_the_setting_bloomcrawl_refused(
        worker_pool: WorkerPool, redis_server: RedisServer) -> None:
    """A worker given a bad setting: its log ends with Scrapy's "Engine slot not
    assigned", but what to fix is bloomcrawl's SettingError further up."""
    worker = worker_pool.start("w0", redis_server.url, {"BLOOMFILTER_ERROR_RATE": "abc"})
    assert worker.wait(60) not in (None, 0)
    log = worker.text()
    assert "Engine slot not assigned" in log  # what a plain "last exception" would give
    assert status.job_error(log) == ("bloomcrawl.core.errors.SettingError:"
                                     " BLOOMFILTER_ERROR_RATE must be a number, got 'abc'")


def test_a_filter_that_does_not_match_fails_the_job_though_scrapy_logs_it_closed(
        worker_pool: WorkerPool, redis_server: RedisServer) -> None:
    """A worker asking for a revisit window the stored filter does not have: the opening
    fails, and Scrapy still logs "Spider closed (shutdown)"; the wait must see the failure,
    and the scheduler's close must not add an error of its own."""
    first = worker_pool.start("w0", redis_server.url)  # makes the filter, no window
    assert first.wait(60) == 0
    worker = worker_pool.start("w1", redis_server.url, {"BLOOMFILTER_REVISIT_AFTER": "3600"})
    assert worker.wait(60) not in (None, 0)
    log = worker.text()
    assert "Spider closed (shutdown)" in log  # what the "never closed" rule alone passes
    failure = status.job_failure(log)
    assert failure is not None and failure.startswith(
        "failed: bloomcrawl.core.errors.FilterMismatchError: "), failure
    assert "revisit_after: stored 0, asked for 3600" in failure
    assert "Scheduler close failure" not in log and "AttributeError" not in log
    assert status.job_failure(first.text()) is None


def test_take_back_removes_what_the_crawl_pushed_and_nothing_else(redis_client) -> None:
    """Each entry the crawl pushed, once; another crawl's copy of the same URL stays."""
    key = "sleeper:start_urls"
    redis_client.rpush(key, "https://a.test/", "https://b.test/", "https://a.test/",
                       '{"url": "https://c.test/"}')
    assert status.take_back(redis_client, key, ["https://a.test/",
                                                '{"url": "https://c.test/"}',
                                                "https://d.test/"]) == 2
    assert redis_client.lrange(key, 0, -1) == [b"https://b.test/", b"https://a.test/"]


def test_the_progress_line_says_when_redis_cannot_be_read(closed_port_url: str) -> None:
    line, state = status.frontier_line(redis.Redis.from_url(closed_port_url), "site")
    assert state is None
    assert line.startswith("Redis cannot be read (") and line.endswith(
        "); the workers wait for it"), line


def test_the_error_lines_of_a_job_log_are_what_the_wait_shows(
        worker_pool: WorkerPool, redis_server: RedisServer, closed_port_url: str) -> None:
    """A start URL where nothing listens: the worker's log says which download failed,
    and that line is what ``crawl --wait`` shows beside the error count."""
    dead = "http://127.0.0.1:%s/" % closed_port_url.rsplit(":", 1)[1].split("/")[0]
    redis_server.client().rpush("site:start_urls", dead)
    worker = worker_pool.start("w0", redis_server.url, {"RETRY_TIMES": "0"})
    assert worker.wait(60) == 0, worker.tail()
    lines = status.error_lines(worker.text())
    assert any(line.startswith("Error downloading <GET %s>" % dead) for line in lines), lines
    assert len(lines) == len(set(lines))


@pytest.mark.parametrize("demo_site", [{"pages": 5}], indirect=True)
def test_the_idle_hint_of_a_crawl_given_max_idle_says_when_its_jobs_close(
        redis_server: RedisServer, scrapyd_nodes: Callable[..., ScrapydNode],
        demo_site: RunningSite, cli_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``crawl --max-idle 4 --wait``: the jobs are still open a while after the frontier
    emptied, as they were told; the hint says when they close, not to give --max-idle."""
    monkeypatch.setattr(status, "IDLE_HINT_S", 1.0)  # not the 30 s an operator waits
    monkeypatch.setattr(status, "WATCH_INTERVAL", 0.2)
    node = scrapyd_nodes("scrapyd", redis_url=redis_server.url)
    env = dict(cli_env, SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD)
    run_cli("deploy", "--nodes", node.url, env=env).assert_ok()
    run = run_cli("crawl", "--nodes", node.url, "--redis-url", redis_server.url,
                  "--max-idle", "4", "-s", "TELNETCONSOLE_ENABLED=False", "--wait",
                  demo_site.url, env=env)
    assert run.code == 0, run.output
    assert ("the frontier has been empty for 1 s and the jobs still run: they close once it"
            " has been empty for 4 s (MAX_IDLE_TIME_BEFORE_CLOSE)") in run.stderr, run.output
    assert "give crawl --max-idle" not in run.stderr, run.output
