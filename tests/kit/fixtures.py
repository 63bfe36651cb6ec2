"""The tests' fixtures, over the kit; ``tests/conftest.py`` registers this module with
``pytest_plugins``.

Servers are real processes on free 127.0.0.1 ports, started and stopped by pid;
a test never touches a server it did not start. Every process a test starts
through a fixture is stopped when the test ends, however it ends.

* ``redis_server`` / ``redismod_server`` (session): a redis-server, plain or with
  RedisBloom; ``redis_client`` / ``redismod_client``: a client of it, the server
  emptied before and after the test;
* ``redis_cluster`` (session), ``clean_cluster`` (it, healthy and empty),
  ``private_cluster`` (a cluster of the test's own, for kills and reshards);
* ``demo_site``: a fresh 600-page demo site per test (indirect parametrization
  changes its options: ``@pytest.mark.parametrize("demo_site", [{"pages": 300}],
  indirect=True)``);
* ``worker_pool``: starts ``scrapy crawl`` workers in ``tmp_path`` and kills those
  still running when the test ends;
* ``scrapyd_node`` (session): scrapyd with the ``probe`` project; tests leave it
  with no job running or pending. ``scrapyd_nodes``: starts nodes of the test's own;
* ``cli_env``: an environment for the ``bloomcrawl`` command with no cluster in it;
  ``env_no_state``: one for Scrapy or benchmark subprocesses that write nothing
  outside ``tmp_path``; ``closed_port_url``: a redis:// URL nobody listens on.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bloomcrawl.ops.cluster import processes
from bloomcrawl.ops.demo_site import RunningSite, serve_in_thread

from kit import CRAWLER, TESTS
from kit.cli import cli_environment
from kit.cluster import RedisClusterProcesses
from kit.redis import RedisServer
from kit.scrapyd import ScrapydNode
from kit.workers import WorkerPool

#: pages of the ``demo_site`` fixture's site unless the test asks for another number: a
#: crawl by 3 workers costs about 14 ms of CPU a page (workers, Redis, the site), and 600
#: pages still give every worker a share, a kill a third of the site before it and
#: hundreds of pages after it
DEMO_SITE_PAGES = 600


def installed(tool: str) -> str:
    """The path of ``tool``; fails the test, saying how to get it, when it is missing
    (``make test`` installs every tool the tests run; a test never skips for one)."""
    path = shutil.which(tool)
    if path is None:
        package = {"promtool": "prometheus"}.get(tool, tool)
        pytest.fail(f"{tool} is not installed; `make test` installs it (Debian package"
                    f" {package})")
    return path


# --- Redis --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


def _emptied_client(server: RedisServer) -> Iterator[redis.Redis]:
    """A client of ``server``, emptied before and after the test."""
    client = server.client()
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    yield from _emptied_client(redis_server)


@pytest.fixture(scope="session")
def redismod_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    module, why = processes.redisbloom_module()
    if module is None:
        pytest.skip("RedisBloom module not available: %s" % why)
    with RedisServer(tmp_path_factory.mktemp("redismod"), module=module) as server:
        yield server


@pytest.fixture
def redismod_client(redismod_server: RedisServer) -> Iterator[redis.Redis]:
    yield from _emptied_client(redismod_server)


@pytest.fixture
def closed_port_url() -> str:
    """A redis:// URL on which nothing listens."""
    return "redis://127.0.0.1:%d/0" % processes.free_port()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    """One cluster for the session; tests that share it take ``clean_cluster``."""
    cluster = RedisClusterProcesses(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def clean_cluster(redis_cluster: RedisClusterProcesses) -> Iterator[RedisClusterProcesses]:
    """The session cluster, healthy again (dead nodes restarted) and empty."""
    redis_cluster.ensure_healthy()
    redis_cluster.flushall()
    yield redis_cluster
    redis_cluster.close_clients()


@pytest.fixture
def private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    """A cluster of this test's own, for destructive tests (kills, reshards)."""
    cluster = RedisClusterProcesses(tmp_path_factory.mktemp("redis-cluster-private")).start()
    yield cluster
    cluster.stop()


# --- sites, workers, scrapyd ------------------------------------------------------------------


@pytest.fixture
def demo_site(request: pytest.FixtureRequest) -> Iterator[RunningSite]:
    """A 600-page demo site served from a thread; ``.hits()`` counts this test's GETs."""
    options: dict[str, Any] = {"pages": DEMO_SITE_PAGES, **getattr(request, "param", {})}
    with serve_in_thread(**options) as site:
        yield site


@pytest.fixture
def worker_pool(tmp_path: Path) -> Iterator[WorkerPool]:
    """Starts ``scrapy crawl`` workers (logs in ``tmp_path``); kills those still running
    when the test ends."""
    with WorkerPool(tmp_path) as pool:
        yield pool


@pytest.fixture(scope="session")
def scrapyd_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScrapydNode]:
    """A running scrapyd with basic auth and the ``probe`` project, one job at a time;
    tests leave it with no jobs running or pending."""
    with ScrapydNode(tmp_path_factory.mktemp("scrapyd"), max_proc=1, probe=True) as node:
        yield node


@pytest.fixture
def scrapyd_nodes(tmp_path: Path) -> Iterator[Callable[..., ScrapydNode]]:
    """``start(name, **options)``: a scrapyd node of this test's own in ``tmp_path/name``
    (options as :class:`kit.scrapyd.ScrapydNode` takes them); all stopped at the end."""
    started: list[ScrapydNode] = []

    def start(name: str, **options: Any) -> ScrapydNode:
        node = ScrapydNode(tmp_path / name, **options)
        started.append(node)
        return node.start()

    yield start
    for node in started:
        node.stop()


# --- environments -----------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """For the ``bloomcrawl`` command: no recorded cluster, no .env, nothing of ours in
    the environment; the commands act on what their arguments say alone."""
    return cli_environment(tmp_path)


@pytest.fixture
def env_no_state(tmp_path: Path) -> dict[str, str]:
    """Environment for Scrapy and benchmark subprocesses: no writes outside tmp_path."""
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = os.pathsep.join([str(CRAWLER), str(TESTS)])
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return env
