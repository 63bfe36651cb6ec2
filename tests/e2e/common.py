"""What the e2e cases share beside cluster_e2e's checks: the simulated hosts, leftovers.

:class:`SimulatedHosts` is a set of hosts made by scripts/swarm-hosts.sh (network
namespaces, a dockerd in some): the script run with the case's settings, each
engine's docker client, the namespaces and engine pids left. The swarm case
and the remote case each make their own (another directory, prefix, network).

:func:`labelled_resources` lists what an engine holds of a compose project or a
stack; :data:`HTTP` is the Python a case runs where the demo site is reachable
(inside the stack, inside a host's namespace) to read it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: argv: url [body]: the answer's body on stdout (a body: a POST); no proxy
HTTP = """
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
data = sys.argv[2].encode() if len(sys.argv) > 2 else None
with opener.open(urllib.request.Request(sys.argv[1], data=data), timeout=20) as r:
    sys.stdout.write(r.read().decode())
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has no command line)."""
    try:
        return bool(Path("/proc/%d/cmdline" % pid).read_bytes())
    except OSError:
        return False


def labelled_resources(label: str, docker: Sequence[str] = ("docker",), *,
                       check: bool = True) -> list[str]:
    """The containers, networks and volumes with ``label`` (``key=value``), "kind id" each;
    ``docker``: the client's command (``docker -H <socket>`` for another engine)."""
    found = []
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        result = subprocess.run([*docker, *kind, "-q", "--filter", "label=" + label],
                                text=True, capture_output=True, check=check, timeout=60)
        found += ["%s %s" % (kind[0], r) for r in result.stdout.split()]
    return found


class SimulatedHosts:
    """The hosts scripts/swarm-hosts.sh makes under ``directory``, its namespaces named
    ``<prefix>-<host>``; ``settings``: more SWARM_HOSTS_* for the script;
    ``environment``: the case's environment, read at each run of the script."""

    def __init__(self, directory: Path, prefix: str, environment: Callable[[], dict[str, str]],
                 settings: Mapping[str, str] | None = None) -> None:
        self.directory = directory
        self.prefix = prefix
        self.environment = environment
        self.settings = {"SWARM_HOSTS_DIR": str(directory), "SWARM_HOSTS_PREFIX": prefix,
                         **(settings or {})}

    def script(self, *args: str, timeout: float = 180) -> str:
        """``swarm-hosts.sh ARGS``: its stdout; raises with its output's tail when it fails."""
        result = subprocess.run([str(ROOT / "scripts" / "swarm-hosts.sh"), *args], cwd=ROOT,
                                text=True, capture_output=True, timeout=timeout,
                                env={**self.environment(), **self.settings})
        assert result.returncode == 0, "swarm-hosts.sh %s: %s" % (
            " ".join(args), (result.stdout + result.stderr)[-1500:])
        return result.stdout

    def socket(self, host: str = "h1") -> str:
        """The docker socket of ``host``'s engine."""
        return "unix://%s/docker.sock" % (self.directory / host)

    def docker_command(self, host: str = "h1") -> list[str]:
        return ["docker", "-H", self.socket(host)]

    def docker(self, *args: str, host: str = "h1", check: bool = True,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.docker_command(host), *args], text=True,
                              capture_output=True, check=check, timeout=timeout)

    def namespaces(self) -> list[str]:
        """The network namespaces of these hosts that exist now (``ip netns list``)."""
        out = subprocess.run(["ip", "netns", "list"], text=True, capture_output=True,
                             check=True, timeout=30).stdout
        return [line.split()[0] for line in out.splitlines()
                if line.startswith(self.prefix + "-")]

    def engine_pids(self) -> list[str]:
        """The pids the engines' pid files hold."""
        return [pidfile.read_text().strip() for pidfile in self.directory.glob("*/*.pid")]
