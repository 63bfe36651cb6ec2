"""Processes the fault suite starts and stops by pid: redis-server and the exporter.

Everything listens on 127.0.0.1 only. A :class:`RedisProcess` keeps its port
and data directory across restarts, so a restart from its RDB or AOF file is
the same server coming back; signals (SIGKILL, SIGSTOP, SIGCONT) go to the
pid it started, never to a process found by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import redis

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClosingRedis(redis.Redis):
    """A ``redis.Redis`` whose ``close()`` (and so its ``__del__``) closes its sockets.

    redis-py 5.0.0 (``make test-lowest``) closes none of the pool's sockets in
    ``close()``, and an error reply read on a connection (CLIENT SETINFO on every
    connect to Redis < 7.2) leaves it in a reference cycle (fixed upstream by
    redis/redis-py#2932): the socket then waits for the garbage collector, which
    may finalize it before its connection, a ResourceWarning ("unclosed socket")
    that ``filterwarnings = error`` makes a failure, in a test or at the session's
    end. Newer redis-py closes them in ``close()`` too; a second time is a no-op.
    """

    def close(self) -> None:
        super().close()
        pool = getattr(self, "connection_pool", None)  # None: __init__ failed early
        if pool is not None:
            pool.disconnect()


class RedisProcess:
    """A redis-server on 127.0.0.1 that the caller owns.

    ``appendonly``: AOF with ``appendfsync`` (``always`` by default); no RDB
    snapshots are taken unless asked (BGSAVE). ``extra_args`` go last on the
    command line (``["--maxmemory-policy", "allkeys-lru"]``).
    """

    def __init__(self, workdir: Path, *, appendonly: bool = False, appendfsync: str = "always",
                 extra_args: list[str] | None = None, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; `make test` installs it")
        self.binary = binary
        self.workdir = workdir
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args or [])
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return "redis://127.0.0.1:%d/0" % self.port

    @property
    def pid(self) -> int:
        assert self.proc is not None, "redis-server is not running"
        return self.proc.pid

    @property
    def log(self) -> Path:
        return self.workdir / "redis.log"

    def start(self) -> RedisProcess:
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.workdir), "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no", "--logfile", str(self.log),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        client = ClosingRedis(port=self.port, socket_connect_timeout=1, socket_timeout=5)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                try:
                    if int(client.info("server")["process_id"]) == self.proc.pid:
                        return self
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                except redis.ResponseError as exc:  # still loading its data
                    if "LOADING" not in str(exc):
                        raise
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
                    self.stop()
                    raise RuntimeError("redis-server did not start:\n" + tail)
                time.sleep(0.05)
        finally:
            client.close()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the redis-server this object started."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGCONT)  # a stopped server cannot act on SIGTERM
        os.kill(proc.pid, sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT_S)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no AOF rewrite; what is on disk is what comes back."""
        self.stop(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def client(self, **kwargs: object) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 10)
        return ClosingRedis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def bgsave(self, timeout: float = 30.0) -> None:
        """Take an RDB snapshot now and wait until it is on disk."""
        client = self.client()
        try:
            before = client.lastsave()
            client.bgsave()
            deadline = time.monotonic() + timeout
            while client.lastsave() == before or client.info("persistence")[
                    "rdb_bgsave_in_progress"]:
                if time.monotonic() > deadline:
                    raise RuntimeError("BGSAVE did not finish in %.0f s" % timeout)
                time.sleep(0.02)
            if client.info("persistence")["rdb_last_bgsave_status"] != "ok":
                raise RuntimeError("BGSAVE failed; see %s" % self.log)
        finally:
            client.close()


@dataclass
class Scrape:
    """One GET /metrics."""

    at: float  # time.monotonic() when it was sent
    seconds: float
    status: int | None  # None: no HTTP answer at all
    body: str
    error: str = ""

    def value(self, name: str, labels: str = "") -> float | None:
        """The value of the sample ``name{labels}`` (labels as written by the exporter)."""
        wanted = name + ("{%s}" % labels if labels else "")
        for line in self.body.splitlines():
            if line.startswith(wanted + " "):
                return float(line.split()[-1])
        return None


class Exporter:
    """``python -m bloomcrawl.ops.exporter`` and a thread scraping it every ``interval`` s."""

    def __init__(self, redis_url: str, workdir: Path, *, interval: float = 0.5,
                 http_timeout: float = 10.0) -> None:
        self.redis_url = redis_url
        self.port = free_port()
        self.interval = interval
        self.http_timeout = http_timeout
        self.log = workdir / "exporter.log"
        self.scrapes: list[Scrape] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="exporter-poll", daemon=True)
        self._logfile: BinaryIO | None = None

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d/metrics" % self.port

    def start(self) -> Exporter:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT / "crawler")
        env.pop("SCRAPYD_NODES", None)
        env.pop("SCRAPYD_SERVICE", None)
        self._logfile = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bloomcrawl.ops.exporter", "--port", str(self.port),
             "--bind", "127.0.0.1", "--redis-url", self.redis_url],
            stdin=subprocess.DEVNULL, stdout=self._logfile, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.scrape().status is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the exporter did not start:\n"
                                   + self.log.read_text(errors="replace")[-2000:])
            time.sleep(0.1)
        self._thread.start()
        return self

    def scrape(self) -> Scrape:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(self.url, timeout=self.http_timeout) as response:
                return Scrape(started, time.monotonic() - started, response.status,
                              response.read().decode(errors="replace"))
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            return Scrape(started, time.monotonic() - started, exc.code, body, str(exc))
        except OSError as exc:
            return Scrape(started, time.monotonic() - started, None, "", str(exc))

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self.scrapes.append(self.scrape())

    def failures(self) -> list[Scrape]:
        """Scrapes that did not answer 200 within the HTTP timeout."""
        return [s for s in self.scrapes if s.status != 200]

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.http_timeout + 1)
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT_S)
        if self._logfile is not None:
            self._logfile.close()
            self._logfile = None
