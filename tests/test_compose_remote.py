"""``make up REDIS_BIND=addr`` in containers, without a Docker engine: what it records,
writes for the redis container, and docker-compose.remote.yml as docker-compose reads it.
In containers: the remote case of ``make e2e`` (tests/e2e/remote_e2e.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from bloomcrawl.ops import acl
from bloomcrawl.ops.cli import cluster as cli_cluster
from bloomcrawl.ops.cluster import envfile
from bloomcrawl.ops.cluster.compose import (
    REDIS_TLS_DIR,
    REDIS_TLS_DIR_VARIABLE,
    REMOTE_COMPOSE_FILE,
    Compose,
)
from bloomcrawl.ops.cluster.state import Cluster, Paths, save_cluster

from kit import ROOT


def test_the_override_publishes_tls_on_redis_bind_alone(tmp_path: Path) -> None:
    exe = shutil.which("docker-compose")
    assert exe is not None, "docker-compose is not installed (make test installs it)"
    env_file = tmp_path / ".env"
    env_file.write_text("REDIS_PASSWORD=pw\nSCRAPYD_USERNAME=u\nSCRAPYD_PASSWORD=p\n"
                        "GRAFANA_ADMIN_PASSWORD=g\n")
    cmd = [exe, "--env-file", str(env_file), "-f", str(ROOT / "docker-compose.yml"), "-f",
           str(ROOT / REMOTE_COMPOSE_FILE), "-p", "bloomcrawl-config-test", "config"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_")}
    out = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=60,
                         env={**env, "REDIS_BIND": "198.18.20.1"})
    assert out.returncode == 0, out.stderr
    ports = [line.strip() for line in out.stdout.splitlines()
             if line.strip().startswith("- ") and (":6379" in line or ":6380" in line)]
    # plain on 127.0.0.1 alone, TLS on the address
    assert ports == ["- 127.0.0.1:6379:6379/tcp", "- 198.18.20.1:6380:6380/tcp"], ports
    for option in ("--tls-port", "--tls-auth-clients", "/etc/bloomcrawl/tls/users.conf"):
        assert option in out.stdout
    missing = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=60,
                             env=env)
    assert missing.returncode != 0 and "make up REDIS_BIND=addr" in missing.stderr


def test_up_writes_what_the_redis_container_mounts_and_records_the_override(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = Paths(root=ROOT, env_file=tmp_path / ".env", state_dir=tmp_path / ".run")
    subprocess.run([str(ROOT / "scripts" / "make-certs.sh"), str(paths.certs_dir), "server",
                    "127.0.0.1", "198.18.20.1"], check=True, capture_output=True, timeout=60)
    envfile.ensure_env_file(paths.env_file)
    values = envfile.ensure_role_passwords(
        paths.env_file, [acl.password_variable(role) for role in acl.ROLES])
    cli_cluster.write_redis_tls_dir(paths)
    mounted = paths.state_dir / REDIS_TLS_DIR
    assert sorted(p.name for p in mounted.iterdir()) == [
        "ca.crt", "server.crt", "server.key", "users.conf"]
    assert stat.S_IMODE(paths.state_dir.stat().st_mode) == 0o700
    users = (mounted / "users.conf").read_text()
    assert users.splitlines() == [acl.config_line(role, values[acl.password_variable(role)])
                                  for role in acl.ROLES]
    assert not [role for role in acl.ROLES if values[acl.password_variable(role)] in users]
    # Compose sets these for docker-compose; monkeypatch puts back what was there
    monkeypatch.setenv("REDIS_BIND", "")
    monkeypatch.delenv("REDIS_BIND")
    monkeypatch.setenv(REDIS_TLS_DIR_VARIABLE, "unset")
    save_cluster(paths, Cluster("docker", "", "", "", redis_bind="198.18.20.1", tls=True))
    compose = Compose(paths)
    assert str(ROOT / REMOTE_COMPOSE_FILE) in compose.base()
    # the redis container mounts what was written, in this state directory (not ./.run)
    config = compose.run("config", capture=True, timeout=60).stdout
    assert "%s:/etc/bloomcrawl/tls:ro" % mounted in config, config
