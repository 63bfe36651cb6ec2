"""Files the operations tooling writes with secrets (or next to them) are the
owner's alone, from the moment they exist; and no secret goes on a command line.

Each file is checked with a umask of 0 and with ``os.fchmod`` disabled: only a
file created with its mode passes, never one created world-readable and
narrowed afterwards.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bloomcrawl.ops.cluster import envfile
from bloomcrawl.ops.cluster.processes import ProcessRecord, start_redis
from bloomcrawl.ops.cluster.state import Cluster, Paths, load_cluster, save_cluster


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def created_with_its_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """umask 0, and no narrowing after the fact."""
    monkeypatch.setattr(os, "fchmod", lambda fd, mode: None)
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)
    monkeypatch.setattr(Path, "chmod", lambda *args, **kwargs: None)
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def paths_in(tmp_path: Path) -> Paths:
    return Paths(root=tmp_path, env_file=tmp_path / ".env", state_dir=tmp_path / ".run")


def test_the_cluster_record_is_created_private_and_holds_no_password(
    tmp_path: Path, created_with_its_mode: None,
) -> None:
    paths = paths_in(tmp_path)
    values = envfile.ensure_env_file(paths.env_file)
    password = values["REDIS_PASSWORD"]
    cluster = Cluster("local", f"redis://:{password}@127.0.0.1:7000/0", "bloomcrawl",
                      values["SCRAPYD_PASSWORD"], ports={"redis": 7000},
                      processes=[ProcessRecord("redis", 1, 1, "/dev/null", 7000)])
    save_cluster(paths, cluster)
    assert mode(paths.cluster_file) == 0o600
    assert mode(paths.state_dir) == 0o700
    text = paths.cluster_file.read_text()
    assert password not in text and values["SCRAPYD_PASSWORD"] not in text
    # the secrets come from .env when the record is read
    loaded = load_cluster(paths)
    assert loaded is not None
    assert loaded.redis_url == cluster.redis_url
    assert loaded.password == values["SCRAPYD_PASSWORD"]
    save_cluster(paths, loaded)  # saved again: replaced, still private
    assert mode(paths.cluster_file) == 0o600
    assert not paths.cluster_file.with_suffix(".tmp").exists()


def test_a_record_of_an_older_version_is_still_read(tmp_path: Path) -> None:
    paths = paths_in(tmp_path)
    paths.state_dir.mkdir()
    paths.cluster_file.write_text(
        '{"mode": "local", "redis_url": "redis://:old@127.0.0.1:7001/0", "processes": []}')
    loaded = load_cluster(paths)
    assert loaded is not None and loaded.redis_url == "redis://:old@127.0.0.1:7001/0"


def test_a_new_env_file_is_created_private(tmp_path: Path, created_with_its_mode: None) -> None:
    path = tmp_path / ".env"
    envfile.ensure_env_file(path)
    assert mode(path) == 0o600


def test_an_env_file_readable_by_others_is_narrowed_before_secrets_go_in(
    tmp_path: Path,
) -> None:
    path = tmp_path / ".env"
    path.write_text("REDIS_PORT=7000\n")
    path.chmod(0o644)
    values = envfile.ensure_env_file(path)
    assert values["REDIS_PASSWORD"] and mode(path) == 0o600
    assert path.read_text().startswith("REDIS_PORT=7000\n")


def test_the_redis_password_is_in_a_private_file_not_on_the_command_line(
    tmp_path: Path, created_with_its_mode: None,
) -> None:
    password = 'pa ss"wo\\rd'  # quoting survives the config file's syntax
    process = start_redis(tmp_path / "redis", log=tmp_path / "redis.log", password=password)
    try:
        config = tmp_path / "redis" / "auth.conf"
        assert mode(config) == 0o600
        # (redis-server also rewrites its process title; the exporter, in
        # test_cli's local cluster, does not)
        assert password.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=process.port).ping()
        client = redis.Redis(port=process.port, password=password)
        assert client.ping()
        client.close()
    finally:
        process.stop()
