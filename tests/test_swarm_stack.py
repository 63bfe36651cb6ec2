"""The Swarm stack file against the compose file, and which commands run on the stack.

docker-compose.swarm.yml repeats the services of docker-compose.yml with the
keys a stack needs: these tests read both as docker-compose merges and
interpolates them and check that what a service runs is the same, and what a
stack adds is there. The stack itself runs in the e2e's swarm case
(tests/e2e/swarm_e2e.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from test_compose_redis_cluster import compose_config

from bloomcrawl.ops.cli.parser import build_parser
from bloomcrawl.ops.cli.stack import IN_STACK_COMMANDS, in_stack
from bloomcrawl.ops.cluster.state import Cluster, Paths, save_cluster
from bloomcrawl.ops.cluster.swarm import IN_STACK_ENV

#: what a service runs: the same in the stack as in compose
SAME_KEYS = ("image", "command", "environment", "healthcheck", "init", "stop_grace_period")


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("swarm-config")
    return (compose_config(tmp, "docker-compose.yml")["services"],
            compose_config(tmp, "docker-compose.swarm.yml"))


def test_every_compose_service_runs_the_same_in_the_stack(
        configs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    compose, stack = configs
    services = stack["services"]
    assert sorted(services) == sorted(compose)
    for name, service in compose.items():
        for key in SAME_KEYS:
            assert services[name].get(key) == service.get(key), (name, key)
        volumes = [str(v.get("target") if isinstance(v, dict) else v).split(":")[-2:]
                   for v in service.get("volumes", [])]
        stacked = [str(v.get("target") if isinstance(v, dict) else v).split(":")[-2:]
                   for v in services[name].get("volumes", [])]
        assert stacked == volumes, name


def test_the_stack_publishes_nothing_and_places_each_service(
        configs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, stack = configs
    services = stack["services"]
    for name, service in services.items():
        assert not service.get("ports"), f"{name} publishes {service.get('ports')}"
        assert "build" not in service, name
        # no virtual IP: every name resolves to its tasks (and no IPVS is needed)
        assert service["deploy"]["endpoint_mode"] == "dnsrr", name
    assert services["redis"]["deploy"]["placement"]["constraints"] == [
        "node.labels.bloomcrawl.redis == true"]
    for name in ("exporter", "timer", "prometheus", "grafana", "demo"):
        assert services[name]["deploy"]["placement"]["constraints"] == [
            "node.role == manager"], name
    worker = services["worker"]
    assert str(worker["deploy"]["replicas"]) == "3"
    assert worker["hostname"] == "{{.Node.Hostname}}-worker-{{.Task.Slot}}"
    assert str(services["demo"]["deploy"]["replicas"]) == "0"
    assert str(services["grafana"]["deploy"]["replicas"]) == "0"
    network = stack["networks"]["default"]
    assert network["driver"] == "overlay" and network["attachable"] is True


def recorded(tmp_path: Path, mode: str) -> Paths:
    paths = Paths(tmp_path, tmp_path / ".env", tmp_path / "state")
    save_cluster(paths, Cluster(mode, "", "", "", project_name="s"))
    return paths


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_commands_that_talk_to_the_cluster_run_on_a_recorded_stack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (IN_STACK_ENV, "REDIS_URL", "SCRAPYD_NODES"):
        monkeypatch.delenv(name, raising=False)
    swarm = recorded(tmp_path / "swarm", "swarm")
    assert in_stack(parse("status"), swarm)
    assert in_stack(parse("deploy"), swarm)
    assert in_stack(parse("crawl", "http://demo:8000/"), swarm)
    # the stack's lifecycle runs here, on the manager
    for argv in (["up"], ["down"], ["scale", "4"], ["logs"], ["demo"]):
        assert not in_stack(parse(*argv), swarm), argv
        assert argv[0] not in IN_STACK_COMMANDS
    # a cluster given by address is reached from here
    assert not in_stack(parse("deploy", "--nodes", "http://127.0.0.1:6800"), swarm)
    assert not in_stack(parse("status", "--redis-url", "redis://127.0.0.1:1/0"), swarm)
    compose = recorded(tmp_path / "compose", "docker")
    assert not in_stack(parse("status"), compose)
    # inside the stack's container: it acts on what it was given
    monkeypatch.setenv(IN_STACK_ENV, "1")
    assert not in_stack(parse("status"), swarm)
