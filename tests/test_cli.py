"""The ``bloomcrawl`` command: .env secrets, key cleanup, process bookkeeping, and
the local-process cluster (no Docker) from ``up`` to ``down``, crawling the
demo site on the way, leaving no process behind."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from bloomcrawl.core import keys
from bloomcrawl.ops.cli import jobs
from bloomcrawl.ops.cluster import envfile, processes
from bloomcrawl.ops.cluster.processes import ProcessRecord, free_port, group_alive
from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.noproxy import OPENER
from bloomcrawl.ops.scrapyd import Node, ScrapydError

from kit import ROOT
from kit.cli import run_cli, run_cli_process
from kit.redis import RedisServer
from kit.wait import wait_until


def test_env_file_gets_random_secrets_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    first = envfile.ensure_env_file(path)
    for name in ("REDIS_PASSWORD", "SCRAPYD_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        assert len(first[name]) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert envfile.ensure_env_file(path) == first  # kept as it is once written
    other = envfile.ensure_env_file(tmp_path / "other.env")
    assert other["REDIS_PASSWORD"] != first["REDIS_PASSWORD"]


def test_env_file_keeps_what_the_user_set_and_adds_missing_secrets(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    path.write_text("# mine\nREDIS_PORT=7000\nSCRAPYD_PASSWORD='chosen'\n")
    values = envfile.ensure_env_file(path)
    assert values["REDIS_PORT"] == "7000"
    assert values["SCRAPYD_PASSWORD"] == "chosen"
    assert values["REDIS_PASSWORD"]
    assert path.read_text().startswith("# mine\n")


def test_example_env_file_has_no_secrets() -> None:
    values = envfile.read_env_file(ROOT / ".env.example")
    for name in ("REDIS_PASSWORD", "SCRAPYD_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        assert values.get(name, "") == "", name


def test_clear_removes_one_spiders_frontier_only(redis_client: redis.Redis) -> None:
    for spider in ("site", "other"):
        redis_client.set("%s:bloomfilter:meta" % spider, "{}")
        redis_client.hset("{%s:bloomfilter:0}:state" % spider, "items", 1)
        redis_client.set("{%s:bloomfilter:3}:s0:c0" % spider, "x")
        redis_client.zadd("%s:requests:{%s:bloomfilter:1}:queue" % (spider, spider), {"r": 1})
        redis_client.hset("%s:stats" % spider, "pages", 3)
        redis_client.rpush("%s:start_urls" % spider, "http://example.invalid/")
    assert jobs.clear_spider(redis_client, "site") == 6
    left = sorted(k.decode() for k in redis_client.scan_iter())
    assert left and all("other" in k for k in left), left


def test_seed_rejects_what_is_not_an_http_url(redis_client: redis.Redis) -> None:
    with pytest.raises(OpsError):
        jobs.seed(redis_client, "site", ["ftp://example.invalid/"])
    assert jobs.seed(redis_client, "site", ["http://a.invalid/", "https://b.invalid/x"]) == 2
    assert redis_client.lrange("site:start_urls", 0, -1) == [
        b"http://a.invalid/", b"https://b.invalid/x"]


def test_seed_takes_json_entries_with_an_http_url_and_checks_all_first(
        redis_client: redis.Redis) -> None:
    post = '{"url": "http://a.invalid/form", "method": "POST", "q": "shoes"}'
    assert jobs.seed(redis_client, "site", [post, "http://b.invalid/"]) == 2
    assert redis_client.lrange("site:start_urls", 0, -1) == [post.encode(), b"http://b.invalid/"]
    for bad, why in (('{"url": "ftp://a.invalid/"}', "not an http(s) URL"),
                     ('{"shop": "x"}', 'a JSON entry needs an http(s) "url"'),
                     ("{not json", "not a JSON object")):
        with pytest.raises(OpsError, match=re.escape(why)):
            jobs.seed(redis_client, "site", ["http://c.invalid/", bad])
    assert redis_client.llen("site:start_urls") == 2  # nothing of a refused batch pushed


def test_seed_pushes_to_the_list_the_spiders_workers_read(redis_client: redis.Redis) -> None:
    """A scrapy-redis spider's own redis_key, as its workers recorded it."""
    redis_client.hset(keys.FrontierKeys("shop").meta, "start_urls", "myshop:seeds")
    assert jobs.start_key(redis_client, "shop") == "myshop:seeds"
    assert jobs.seed(redis_client, "shop", ["http://a.invalid/"]) == 1
    assert redis_client.lrange("myshop:seeds", 0, -1) == [b"http://a.invalid/"]
    assert not redis_client.exists("shop:start_urls")
    assert jobs.start_key(redis_client, "other") == "other:start_urls"


