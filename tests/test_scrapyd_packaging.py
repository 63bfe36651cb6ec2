"""The Scrapy project as scrapyd sees it: the egg, a real scrapyd, deploy and schedule.

scrapyd runs on a free 127.0.0.1 port with basic auth, started and stopped by
pid. The compose file and the worker image's scrapyd.conf are checked
statically (the e2e test runs them for real).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bloomcrawl.ops.cluster.processes import free_port

from kit import CRAWLER, ROOT
from kit.cli import CliRun, run_cli
from kit.redis import RedisServer
from kit.scrapyd import PASSWORD, USERNAME, ScrapydNode


def copy_project(tmp_path: Path) -> Path:
    """The Scrapy project copied out of the checkout, so builds leave no files in it."""
    dest = tmp_path / "crawler"
    shutil.copytree(CRAWLER, dest, ignore=shutil.ignore_patterns(
        "*.egg-info", "build", "dist", "__pycache__"))
    return dest


def build_egg(project: Path, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "scrapyd_client.deploy", "--build-egg", str(out)],
                   cwd=project, check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def egg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("egg")
    out = tmp / "bloomcrawl.egg"
    build_egg(copy_project(tmp), out)
    return out


def test_egg_holds_the_project_and_its_settings_entry_point(egg: Path) -> None:
    with zipfile.ZipFile(egg) as z:
        names = set(z.namelist())
        entry_points = z.read("EGG-INFO/entry_points.txt").decode()
    assert {"bloomcrawl/crawl/settings.py", "bloomcrawl/crawl/spiders/site.py",
            "bloomcrawl/crawl/scheduler.py", "bloomcrawl/core/frontier.py",
            "bloomcrawl/core/lua/bloom_add.lua"} <= names
    # the operations tooling (CLI, exporter, demo site) never ships to a worker
    assert not [n for n in names if n.startswith("bloomcrawl/ops/")]
    parser = configparser.ConfigParser()
    parser.read_string(entry_points)
    assert parser["scrapy"]["settings"] == "bloomcrawl.crawl.settings"


def test_scrapy_cfg_names_the_settings_and_a_deploy_target() -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(CRAWLER / "scrapy.cfg")
    assert parser["settings"]["default"] == "bloomcrawl.crawl.settings"
    assert parser["deploy"]["project"] == "bloomcrawl"
    assert not parser["deploy"]["url"].endswith("/")
    # credentials come from the environment, never from the file
    assert parser["deploy"]["password"] == "$SCRAPYD_PASSWORD"


@pytest.fixture
def scrapyd(scrapyd_nodes: Callable[..., ScrapydNode], redis_server: RedisServer) -> ScrapydNode:
    return scrapyd_nodes("scrapyd", redis_url=redis_server.url)


def run_cli_as_deployer(*args: str, tmp_path: Path) -> CliRun:
    """``bloomcrawl ARGS`` with the nodes' credentials in the environment, no cluster."""
    env = dict(os.environ)
    env.update(SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD,
               BLOOMCRAWL_STATE_DIR=str(tmp_path / "state"),
               BLOOMCRAWL_ENV_FILE=str(tmp_path / "no.env"), BLOOMCRAWL_ROOT=str(ROOT))
    return run_cli(*args, env=env)


def test_scrapyd_deploy_uploads_to_one_node(scrapyd: ScrapydNode, tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    env = dict(os.environ, SCRAPYD_USERNAME=USERNAME, SCRAPYD_PASSWORD=PASSWORD,
               SCRAPYD_URL=scrapyd.url)
    result = subprocess.run([sys.executable, "-m", "scrapyd_client.deploy", "node"],
                            cwd=project, env=env, text=True, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "ok"
    spiders = scrapyd.node.request("listspiders.json?project=bloomcrawl")["spiders"]
    assert spiders == ["site"]


def test_deploy_then_schedule_a_job_that_runs_and_ends(
        scrapyd: ScrapydNode, tmp_path: Path, redis_client: object) -> None:
    result = run_cli_as_deployer("deploy", "--nodes", scrapyd.url, tmp_path=tmp_path)
    assert result.code == 0, result.output
    assert "to 1 of 1 node(s)" in result.stdout
    result = run_cli_as_deployer(
        "schedule", "--nodes", scrapyd.url, "--max-idle", "1",
        "-s", "REMOTE_CONTROL_ENABLED=False", "-s", "TELNETCONSOLE_ENABLED=False",
        "--allowed-domains", "127.0.0.1", tmp_path=tmp_path)
    assert result.code == 0, result.output
    job = result.stdout.split()[-1]
    log = scrapyd.wait_finished("bloomcrawl", "site", job)
    assert "Spider closed (finished)" in log, log[-3000:]


def test_deploy_fails_when_any_node_fails(scrapyd: ScrapydNode, tmp_path: Path) -> None:
    closed = "http://127.0.0.1:%d" % free_port()
    result = run_cli_as_deployer("deploy", "--nodes", "%s,%s" % (scrapyd.url, closed),
                                 tmp_path=tmp_path)
    assert result.code == 1
    assert "to 1 of 2 node(s)" in result.stdout
    assert "FAIL cannot reach the scrapyd node %s: [Errno 111] Connection refused\n" % (
        closed) in result.stdout
    # the node that answered still got the project
    assert "bloomcrawl" in scrapyd.node.request("listprojects.json")["projects"]


def test_deploy_with_a_wrong_password_fails(scrapyd: ScrapydNode, tmp_path: Path) -> None:
    env = dict(os.environ, SCRAPYD_PASSWORD="wrong", BLOOMCRAWL_STATE_DIR=str(tmp_path / "state"),
               BLOOMCRAWL_ENV_FILE=str(tmp_path / "no.env"), BLOOMCRAWL_ROOT=str(ROOT))
    result = run_cli("deploy", "--nodes", scrapyd.url, "--username", USERNAME, env=env)
    assert result.code == 1, result.output


def test_worker_scrapyd_conf_sets_what_a_container_needs() -> None:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "deploy" / "scrapyd.conf")
    conf = parser["scrapyd"]
    assert conf["bind_address"] == "0.0.0.0"
    assert int(conf["max_proc"]) > 0  # 0 would count the host's CPUs
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert 'CMD ["scrapyd", "--pidfile="]' in dockerfile
    assert re.search(r"^USER scrapyd$", dockerfile, re.M)
    assert re.search(r"^ARG BASE_IMAGE=python:", dockerfile, re.M)
    assert "daemonstatus" in (ROOT / "deploy" / "healthcheck.py").read_text()


def test_every_published_port_is_bound_to_loopback() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    published = re.findall(r"^\s+- \"([^\"]*:\d+)\"\s*$", compose.split("volumes:\n  redis")[0],
                           re.M)
    ports = [p for p in published if re.search(r":\d+$", p) and "/" not in p]
    assert len(ports) >= 6, ports
    assert all(p.startswith("127.0.0.1:") for p in ports), ports
    assert "requirepass" in compose and "appendonly" in compose
