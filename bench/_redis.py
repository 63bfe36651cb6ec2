"""What the benchmarks read of a redis-server: its CPU counters.

Benchmarks run as scripts (``python bench/dedup.py``), so this module is
imported as ``_redis`` from the script's own directory. The server itself is
the test kit's :class:`kit.redis.RedisServer` (a free 127.0.0.1 port,
persistence off, RedisBloom loaded when asked, stopped by pid). Nothing here
prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis


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
