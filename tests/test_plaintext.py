"""Which addresses count as this machine, and the plain-text refusal with its way out."""

from __future__ import annotations

import pytest

from bloomcrawl.core.connection import INSECURE_ENV, is_local_host, redis_from_url
from bloomcrawl.core.errors import SettingError
from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.console import OpsError


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost",
                                  "LOCALHOST", "h0.localhost", "redis", "worker", "redis-2",
                                  "bloomcrawl_redis"])
def test_loopback_localhost_and_compose_service_names_stay_on_the_machine(host: str) -> None:
    assert is_local_host(host)


@pytest.mark.parametrize("host", ["198.18.20.1", "10.0.0.5", "0.0.0.0", "2001:db8::1",
                                  "redis.example.com", "tasks.worker", ""])
def test_other_addresses_and_dotted_names_may_be_another_machine(host: str) -> None:
    assert not is_local_host(host)


def test_plain_redis_off_the_machine_is_refused_unless_insecure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INSECURE_ENV, raising=False)
    for url in ("redis://:secret@10.0.0.5:6379/0",
                "redis+cluster://:secret@redis:6379,10.0.0.6:6379"):
        with pytest.raises(SettingError, match=r"is plain text to 10\.0\.0\.[56]") as caught:
            redis_from_url(url)
        assert "secret" not in str(caught.value)
    # TLS, the machine itself, a compose service: a client, no connection made yet
    for url in ("rediss://:secret@10.0.0.5:6379/0", "redis://127.0.0.1:6379/0",
                "redis://:secret@redis:6379/0"):
        redis_from_url(url).close()
    redis_from_url("redis://10.0.0.5:6379/0", insecure=True).close()
    monkeypatch.setenv(INSECURE_ENV, "1")  # what --insecure sets for a worker's job
    redis_from_url("redis://10.0.0.5:6379/0").close()


def test_plain_scrapyd_off_the_machine_is_refused_unless_insecure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INSECURE_ENV, raising=False)
    with pytest.raises(OpsError, match=r"scrapyd node http://10\.0\.0\.7:6800 is plain text"):
        scrapyd.check_node_url("10.0.0.7:6800")
    assert scrapyd.check_node_url("https://10.0.0.7:6800/") == "https://10.0.0.7:6800"
    assert scrapyd.check_node_url("http://worker:6800") == "http://worker:6800"
    assert scrapyd.check_node_url("http://10.0.0.7:6800", insecure=True)
    with pytest.raises(OpsError, match="must be http"):
        scrapyd.check_node_url("ftp://10.0.0.7:6800")


def test_a_node_whose_ca_does_not_load_is_down_saying_why() -> None:
    status = scrapyd.Node("https://10.0.0.7:6800", "u", "p", ca_pem="not a certificate").status()
    assert not status.up
    assert status.error is not None and status.error.startswith(
        "its CA certificate does not load:"), status.error