def test_max_idle_reaches_a_scrapy_redis_spider_as_whole_seconds() -> None:
    """``--max-idle 10`` (a float on the command line) must not kill a RedisSpider's job:
    scrapy-redis reads MAX_IDLE_TIME_BEFORE_CLOSE with int()."""
    from scrapy.utils.test import get_crawler
    from scrapy_redis.spiders import RedisSpider

    class Shop(RedisSpider):
        name = "shop"

    settings = dict(jobs.CrawlOptions(spider="shop", max_idle=10.0).scrapy_settings())
    assert settings == {"MAX_IDLE_TIME_BEFORE_CLOSE": "10"}
    spider = Shop.from_crawler(get_crawler(Shop, settings_dict=settings))
    assert spider.max_idle_time == 10
    half = dict(jobs.CrawlOptions(spider="shop", max_idle=0.5).scrapy_settings())
    assert half == {"MAX_IDLE_TIME_BEFORE_CLOSE": "0.5"}  # bloomcrawl's own spiders take it


def test_crawl_takes_a_project_by_the_directory_deploy_took(tmp_path: Path) -> None:
    from bloomcrawl.ops.cli.parser import build_parser

    parser = build_parser()
    project = ROOT / "tests" / "userproject"  # scrapy.cfg: [deploy] project = shopcrawl
    assert parser.parse_args(["crawl", "--project", str(project)]).project == "shopcrawl"
    assert parser.parse_args(["crawl", "--project", "shop"]).project == "shop"
    with pytest.raises(SystemExit):  # a directory, but no project's
        parser.parse_args(["crawl", "--project", str(tmp_path)])


