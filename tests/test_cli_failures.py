"""Every ``bloomcrawl`` command, run as a user runs it, meeting no cluster, an
unreachable Redis or an unreachable scrapyd node: one line naming what it could
not reach, a non-zero exit, never a traceback.

The commands run as the console script runs them, ``bloomcrawl.ops.cli.main``
with the arguments, in-process (:func:`kit.cli.run_cli`: a traceback that
escaped would show on stderr, as from a process); the command as a process
of its own (``python -m bloomcrawl.ops.cli``) and ``make status`` are run
too. Real servers only: a closed 127.0.0.1 port for what is unreachable, an
empty state directory for no cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bloomcrawl.ops.cluster.processes import ProcessRecord, free_port

from kit import ROOT
from kit.cli import CliRun, run_cli, run_cli_process
from kit.redis import RedisServer
from kit.scrapyd import PASSWORD, USERNAME, ScrapydNode
from kit.wait import wait_until

REFUSED = "[Errno 111] Connection refused"
NO_CLUSTER = ("no cluster is running (none recorded in {state}): start one with `make up` or"
              " `make demo`")
NO_REDIS = ", or pass --redis-url URL (REDIS_URL)"
NO_NODES = ", or pass --nodes URL,... (SCRAPYD_NODES)"


@pytest.fixture
def env(cli_env: dict[str, str]) -> dict[str, str]:
    """No cluster: an empty state directory, no .env, nothing in the environment."""
    return cli_env


# --- no cluster at all ------------------------------------------------------------------

NO_CLUSTER_LINES = {
    ("status",): NO_CLUSTER + NO_REDIS,
    ("nodes",): NO_CLUSTER + NO_NODES,
    ("deploy",): NO_CLUSTER + NO_NODES,
    ("schedule",): NO_CLUSTER + NO_NODES,
    ("seed", "http://a.invalid/"): NO_CLUSTER + NO_REDIS,
    ("crawl", "http://a.invalid/"): NO_CLUSTER + NO_REDIS,
    ("clear", "--yes"): NO_CLUSTER + NO_REDIS,
    ("cancel",): NO_CLUSTER + NO_NODES,
    ("filter-info",): NO_CLUSTER + NO_REDIS,
    ("logs",): ("no cluster is running (none recorded in {state}): no logs to show; start one"
                " with `make up` or `make demo`"),
    ("scale", "2"): ("no cluster is running (none recorded in {state}): start one with"
                     " `make up WORKERS=2`"),
}


@pytest.mark.parametrize("args", list(NO_CLUSTER_LINES), ids=" ".join)
def test_no_cluster(env: dict[str, str], args: tuple[str, ...]) -> None:
    line = NO_CLUSTER_LINES[args].format(state=env["BLOOMCRAWL_STATE_DIR"])
    run_cli(*args, env=env).assert_failed_with(f"bloomcrawl {args[0]}: {line}")
    assert not Path(env["BLOOMCRAWL_STATE_DIR"]).exists(), "a failed command left state behind"


@pytest.mark.parametrize("args", [("status",), ("nodes",)], ids=" ".join)
def test_the_command_as_a_process_fails_the_same_way(env: dict[str, str],
                                                     args: tuple[str, ...]) -> None:
    """``python -m bloomcrawl.ops.cli``: the exit status and the line of the in-process run."""
    line = NO_CLUSTER_LINES[args].format(state=env["BLOOMCRAWL_STATE_DIR"])
    run_cli_process(*args, env=env).assert_failed_with(f"bloomcrawl {args[0]}: {line}")


def test_down_without_a_cluster_has_nothing_to_do(env: dict[str, str]) -> None:
    run = run_cli("down", env=env)
    assert run.code == 0, run
    assert run.stdout.splitlines() == [
        "no cluster is running (none recorded in %s): nothing to stop"
        % env["BLOOMCRAWL_STATE_DIR"]]
    assert not Path(env["BLOOMCRAWL_STATE_DIR"]).exists()


def test_make_status_without_a_cluster_says_how_to_start_one(env: dict[str, str]) -> None:
    # -o: the venv counts as up to date (a test never reinstalls the project)
    done = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "status"],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 2, done  # make's own code for a recipe that failed
    run = CliRun(("status",), 1, done.stdout, done.stderr)
    line = NO_CLUSTER.format(state=env["BLOOMCRAWL_STATE_DIR"]) + NO_REDIS
    run.assert_failed_with(f"bloomcrawl status: {line}")


# --- an unreachable Redis, given or recorded ---------------------------------------------------


def redis_unreachable(port: int) -> str:
    return (f"cannot reach Redis at redis://127.0.0.1:{port}/0: Error 111 connecting to"
            f" 127.0.0.1:{port}. Connection refused.")


@pytest.mark.parametrize("args", [
    ("status",), ("seed", "http://a.invalid/"), ("clear", "--yes"), ("filter-info",),
], ids=" ".join)
def test_redis_given_but_unreachable(env: dict[str, str], args: tuple[str, ...]) -> None:
    port = free_port()
    # a password in the URL never shows in the line
    run = run_cli(*args, "--redis-url", f"redis://:s3cret@127.0.0.1:{port}/0", env=env)
    run.assert_failed_with(f"bloomcrawl {args[0]}: {redis_unreachable(port)}")
    assert "s3cret" not in run.stdout + run.stderr


def test_crawl_checks_redis_before_starting_any_job(env: dict[str, str],
                                                    redis_server: RedisServer) -> None:
    port = free_port()
    env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    # the node is unreachable too: had crawl scheduled first, it would name the node
    run = run_cli("crawl", "--nodes", f"http://127.0.0.1:{free_port()}", "http://a.invalid/",
                  env=env)
    run.assert_failed_with(f"bloomcrawl crawl: {redis_unreachable(port)}")


# --- an unreachable scrapyd node ----------------------------------------------------------------


def node_unreachable(url: str) -> str:
    return f"cannot reach the scrapyd node {url}: {REFUSED}"


def test_nodes_names_the_node_that_does_not_answer(env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = run_cli("nodes", "--nodes", url, env=env)
    run.assert_failed_with(f"bloomcrawl nodes: {node_unreachable(url)}")
    assert run.stdout == url + "\n"  # still the list, for scripts


def test_deploy_to_an_unreachable_node(env: dict[str, str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    egg = tmp_path / "project.egg"
    egg.write_bytes(b"not built: the node is never reached")
    run = run_cli("deploy", "--nodes", url, "--egg", str(egg), "--version", "7", env=env)
    output = run.stdout + run.stderr
    assert run.code == 1 and "Traceback" not in output, output
    assert run.stdout.splitlines() == [f"FAIL {node_unreachable(url)}",
                                       "deployed bloomcrawl 7 to 0 of 1 node(s)"]


def test_schedule_on_an_unreachable_node(env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = run_cli("schedule", "--nodes", url, env=env)
    run.assert_failed_with("bloomcrawl schedule: scheduling site failed on 1 of 1 node(s): "
                           + node_unreachable(url))


def test_crawl_on_an_unreachable_node(env: dict[str, str], redis_server: RedisServer) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = run_cli("crawl", "--nodes", url, "--redis-url", redis_server.url, "http://a.invalid/",
                  env=env)
    run.assert_failed_with("bloomcrawl crawl: scheduling site failed on 1 of 1 node(s): "
                           + node_unreachable(url))


def test_status_names_the_node_and_still_reports_redis(env: dict[str, str],
                                                       redis_server: RedisServer) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    run = run_cli("status", "--nodes", url, "--redis-url", redis_server.url, env=env)
    run.assert_failed_with(f"bloomcrawl status: {node_unreachable(url)}")
    assert "nodes: 0 of 1 up" in run.stdout and "redis: " in run.stdout


# --- a recorded local cluster whose processes are gone ---------------------------------------


def record_dead_cluster(env: dict[str, str]) -> tuple[int, str, int]:
    """A local cluster's record whose Redis and node are gone: (redis port, node URL, pid)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that was ours once and is no process now
    redis_port, node_port = free_port(), free_port()
    state = Path(env["BLOOMCRAWL_STATE_DIR"])
    state.mkdir(parents=True)
    records = [ProcessRecord("redis", dead.pid, 1, os.devnull, redis_port).__dict__,
               ProcessRecord("scrapyd-1", dead.pid, 1, os.devnull, node_port).__dict__]
    (state / "cluster.json").write_text(json.dumps({
        "mode": "local", "project_name": "bloomcrawl", "processes": records,
        "ports": {"redis": redis_port, "exporter": free_port()}}))
    return redis_port, f"http://127.0.0.1:{node_port}", dead.pid


