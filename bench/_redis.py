"""Helpers shared by the benchmarks: a private redis-server and its CPU counters.

Benchmarks run as scripts (``python bench/dedup.py``), so this module is
imported as ``_redis`` from the script's own directory, after the script put
the working tree's ``crawler/`` on ``sys.path``. Nothing here prints.

``PrivateRedis`` starts ``redis-server`` on a free 127.0.0.1 port with
persistence off (and RedisBloom loaded when asked and installed), and stops
exactly the process it started, by pid: it is a thin user of the project's
process manager, :mod:`bloomcrawl.ops.cluster.processes`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from bloomcrawl.ops.cluster.processes import (
    ManagedProcess,
    ProcessError,
    free_port,
    redisbloom_module,
    start_redis,
)

__all__ = ["CpuSample", "PrivateRedis", "cpu_sample", "free_port", "redisbloom_module"]

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0


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
        self.binary = binary  # None: redis-server on PATH
        self.module = module
        self.extra_args = list(extra_args or [])
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.workdir = self._given_workdir or Path()
        self.port = 0
        self.process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> None:
        """Start on a free port; the data directory is a fresh temporary one unless given.

        Raises :class:`RuntimeError` ending with the server's last log lines when it
        does not start (the temporary directory, log included, is gone by then).
        """
        if self._given_workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="bloomcrawl-bench-redis-")
            self.workdir = Path(self._tmp.name)
        log = self.workdir / "redis.log"
        try:
            # a free port, and another one when a process bound it first
            self.process = start_redis(self.workdir, log=log, module=self.module,
                                       extra_args=self.extra_args, binary=self.binary,
                                       timeout=START_TIMEOUT_S)
        except ProcessError as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            self.stop()
            raise RuntimeError(f"{exc}:\n{tail.rstrip()}") from exc
        self.port = self.process.port or 0

    def stop(self) -> None:
        """Stop the server this object started, then remove its temporary directory."""
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout=STOP_TIMEOUT_S)
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