def test_a_command_whose_reader_went_away_ends_without_a_traceback(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """``bloomcrawl status | head``: the pipe closes before the command's last line."""
    env = {**os.environ, "BLOOMCRAWL_STATE_DIR": str(tmp_path / "state"),
           "BLOOMCRAWL_ENV_FILE": str(tmp_path / ".env")}
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    proc = subprocess.Popen([sys.executable, "-m", "bloomcrawl.ops.cli", "status",
                             "--redis-url", redis_server.url, "--nodes",
                             f"http://127.0.0.1:{free_port()}"],
                            stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    os.close(write)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_max_idle_is_whole_seconds_on_the_command_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bloomcrawl.ops.cli.parser import build_parser

    parser = build_parser()
    assert parser.parse_args(["crawl", "--max-idle", "10", "http://a.invalid/"]).max_idle == 10
    for bad in ("2.5", "-1", "ten"):
        with pytest.raises(SystemExit):
            parser.parse_args(["crawl", "--max-idle", bad, "http://a.invalid/"])
        assert "give whole seconds, 0 or more (scrapy-redis spiders read it as an integer)" \
            in capsys.readouterr().err


def free_port_pair() -> int:
    """A port ``p`` such that ``p`` and ``p + 1`` are free, below the kernel's ephemeral
    range: the port after one that :func:`free_port` gave may be taken meanwhile by any
    outgoing connection or another test's ``free_port()``, and the second worker of
    ``bloomcrawl scale 2`` then could not listen."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    for port in random.sample(range(20000, ephemeral - 1), 200):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports below %d" % ephemeral)


def test_worker_ports_of_the_local_cluster() -> None:
    from bloomcrawl.ops.cluster.local import worker_ports

    assert worker_ports({}) == (6800, 6819)
    assert worker_ports({"WORKER_PORTS": "7100-7103"}) == (7100, 7103)
    assert worker_ports({"WORKER_PORTS": "7100"}) == (7100, 7100)
    for bad in ("7103-7100", "68OO", "0-5", "7000-70000"):
        with pytest.raises(OpsError, match="WORKER_PORTS=%r in .env" % bad):
            worker_ports({"WORKER_PORTS": bad})


def test_a_recycled_pid_is_never_signalled() -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        ticks = processes.process_start_ticks(proc.pid)
        assert ticks is not None
        stranger = ProcessRecord("x", proc.pid, ticks + 1, "/dev/null")
        processes.stop_process(stranger, timeout=1)
        assert proc.poll() is None  # not ours: left alone
        processes.stop_process(ProcessRecord("x", proc.pid, ticks, "/dev/null"), timeout=5)
        assert proc.wait(5) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_unreachable_node_is_a_one_line_error() -> None:
    url = "http://127.0.0.1:%d" % free_port()
    with pytest.raises(ScrapydError) as caught:
        Node(url, "u", "p").request("daemonstatus.json", timeout=2)
    assert str(caught.value) == (
        f"cannot reach the scrapyd node {url}: [Errno 111] Connection refused")
    assert caught.value.url == url + "/daemonstatus.json"


# --- the local-process cluster ------------------------------------------------------


def bloomcrawl(env: dict[str, str], *args: str) -> str:
    """``bloomcrawl ARGS`` under ``env``; its output, once it exited 0.

    A command that starts the cluster's processes (up, scale, demo) runs as a process of
    its own, as an operator runs it: they outlive it. The others run in-process.
    """
    starts = args[0] in ("up", "scale", "demo")
    run = run_cli_process(*args, env=env) if starts else run_cli(*args, env=env)
    return run.assert_ok().stdout


@pytest.mark.long
@pytest.mark.slow
def test_local_cluster_up_scale_deploy_demo_status_down(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.update(BLOOMCRAWL_ROOT=str(ROOT), BLOOMCRAWL_STATE_DIR=str(tmp_path / "run"),
               BLOOMCRAWL_ENV_FILE=str(tmp_path / ".env"),
               HOME=str(tmp_path / "home"))
    env.pop("PYTHONPATH", None)
    # free ports rather than the defaults, which a developer's cluster may hold
    worker_port = free_port_pair()
    (tmp_path / ".env").write_text("".join("%s=%d\n" % (name, free_port()) for name in (
        "REDIS_PORT", "EXPORTER_PORT", "PROMETHEUS_PORT", "DEMO_PORT"))
        + "WORKER_PORTS=%d-%d\n" % (worker_port, worker_port + 1))
    out = bloomcrawl(env, "up", "--local", "--workers", "1")
    state_file = tmp_path / "run" / "cluster.json"
    pids: list[int] = []
    try:
        assert "1 scrapyd node(s)" in out, out
        assert "http://127.0.0.1:%d" % worker_port in out, out  # WORKER_PORTS, not 6800
        out = bloomcrawl(env, "scale", "2")
        assert "2 scrapyd node(s)" in out, out
        assert "new nodes have no project yet" in out, out
        state = json.loads(state_file.read_text())
        pids = [p["pid"] for p in state["processes"]]
        names = sorted(p["name"] for p in state["processes"])
        assert {"redis", "exporter", "scrapyd-1", "scrapyd-2"} <= set(names), names
        for record in state["processes"]:
            assert processes.process_start_ticks(record["pid"]) == record["start_ticks"]
        # the secrets stay in .env: not in the record (owner-only all the same), not on
        # any command line (which every user of the machine can read)
        secrets = [v for k, v in envfile.read_env_file(tmp_path / ".env").items()
                   if k.endswith("PASSWORD")]
        assert len(secrets) == 3
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / ".env").stat().st_mode) == 0o600
        assert not [s for s in secrets if s in state_file.read_text()]
        for record in state["processes"]:
            cmdline = Path("/proc/%d/cmdline" % record["pid"]).read_bytes()
            assert not [s for s in secrets if s.encode() in cmdline], record["name"]

        out = bloomcrawl(env, "deploy")
        assert "to 2 of 2 node(s)" in out, out

        out = bloomcrawl(env, "demo", "--local", "--pages", "300", "--max-idle", "1",
                         "--timeout", "120")
        assert "300 pages, 300 fetched at least once, 0 missing, 0 fetched twice" in out, out

        out = bloomcrawl(env, "status")
        assert "nodes: 2 of 2 up" in out, out
        assert "site" in out and "est. FP rate" in out, out

        exporter_port = json.loads(state_file.read_text())["ports"]["exporter"]
        with OPENER.open("http://127.0.0.1:%d/metrics" % exporter_port,
                         timeout=10) as response:
            metrics = response.read().decode()
        assert 'bloomcrawl_pages_total{spider="site"} 300.0' in metrics
        # each node's pages under its own label: the nodes share one host name, their jobs
        # count under the node_name each reports
        by_node = {line.split('node="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                   for line in metrics.splitlines()
                   if line.startswith("bloomcrawl_node_pages_total{")}
        nodes = {"127.0.0.1:%d" % p["port"] for p in json.loads(state_file.read_text())[
            "processes"] if p["name"].startswith("scrapyd-")}
        assert set(by_node) <= nodes and sum(by_node.values()) == 300, (by_node, nodes)
        pids = [p["pid"] for p in json.loads(state_file.read_text())["processes"]]

        out = bloomcrawl(env, "scale", "1")  # fewer nodes: none of them new
        assert "1 scrapyd node(s)" in out, out
        assert "no project yet" not in out, out
    finally:
        out = bloomcrawl(env, "down")
    assert "local cluster down" in out, out
    assert not state_file.exists()
    wait_until(lambda: not any(group_alive(pid) for pid in pids), 10, interval=0.1,
               what=lambda: "processes left behind: %s" % [p for p in pids if group_alive(p)])
