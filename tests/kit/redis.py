"""redis-server for the tests and benchmarks, started by the project's own process manager.

:class:`RedisServer` is :func:`bloomcrawl.ops.cluster.processes.start_redis`
(127.0.0.1 only, no RDB snapshots, ready once the server answers as the pid
it started) plus what a test does to a server: it keeps its port and data
directory across :meth:`~RedisServer.restart`, so a restart from its AOF or
RDB file is the same server coming back; signals (SIGKILL, SIGSTOP, SIGCONT)
go to the pid it started, never to a process found by name.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from bloomcrawl.ops.cluster.processes import ManagedProcess, ProcessError, start_redis

from kit.wait import wait_until

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


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


class RedisServer:
    """A redis-server on 127.0.0.1 that the caller owns; a context manager too.

    ``workdir`` holds its data and ``redis.log`` (None: a temporary directory,
    removed by :meth:`stop`). ``port`` None: a free one, chosen at the first
    start and kept. ``appendonly``: AOF with ``appendfsync`` (``always`` by
    default: a restart keeps every acknowledged write). ``module`` is loaded
    (RedisBloom); ``extra_args`` go last on the command line.
    """

    def __init__(self, workdir: Path | None = None, *, port: int | None = None,
                 appendonly: bool = False, appendfsync: str = "always",
                 module: str | None = None, extra_args: list[str] | None = None,
                 binary: str | None = None, timeout: float = START_TIMEOUT_S) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bloomcrawl-redis-")
            workdir = Path(self._tmp.name)
        self.workdir = workdir
        self.port = port or 0
        self.appendonly = appendonly
        self.module = module
        self.extra_args = list(extra_args or [])
        if appendonly:
            self.extra_args[:0] = ["--appendfsync", appendfsync]
        self.binary = binary
        self.timeout = timeout
        self.process: ManagedProcess | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return "redis://127.0.0.1:%d/0" % self.port

    @property
    def log(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def pid(self) -> int:
        assert self.process is not None, "redis-server is not running"
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def start(self) -> RedisServer:
        """Start on this server's port and data directory (the same ones after a stop).

        Raises :class:`RuntimeError` ending with the server's last log lines when it
        does not start.
        """
        try:
            self.process = start_redis(
                self.workdir, port=self.port or None, log=self.log, appendonly=self.appendonly,
                module=self.module, extra_args=self.extra_args, binary=self.binary,
                timeout=self.timeout)
        except ProcessError as exc:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError("redis-server did not start: %s\n%s" % (exc, tail)) from exc
        self.port = self.process.port or self.port
        return self

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the redis-server this object started (if it still runs)."""
        if self.running():
            os.kill(self.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> None:
        """``sig`` (SIGKILL after ``timeout`` s); SIGCONT first, as a stopped server cannot
        act on SIGTERM. The temporary data directory, if any, goes only with :meth:`close`."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.running():
            os.kill(process.pid, signal.SIGCONT)
        process.stop(timeout=timeout, sig=sig)

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no AOF rewrite; what is on disk is what comes back."""
        self.stop(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def close(self) -> None:
        """Stop it, and remove its temporary data directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client whose close(), or its end, closes its sockets (see :class:`ClosingRedis`)."""
        kwargs.setdefault("socket_timeout", 10)
        return ClosingRedis(host="127.0.0.1", port=self.port, **kwargs)

    def bgsave(self, timeout: float = 30.0) -> None:
        """Take an RDB snapshot now and wait until it is on disk."""
        client = self.client()
        try:
            # rdb_saves counts snapshots (LASTSAVE has seconds: one within the second
            # of the last went unseen)
            before = client.info("persistence")["rdb_saves"]
            client.bgsave()

            def saved() -> bool:
                info = client.info("persistence")
                return info["rdb_saves"] > before and not info["rdb_bgsave_in_progress"]

            wait_until(saved, timeout, interval=0.02, what="BGSAVE finished")
            if client.info("persistence")["rdb_last_bgsave_status"] != "ok":
                raise RuntimeError("BGSAVE failed; see %s" % self.log)
        finally:
            client.close()

    def modules(self) -> set[str]:
        """Names of the modules the server loaded (``MODULE LIST``)."""
        client = self.client()
        try:
            entries = client.execute_command("MODULE", "LIST") or []
        finally:
            client.close()
        names = set()
        for entry in entries:
            fields = dict(zip(entry[::2], entry[1::2], strict=False)) if isinstance(
                entry, list) else entry
            value = fields.get(b"name", fields.get("name"))
            names.add(value.decode() if isinstance(value, bytes) else str(value))
        return names

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


# --- Redis's clock (revisit windows and schedules count on it, not the test's) ----------


def redis_now(client: redis.Redis) -> float:
    """Redis's ``TIME`` in seconds."""
    seconds, micros = client.time()
    return float(seconds + micros / 1e6)


def wait_for_redis_time(client: redis.Redis, t: float) -> None:
    """Wait until Redis's clock reads ``t`` or later."""
    wait_until(lambda: redis_now(client) >= t, timeout=t - redis_now(client) + 5,
               what="Redis TIME past %.3f" % t)
