"""The compose cluster on a Redis Cluster (``make up REDIS=cluster``), without a Docker engine.

What ``up --redis cluster`` records and how the commands read it back, the
host's client mapping the nodes' announced names to their published ports,
and docker-compose.cluster.yml as docker-compose merges it. The cluster
itself runs in ``make e2e`` (tests/e2e/cluster_e2e.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bloomcrawl.ops.cli import cluster as cli_cluster
from bloomcrawl.ops.cli.parser import build_parser
from bloomcrawl.ops.cli.target import Target
from bloomcrawl.ops.cluster import envfile
from bloomcrawl.ops.cluster.compose import REDIS_CLUSTER_SERVICES, Compose
from bloomcrawl.ops.cluster.state import Cluster, Paths, load_cluster, save_cluster
from bloomcrawl.ops.console import OpsError

from kit import ROOT


def paths_in(tmp_path: Path) -> Paths:
    return Paths(root=ROOT, env_file=tmp_path / ".env", state_dir=tmp_path / ".run")


def test_a_cluster_record_gives_a_cluster_url_and_the_override(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    values = envfile.ensure_env_file(paths.env_file)
    with paths.env_file.open("a") as f:
        f.write("REDIS_PORT=7100\n")
    save_cluster(paths, Cluster("docker", "", "", "", redis="cluster"))
    loaded = load_cluster(paths)
    assert loaded is not None and loaded.redis == "cluster"
    assert loaded.redis_url == "redis+cluster://:%s@127.0.0.1:7100" % values["REDIS_PASSWORD"]
    assert values["REDIS_PASSWORD"] not in paths.cluster_file.read_text()
    compose = Compose(paths)
    assert compose.redis_cluster
    assert compose.base()[compose.base().index("-p") - 3:compose.base().index("-p")] == [
        str(paths.compose_file), "-f", str(paths.cluster_compose_file)]
    assert not Compose(paths, "single").redis_cluster


def test_a_record_without_redis_is_a_single_redis(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    envfile.ensure_env_file(paths.env_file)
    paths.state_dir.mkdir()
    paths.cluster_file.write_text(json.dumps({"mode": "docker", "processes": []}))
    loaded = load_cluster(paths)
    assert loaded is not None and loaded.redis == "single"
    assert loaded.redis_url.startswith("redis://")
    assert str(paths.cluster_compose_file) not in Compose(paths).base()


def test_redis_cluster_is_refused_where_it_cannot_run(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    with pytest.raises(OpsError, match="containers only"):
        cli_cluster.up(paths, 1, mode="local", redis="cluster")
    envfile.ensure_env_file(paths.env_file)
    save_cluster(paths, Cluster("docker", "", "", "", redis="single"))
    with pytest.raises(OpsError, match="already up"):
        cli_cluster.up(paths, 1, redis="cluster")


def test_make_passes_redis_to_up_and_demo() -> None:
    parser = build_parser()
    assert parser.parse_args(["up", "--redis", "cluster"]).redis == "cluster"
    assert parser.parse_args(["demo", "--redis", "single"]).redis == "single"
    assert parser.parse_args(["up"]).redis is None
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--redis", "sentinel"])
    out = subprocess.run(["make", "-n", "up", "demo", "REDIS=cluster"], cwd=ROOT, text=True,
                         capture_output=True, check=True).stdout
    assert "up --workers 3 --redis cluster" in out and "demo --workers 3 --redis cluster" in out
    out = subprocess.run(["make", "-n", "up"], cwd=ROOT, text=True, capture_output=True,
                         check=True).stdout
    assert "--redis" not in out


class FakeCompose(Compose):
    def __init__(self, paths: Paths, ports: dict[str, int]) -> None:
        super().__init__(paths, "cluster")
        self.ports = ports

    def redis_node_ports(self) -> dict[str, int]:
        return self.ports


def test_the_hosts_client_maps_announced_names_to_published_ports(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    values = envfile.ensure_env_file(paths.env_file)
    ports = {service: 7100 + i for i, service in enumerate(REDIS_CLUSTER_SERVICES)}
    target = Target("redis+cluster://:x@127.0.0.1:7100", [], None, FakeCompose(paths, ports),
                    compose_redis_cluster=True)
    url, params = target._compose_cluster_client_args()
    assert url == "redis+cluster://:%s@%s" % (
        values["REDIS_PASSWORD"], ",".join("127.0.0.1:%d" % p for p in ports.values()))
    remap = params["address_remap"]
    assert remap(("redis-3", 6379)) == ("127.0.0.1", ports["redis-3"])
    assert remap(("redis", 6379)) == ("127.0.0.1", ports["redis"])
    assert remap(("10.0.0.9", 6379)) == ("10.0.0.9", 6379)


#: YAML to JSON, run by the interpreter of docker-compose v1 (a Python program with PyYAML)
YAML_TO_JSON = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"


def compose_config(tmp_path: Path, *files: str) -> dict[str, Any]:
    """``docker-compose config`` of ``files``, as docker-compose merges and interpolates them."""
    exe = shutil.which("docker-compose")
    assert exe is not None, "docker-compose is not installed (make test installs it)"
    env = tmp_path / ".env"
    env.write_text("REDIS_PASSWORD=pw\nSCRAPYD_USERNAME=u\nSCRAPYD_PASSWORD=p\n"
                   "GRAFANA_ADMIN_PASSWORD=g\n")
    cmd = [exe, "--env-file", str(env)]
    for file in files:
        cmd += ["-f", str(ROOT / file)]
    out = subprocess.run([*cmd, "-p", "bloomcrawl-config-test", "config"], cwd=ROOT, text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shebang = Path(exe).read_bytes()[:100].split(b"\n")[0]
    if not shebang.startswith(b"#!") or b"python" not in shebang:
        pytest.skip("docker-compose is not v1 (Python): its YAML cannot be read here")
    interpreter = shebang[2:].decode().split()
    data = subprocess.run([*interpreter, "-c", YAML_TO_JSON], input=out.stdout, text=True,
                          capture_output=True, check=True, timeout=60).stdout
    config: dict[str, Any] = json.loads(data)
    return config


def test_the_cluster_override_as_docker_compose_merges_it(tmp_path: Path) -> None:
    config = compose_config(tmp_path, "docker-compose.yml", "docker-compose.cluster.yml")
    services = config["services"]
    nodes = [s for s in services if s in REDIS_CLUSTER_SERVICES]
    assert sorted(nodes) == sorted(REDIS_CLUSTER_SERVICES)
    for name in REDIS_CLUSTER_SERVICES:
        command = services[name]["command"]
        assert command[command.index("--cluster-announce-hostname") + 1] == name
        assert command[command.index("--cluster-enabled") + 1] == "yes"
        assert command[command.index("--masterauth") + 1] == "pw"
        for port in services[name]["ports"]:
            assert str(port).startswith("127.0.0.1:"), port
    url = "redis+cluster://:pw@" + ",".join("%s:6379" % n for n in REDIS_CLUSTER_SERVICES)
    for name in ("worker", "exporter"):
        assert services[name]["environment"]["REDIS_URL"] == url
    init = services["redis-cluster-init"]["environment"]["REDIS_CLUSTER_NODES"]
    assert init.split() == ["%s:6379" % n for n in REDIS_CLUSTER_SERVICES]
    single = compose_config(tmp_path, "docker-compose.yml")["services"]
    assert single["worker"]["environment"]["REDIS_URL"] == "redis://:pw@redis:6379/0"
    assert "redis-2" not in single
