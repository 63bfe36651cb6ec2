"""The fault proxy against a real redis-server."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from faults.proxy import FaultProxy

from kit.redis import ClosingRedis, RedisServer
from kit.wait import wait_until


@pytest.fixture
def proxy(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as p:
        yield p


def client(proxy: FaultProxy, *, retries: int = 0, timeout: float = 5.0) -> redis.Redis:
    """A client through the proxy; by default it never resends a command."""
    return ClosingRedis(host="127.0.0.1", port=proxy.port, socket_timeout=timeout,
                        socket_connect_timeout=timeout, retry=Retry(NoBackoff(), retries),
                        # redis-py 5 retries only the errors listed here
                        retry_on_error=[redis.ConnectionError, redis.TimeoutError])


def test_passes_commands_through(proxy: FaultProxy, redis_client: redis.Redis) -> None:
    c = client(proxy)
    assert c.set("k", "v")
    assert redis_client.get("k") == b"v"
    big = b"x" * 300_000  # several reads either way
    c.set("big", big)
    assert c.get("big") == big
    assert proxy.connections == 1
    c.close()


def test_delay(proxy: FaultProxy) -> None:
    c = client(proxy)
    c.ping()
    proxy.set_delay(0.2)
    started = time.monotonic()
    c.ping()
    assert time.monotonic() - started >= 0.4  # request and reply each wait
    proxy.set_delay(0)
    started = time.monotonic()
    c.ping()
    assert time.monotonic() - started < 0.2
    c.close()


def test_stall_holds_bytes_then_delivers_them(proxy: FaultProxy,
                                              redis_client: redis.Redis) -> None:
    c = client(proxy)
    c.ping()
    proxy.stall(1.0)
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(c.incr("n")))
    t.start()
    time.sleep(0.5)
    assert redis_client.get("n") is None  # held: Redis has not seen it
    t.join(5)
    assert result == [1]
    assert redis_client.get("n") == b"1"
    short = client(proxy, timeout=0.3)
    proxy.stall(1.0)
    with pytest.raises(redis.TimeoutError):
        short.ping()
    proxy.resume()
    c.close()
    short.close()


def test_hold_from_forwards_a_packet_up_to_a_match(proxy: FaultProxy,
                                                  redis_client: redis.Redis) -> None:
    """A pipeline split where it names ``second``: Redis runs the first command alone."""
    c = client(proxy)
    proxy.hold_from(b"second")
    result: list[object] = []

    def send() -> None:
        pipe = c.pipeline(transaction=False)
        pipe.set("first", "1")
        pipe.set("second", "2")
        result.append(pipe.execute())

    t = threading.Thread(target=send)
    t.start()
    wait_until(lambda: proxy.splits == 1, 5, what="the pipeline split")
    wait_until(lambda: redis_client.get("first") == b"1", 5, what="the first SET run")
    time.sleep(0.2)
    assert redis_client.get("second") is None and result == []  # the rest is held
    proxy.resume()
    t.join(5)
    assert result == [[True, True]] and redis_client.get("second") == b"2"
    c.close()


def test_hold_connections_holds_only_those_that_sent_the_match(
        proxy: FaultProxy, redis_client: redis.Redis) -> None:
    """The connection that names ``frontier:`` waits; another one goes on meanwhile."""
    held, free = client(proxy), client(proxy)
    held.ping()
    free.ping()  # both connected before the hold
    proxy.hold_connections(b"frontier:")
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(held.set("frontier:a", "1")))
    t.start()
    wait_until(lambda: proxy.held_connections == 1, 5, what="the connection held")
    assert free.set("items:a", "1") is True  # not held: it never sent the match
    assert free.get("items:a") == b"1"
    time.sleep(0.2)
    assert redis_client.get("frontier:a") is None and result == []
    proxy.resume()
    t.join(5)
    assert result == [True] and redis_client.get("frontier:a") == b"1"
    held.close()
    free.close()


def test_cut_closes_every_connection(proxy: FaultProxy) -> None:
    a = client(proxy)
    a.ping()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(100) == b"+PONG\r\n"
        assert proxy.cut() == 2
        assert s.recv(100) == b""  # FIN
    wait_until(lambda: proxy.connections == 0, 5, interval=0.02,
               what=lambda: "the proxy to count no connection, not %d" % proxy.connections)
    assert a.ping()  # redis-py notices the closed connection and opens a new one
    a.close()


def test_reset_sends_rst(proxy: FaultProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(100) == b"+PONG\r\n"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):
            s.sendall(b"PING\r\n")
            time.sleep(0.2)
            s.sendall(b"PING\r\n")
            s.recv(100)


def test_dropped_reply_after_the_command_was_applied(proxy: FaultProxy,
                                                     redis_client: redis.Redis) -> None:
    no_retry = client(proxy)
    proxy.drop_replies(b"INCR", count=1)
    with pytest.raises(redis.ConnectionError):
        no_retry.incr("n")
    assert redis_client.get("n") == b"1"  # applied, though the client saw no reply
    assert proxy.packets_matched == proxy.replies_dropped == 1 and proxy.drops_pending == 0
    assert no_retry.incr("n") == 2  # only the next matching packet was dropped
    # a client that retries sends the applied command again: it runs twice
    retrying = client(proxy, retries=1)
    proxy.drop_replies(b"INCR", count=1)
    assert retrying.incr("n") == 4
    assert redis_client.get("n") == b"4"
    no_retry.close()
    retrying.close()


def test_switch_upstream(proxy: FaultProxy, redis_client: redis.Redis, tmp_path: Path) -> None:
    with RedisServer(tmp_path / "other") as other:
        c = client(proxy, retries=1)
        first = c.info("server")["run_id"]
        proxy.set_upstream(other.port)
        second = c.info("server")["run_id"]
        assert first != second
        direct = other.client()
        assert second == direct.info("server")["run_id"]
        direct.close()
        c.close()


def test_stop_closes_everything(redis_server: RedisServer) -> None:
    p = FaultProxy(redis_server.port).start()
    c = ClosingRedis(port=p.port, retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)
    c.ping()
    p.stop()
    with pytest.raises(redis.ConnectionError):
        c.ping()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", p.port), timeout=1).close()