def test_a_recorded_cluster_that_is_gone(env: dict[str, str]) -> None:
    redis_port, url, pid = record_dead_cluster(env)
    gone = (f"{redis_unreachable(redis_port)} (the local cluster's redis-server, pid {pid},"
            " is not running: `make down KEEP_DATA=1`, then `make up`)")
    for args in (("status",), ("seed", "http://a.invalid/"), ("clear", "--yes"),
                 ("filter-info",), ("crawl", "http://a.invalid/")):
        run_cli(*args, env=env).assert_failed_with(f"bloomcrawl {args[0]}: {gone}")
    run = run_cli("status", env=env)
    run.assert_failed_with(f"bloomcrawl status: {node_unreachable(url)}")
    run_cli("nodes", env=env).assert_failed_with(f"bloomcrawl nodes: {node_unreachable(url)}")
    run_cli("schedule", env=env).assert_failed_with(
        f"bloomcrawl schedule: scheduling site failed on 1 of 1 node(s): {node_unreachable(url)}")
    run_cli("scale", "2", env=env).assert_failed_with(
        "bloomcrawl scale: recorded processes are gone (redis, scrapyd-1): `make down"
        " KEEP_DATA=1`, then `make up` (plain `make down` deletes the data)")
    # down stops nothing it did not start, forgets the record and says so
    run = run_cli("down", env=env)
    assert run.code == 0 and "local cluster down" in run.stdout, run
    run_cli("status", env=env).assert_failed_with(
        "bloomcrawl status: " + NO_CLUSTER.format(state=env["BLOOMCRAWL_STATE_DIR"]) + NO_REDIS)


def test_an_unreadable_cluster_record(env: dict[str, str]) -> None:
    record = Path(env["BLOOMCRAWL_STATE_DIR"]) / "cluster.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"mode": ')
    line = (f"{record} is unreadable (JSONDecodeError: Expecting value: line 1 column 10"
            " (char 9)): stop what it started by hand, then delete it")
    for args in (("status",), ("down",), ("nodes",), ("up",)):
        run_cli(*args, env=env).assert_failed_with(f"bloomcrawl {args[0]}: {line}")


def test_throttle_of_a_spider_with_no_crawl_names_the_spiders_that_have_one(
        redis_server, redis_client, env: dict[str, str]) -> None:
    """``throttle`` without ``--spider`` asks for ``site``: the refusal names the spiders
    this Redis has crawls of, and writes nothing."""
    for spider in ("products", "listings"):
        redis_client.hset(f"{spider}:bloomfilter:meta", "params", "{}")
    run_cli("throttle", "shop.test", "--delay", "1", "--redis-url", redis_server.url,
            env=env).assert_failed_with(
        "bloomcrawl throttle: no crawl of site in this Redis yet (no site:bloomfilter:meta):"
        " start the crawl first; its filter decides which partition keeps each host; this"
        " Redis has crawls of listings, products: give --spider NAME")
    assert sorted(redis_client.keys()) == [b"listings:bloomfilter:meta",
                                           b"products:bloomfilter:meta"]


def test_logs_of_a_local_cluster_by_service(env: dict[str, str], tmp_path: Path) -> None:
    """``make logs SERVICE=worker``: the scrapyd nodes, as compose calls its workers; a name
    the cluster has no service of is an error naming those it has."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    records = []
    for name in ("redis", "scrapyd-1", "scrapyd-2", "exporter", "timer"):
        log = tmp_path / f"{name}.log"
        log.write_text(f"a line of {name}\n")
        records.append(ProcessRecord(name, dead.pid, 1, str(log), free_port()).__dict__)
    state = Path(env["BLOOMCRAWL_STATE_DIR"])
    state.mkdir(parents=True)
    (state / "cluster.json").write_text(json.dumps({
        "mode": "local", "project_name": "bloomcrawl", "processes": records,
        "ports": {"redis": records[0]["port"]}}))
    for service in ("worker", "scrapyd"):
        run = run_cli("logs", service, env=env)
        assert run.code == 0, run.output
        assert run.stdout.splitlines() == [
            f"==> {tmp_path / 'scrapyd-1.log'} <==", "a line of scrapyd-1",
            f"==> {tmp_path / 'scrapyd-2.log'} <==", "a line of scrapyd-2"], run.stdout
    run = run_cli("logs", "scrapyd-2", env=env)
    assert run.code == 0 and run.stdout.splitlines()[1:] == ["a line of scrapyd-2"], run.output
    run_cli("logs", "nosuch", env=env).assert_failed_with(
        "bloomcrawl logs: no service 'nosuch' in the local cluster; its services: worker (the"
        " scrapyd nodes: scrapyd-1, scrapyd-2), exporter, redis, timer")


# --- nodes that refuse a job ----------------------------------------------------------------


def test_a_crawl_refused_by_one_node_cancels_the_jobs_the_others_started(
        env: dict[str, str], redis_server: RedisServer,
        scrapyd_nodes: Callable[..., ScrapydNode]) -> None:
    """One node has the project, the other not: the crawl fails, and no job of it is left
    running on the first node unmentioned."""
    having = scrapyd_nodes("having", probe=True)
    lacking = scrapyd_nodes("lacking")
    env.update(SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD)
    run = run_cli("crawl", "--nodes", f"{having.url},{lacking.url}", "--redis-url",
                  redis_server.url, "--project", "probe", "--spider", "waiter", "--max-idle",
                  "1", "-a", "seconds=60", env=env)
    listed = having.node.list_jobs("probe")
    ids = {j["id"] for state in ("pending", "running", "finished") for j in listed[state]}
    assert len(ids) == 1, listed
    [job] = ids
    run.assert_failed_with(
        f"bloomcrawl crawl: scheduling waiter failed on 1 of 2 node(s): {lacking.url}"
        "/schedule.json: project 'probe' not found; cancelled the job(s) started on the other"
        f" node(s): {having.url} {job}")
    wait_until(lambda: not any(having.node.list_jobs("probe")[state]
                               for state in ("pending", "running")), 60,
               what="the cancelled job's end")


def test_cancel_of_a_spider_no_project_has_says_so(
        env: dict[str, str], scrapyd_nodes: Callable[..., ScrapydNode]) -> None:
    node = scrapyd_nodes("scrapyd", probe=True)
    env.update(SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD)
    run = run_cli("cancel", "--nodes", node.url, "--spider", "nosuch", env=env)
    assert run.code == 0, run.output
    assert run.stdout.splitlines() == ["cancelled 0 job(s) of nosuch on 1 of 1 node(s)"]
    assert run.stderr.splitlines() == [
        "no deployed project has a spider nosuch (deployed: probe): pass"
        " --spider, or --project NAME"], run.stderr
    run = run_cli("cancel", "--nodes", node.url, "--spider", "waiter", env=env)
    assert run.code == 0 and run.stderr == "", run.output  # a spider with no job running
