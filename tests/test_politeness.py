"""Per-host politeness in the frontier, against a real redis-server: several Frontier
instances stand for several workers; each promise is tried on the Lua scripts directly."""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings

from bloomcrawl.core import presence
from bloomcrawl.core.bloom import BloomFilter, partition_of
from bloomcrawl.core.errors import FilterMismatchError, SettingError
from bloomcrawl.core.frontier import Frontier, Outgoing
from bloomcrawl.core.keys import FrontierKeys
from bloomcrawl.core.leases import ONE_SLOT
from bloomcrawl.core.politeness import (
    BUSY_RETRY_S,
    Feedback,
    Politeness,
    filter_fingerprint,
    host_of,
    host_partition,
    host_states,
    politeness_summary,
    set_policy,
)
from bloomcrawl.crawl.config import FilterConfig, politeness_from_settings
from bloomcrawl.crawl.feedback import named_slot
from bloomcrawl.crawl.scheduler import retry_after

PARTITIONS = 4
#: the frontier keeps a host's delay 5 % longer (polite_common.lua): scheduling jitter
MARGIN = 1.05


def bloom(client: redis.Redis, **kwargs: Any) -> BloomFilter:
    return BloomFilter(client, "t:bloomfilter", capacity=10_000, error_rate=0.01,
                       partitions=PARTITIONS, **kwargs)


def worker(client: redis.Redis, name: str, politeness: Politeness,
           lease_timeout: float = 30.0, queue_type: str = "fifo") -> Frontier:
    return Frontier(client, bloom(client), FrontierKeys("t", partitions=PARTITIONS),
                    queue_type=queue_type, lease_timeout=lease_timeout, worker_id=name,
                    node="node", politeness=politeness)


def outgoing(front: Frontier, *urls: str) -> list[Outgoing]:
    out = []
    for url in urls:
        host = host_of(url)
        fp = filter_fingerprint(hashlib.sha1(url.encode()).digest(), host,
                                front.bloom.params.partition_by)
        out.append(Outgoing(fp, False, 0.0, json.dumps({"url": url}), host))
    return out


def home(host: str) -> int:
    return host_partition(host, PARTITIONS)


def lease(front: Frontier, host: str, want: int = 10) -> tuple[list[str], float | None]:
    """The URLs leased from ``host``'s partition, and when its next host is ready."""
    done = front.exchange((), {}, lease_from=home(host), want=want)
    return [json.loads(x.payload)["url"] for x in done.leases], done.ready_in


def ack(front: Frontier, leases: list[Any]) -> None:
    by: dict[int, list[str]] = {}
    for x in leases:
        by.setdefault(x.partition, []).append(x.token)
    front.exchange((), by)


def test_one_host_is_leased_once_per_delay_across_workers(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.3, concurrency=4)
    a, b = worker(redis_client, "a", polite), worker(redis_client, "b", polite)
    a.exchange(outgoing(a, *("http://x.test/%d" % i for i in range(3))), {})
    before = time.monotonic()
    first, _ = lease(a, "x.test")
    assert first == ["http://x.test/0"]  # one per delay, though 10 were asked and 4 may fly
    got, wait = lease(b, "x.test")
    # the delay less what passed between the two leases (at most the time they took)
    took = time.monotonic() - before
    assert got == [] and wait is not None and 0.3 - took - 0.01 < wait <= 0.3 * MARGIN
    time.sleep(wait + 0.01)
    got, _ = lease(b, "x.test")
    assert got == ["http://x.test/1"]


def test_concurrency_is_a_cluster_wide_cap(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.0, concurrency=2)
    a, b = worker(redis_client, "a", polite), worker(redis_client, "b", polite)
    a.exchange(outgoing(a, *("http://x.test/%d" % i for i in range(5))), {})
    held = a.exchange((), {}, lease_from=home("x.test"), want=10).leases
    assert len(held) == 2
    got, wait = lease(b, "x.test")
    assert got == [] and wait == BUSY_RETRY_S  # not waiting for a time: for a slot
    ack(a, held[:1])
    got, _ = lease(b, "x.test")
    assert got == ["http://x.test/2"]
    states = host_states(redis_client, a.keys, polite, ["x.test"])
    assert [(s.queued, s.in_flight, s.concurrency) for s in states] == [(2, 2, 2)]


def test_a_waiting_host_never_blocks_the_others(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=5.0, concurrency=1)
    a = worker(redis_client, "a", polite)
    # hosts that share a partition: the first one leased waits 5 s, the others go on
    hosts = [h for h in ("h%d.test" % i for i in range(40)) if home(h) == home("h0.test")][:4]
    a.exchange(outgoing(a, *("http://%s/%d" % (h, i) for h in hosts for i in range(3))), {})
    got = a.exchange((), {}, lease_from=home(hosts[0]), want=10).leases
    assert sorted(host_of(json.loads(x.payload)["url"]) for x in got) == sorted(hosts)
    again, wait = lease(a, hosts[0])
    assert again == [] and wait == BUSY_RETRY_S  # every host at its one slot
    ack(a, got)
    again, wait = lease(a, hosts[0])
    assert again == [] and wait is not None and 4.5 < wait <= 5.0 * MARGIN


def test_throttle_changes_a_host_live_and_clear_restores_it(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.0, concurrency=8)
    a = worker(redis_client, "a", polite)
    a.exchange(outgoing(a, *("http://x.test/%d" % i for i in range(6))), {})
    set_policy(redis_client, a.keys, polite, home("x.test"), "x.test", delay=1.0, concurrency=1)
    got, wait = lease(a, "x.test")
    assert len(got) == 1 and wait == BUSY_RETRY_S  # its one slot is taken
    [state] = host_states(redis_client, a.keys, polite, ["x.test"])
    assert (state.delay, state.concurrency) == (1.0, 1)
    set_policy(redis_client, a.keys, polite, home("x.test"), "x.test", clear=True)
    got, _ = lease(a, "x.test")
    assert len(got) == 5  # the other five at once: eight slots again, and no delay
    # a shorter delay counts from now, not from the longer one it replaces
    set_policy(redis_client, a.keys, polite, home("x.test"), "x.test", delay=30.0)
    a.exchange(outgoing(a, "http://x.test/6", "http://x.test/7"), {})
    assert lease(a, "x.test")[0] == ["http://x.test/6"]
    _, wait = lease(a, "x.test")
    assert wait is not None and 29 < wait <= 30 * MARGIN
    set_policy(redis_client, a.keys, polite, home("x.test"), "x.test", delay=0.1)
    _, wait = lease(a, "x.test")
    assert wait is not None and wait <= 0.1 * MARGIN


def test_setting_overrides_yield_to_the_operator(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.0, concurrency=8, slots=(("x.test", 2.0, 1),))
    a = worker(redis_client, "a", polite)
    a.apply_slots()
    [state] = host_states(redis_client, a.keys, polite, ["x.test"])
    assert (state.delay, state.concurrency) == (2.0, 1)
    set_policy(redis_client, a.keys, polite, home("x.test"), "x.test", delay=0.5)
    [state] = host_states(redis_client, a.keys, polite, ["x.test"])
    assert (state.delay, state.concurrency) == (0.5, 1)  # the operator's delay, the setting's cap


def test_429_holds_the_host_for_everyone_and_robots_and_latency_only_raise(
        redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.1, concurrency=4, autothrottle=(0.2, 3.0, 1.0))
    a, b = worker(redis_client, "a", polite), worker(redis_client, "b", polite)
    a.exchange(outgoing(a, *("http://x.test/%d" % i for i in range(4))), {})
    seen = Feedback()
    seen.backoff["x.test"] = 2.0
    a.exchange((), {}, feedback={home("x.test"): seen})
    got, wait = lease(b, "x.test")
    assert got == [] and wait is not None and 1.8 < wait <= 2.0
    seen = Feedback()
    seen.robots["x.test"] = 1.5
    a.exchange((), {}, feedback={home("x.test"): seen})
    [state] = host_states(redis_client, a.keys, polite, ["x.test"])
    assert state.delay == 1.5
    seen = Feedback()
    seen.robots["x.test"] = 0.0  # robots.txt without Crawl-delay clears it
    seen.latency += [("x.test", 0.8, True)] * 6  # AutoThrottle: towards latency / target
    a.exchange((), {}, feedback={home("x.test"): seen})
    [state] = host_states(redis_client, a.keys, polite, ["x.test"])
    assert 0.7 <= state.delay <= 0.8
    seen = Feedback()
    seen.latency += [("x.test", 0.01, False)] * 6  # errors never lower the delay
    a.exchange((), {}, feedback={home("x.test"): seen})
    [after] = host_states(redis_client, a.keys, polite, ["x.test"])
    assert after.delay == state.delay


def test_a_request_that_went_out_late_moves_its_hosts_next_lease(
        redis_client: redis.Redis) -> None:
    polite = Politeness(delay=1.0, concurrency=4)
    a, b = worker(redis_client, "a", polite), worker(redis_client, "b", polite)
    a.exchange(outgoing(a, "http://x.test/1", "http://x.test/2"), {})
    assert len(lease(a, "x.test")[0]) == 1
    time.sleep(0.5)
    seen = Feedback()
    seen.sent["x.test"] = time.monotonic()  # it left half a second after its lease
    a.exchange((), {}, feedback={home("x.test"): seen})
    _, wait = lease(b, "x.test")
    took = time.monotonic() - seen.sent["x.test"]
    # a second from when it left, less the time passed since; from its lease it would
    # be half a second less
    assert wait is not None and wait > 1.0 - took - 0.01, (wait, took)


def test_a_host_ready_within_the_horizon_is_leased_for_then(redis_client: redis.Redis) -> None:
    """Workers that learnt when a paced host is ready would each ask then, and all but
    one find nothing: with a horizon, the first to ask gets the request for that time.
    Only a host of one slot: its next lease waits for the ack and counts from the end it
    carries. A host of more slots could be leased again before a late send were told."""
    polite = Politeness(delay=0.3, concurrency=1)
    a, b, c = (worker(redis_client, name, polite) for name in "abc")
    a.exchange(outgoing(a, *("http://x.test/%d" % i for i in range(3))), {})
    [first] = a.exchange((), {}, lease_from=home("x.test"), want=1).leases
    answered = time.monotonic()
    a.exchange((), {home("x.test"): ["%s|%r" % (first.token, answered)]})
    [later] = b.exchange((), {}, lease_from=home("x.test"), want=5, horizon=0.5).leases
    took = time.monotonic() - answered
    assert json.loads(later.payload)["url"] == "http://x.test/1"  # one per delay, still
    # due a delay after the response, as the worker's clock has it once the reply came
    assert 0.3 - took - 0.01 < later.due - time.monotonic() <= 0.3 * MARGIN
    assert later.slack == math.inf  # one slot: its ack tells the host's next lease
    got, wait = lease(c, "x.test")  # its only slot is taken
    assert got == [] and wait == BUSY_RETRY_S
    # beyond the horizon, or a host of two slots: not leased for later
    d = worker(redis_client, "d", Politeness(delay=0.3, concurrency=2))
    d.exchange(outgoing(d, "http://y.test/1", "http://y.test/2"), {})
    assert len(d.exchange((), {}, lease_from=home("y.test"), want=1).leases) == 1
    assert d.exchange((), {}, lease_from=home("y.test"), want=5, horizon=0.5).leases == []
    b.exchange((), {home("x.test"): ["%s|%r" % (later.token, time.monotonic())]})
    assert b.exchange((), {}, lease_from=home("x.test"), want=5, horizon=0.2).leases == []


def test_renewing_a_lease_for_later_never_brings_its_deadline_forward(
        redis_client: redis.Redis) -> None:
    """A lease taken for a later time expires a lease timeout after that time; renewed
    before then (the worker renews what it holds), its deadline stays where it was."""
    polite = Politeness(delay=0.3, concurrency=1)
    a, b = worker(redis_client, "a", polite), worker(redis_client, "b", polite)
    a.exchange(outgoing(a, "http://x.test/1", "http://x.test/2"), {})
    [first] = a.exchange((), {}, lease_from=home("x.test"), want=1).leases
    a.exchange((), {home("x.test"): ["%s|%r" % (first.token, time.monotonic())]})
    [later] = b.exchange((), {}, lease_from=home("x.test"), want=1, horizon=0.5).leases
    assert later.due - time.monotonic() > 0.1  # leased for its time, ahead of it
    deadlines = b.keys.deadlines(home("x.test"))
    deadline = redis_client.zscore(deadlines, later.token)
    assert b.renew({later.token: home("x.test")}) == []
    assert redis_client.zscore(deadlines, later.token) == deadline


def test_a_lease_says_whether_its_host_has_a_delay(redis_client: redis.Redis) -> None:
    """A request of a host without a delay is not reported when it leaves late."""
    a = worker(redis_client, "a", Politeness(delay=0.0, concurrency=4))
    a.exchange(outgoing(a, "http://x.test/1"), {})
    [free] = a.exchange((), {}, lease_from=home("x.test"), want=1).leases
    b = worker(redis_client, "b", Politeness(delay=0.5, concurrency=4))
    b.exchange(outgoing(b, "http://y.test/1"), {})
    [paced] = b.exchange((), {}, lease_from=home("y.test"), want=1).leases
    assert (free.paced, paced.paced) == (False, True)
    assert [json.loads(x.payload)["url"] for x in (free, paced)] == ["http://x.test/1",
                                                                     "http://y.test/1"]
    # its delay, and its next lease a margin after (what lateness it absorbs unreported)
    assert (paced.delay, paced.room) == (0.5, math.floor(500 * MARGIN) / 1000)
    assert paced.slack == pytest.approx(0.025)
    # a host of one slot: its next lease waits for the ack, which says when it ended
    c = worker(redis_client, "c", Politeness(delay=0.5, concurrency=1))
    c.exchange(outgoing(c, "http://z.test/1"), {})
    [one] = c.exchange((), {}, lease_from=home("z.test"), want=1).leases
    assert (one.paced, one.delay, one.room, one.slack) == (True, 0.5, ONE_SLOT, math.inf)


def test_a_lease_ahead_comes_only_from_hosts_without_a_delay(redis_client: redis.Redis) -> None:
    """``ahead`` leases beyond ``want`` only from hosts without a delay, and at most half
    a host's free slots: the rest stay for the other workers."""
    polite = Politeness(delay=0.0, concurrency=8)
    a = worker(redis_client, "a", polite)
    shared = sorted(h for h in ("h%d.test" % i for i in range(60)) if home(h) == home("h0.test"))
    slow, fast, other, slow2 = shared[:4]
    for host in (slow, slow2):
        set_policy(redis_client, a.keys, polite, home(host), host, delay=5.0)
    a.exchange(outgoing(a, *("http://%s/%d" % (h, i) for h in shared[:4] for i in range(10))),
               {})
    got = a.exchange((), {}, lease_from=home(slow), want=1, ahead=20).leases
    hosts = [host_of(json.loads(x.payload)["url"]) for x in got]
    assert [x.paced for x in got].count(True) == 1 and hosts[0] == slow  # `want`: as before
    assert slow2 not in hosts  # a paced host gives nothing ahead
    assert len(got) > 1 and all(hosts.count(h) <= 4 for h in (fast, other))  # half of 8
    # alone in its partition, a host gives `want` and half its other free slots
    solo = next(h for h in ("s%d.test" % i for i in range(60)) if home(h) != home(slow))
    a.exchange(outgoing(a, *("http://%s/%d" % (solo, i) for i in range(10))), {})
    got = a.exchange((), {}, lease_from=home(solo), want=2, ahead=20).leases
    assert len(got) == 2 + 3  # 8 slots: 2 due, then half of the 6 left
    # no ahead asked: `want` is the most a lease gives
    assert len(a.exchange((), {}, lease_from=home(solo), want=1).leases) == 1


def test_a_lease_of_requests_ahead_only_comes_from_hosts_without_a_delay(
        redis_client: redis.Redis) -> None:
    """``want`` 0 with ``ahead`` (an exchange that goes anyway topping up the requests a
    worker holds): a paced host gives nothing, one without a delay at most half its
    free slots, down to the last request asked for: with one slot free, none."""
    polite = Politeness(delay=0.0, concurrency=8)
    a = worker(redis_client, "a", polite)
    fast = "f0.test"
    slow = next(h for h in ("s%d.test" % i for i in range(60)) if home(h) != home(fast))
    set_policy(redis_client, a.keys, polite, home(slow), slow, delay=5.0)
    a.exchange(outgoing(a, *("http://%s/%d" % (h, i) for h in (slow, fast) for i in range(10))),
               {})
    assert a.exchange((), {}, lease_from=home(slow), want=0, ahead=20).leases == []
    got = a.exchange((), {}, lease_from=home(fast), want=0, ahead=20).leases
    assert [host_of(json.loads(x.payload)["url"]) for x in got] == [fast] * 4  # half of 8
    # 4 free: 2 of 2 asked; 2 free: 1 of 1; 1 free: none of 1
    assert [len(a.exchange((), {}, lease_from=home(fast), want=0, ahead=n).leases)
            for n in (2, 1, 1)] == [2, 1, 0]
    # `want` is still given, from the paced host too
    [paced] = a.exchange((), {}, lease_from=home(slow), want=1, ahead=5).leases
    assert paced.paced and host_of(json.loads(paced.payload)["url"]) == slow


def test_a_worker_alone_in_the_crawl_leases_all_free_slots_ahead(
        redis_client: redis.Redis) -> None:
    """Each stats call tells a worker whether it is the only one alive (presence): alone,
    a lease ahead may take all of a host's free slots; while another worker is alive,
    half, as before; alone again once that one's presence ran out."""
    polite = Politeness(delay=0.0, concurrency=8)
    a = worker(redis_client, "a", polite)
    a.exchange(outgoing(a, *("http://x.test/%d" % i for i in range(40))), {},
               [(1, {"pages": 1})])
    assert not a.alone  # not recorded as alive yet: no worker is alone
    presence.here(a)
    a.exchange((), {}, [(2, {"pages": 1})])
    assert a.alone
    got = a.exchange((), {}, lease_from=home("x.test"), want=2, ahead=20).leases
    assert len(got) == 8  # 2 due, then all 6 free slots
    b = worker(redis_client, "b", polite, lease_timeout=0.3)
    presence.here(b)
    a.exchange((), {home("x.test"): [x.token for x in got]}, [(3, {"pages": 8})])
    assert not a.alone
    got = a.exchange((), {}, lease_from=home("x.test"), want=2, ahead=20).leases
    assert len(got) == 2 + 3  # 8 slots: 2 due, then half of the 6 left
    time.sleep(0.4)  # b's presence runs out (killed without a word)
    a.exchange((), {home("x.test"): [x.token for x in got]}, [(4, {"pages": 5})])
    assert a.alone
    assert len(a.exchange((), {}, lease_from=home("x.test"), want=2, ahead=20).leases) == 8


def test_one_slot_hosts_wait_from_the_response_of_their_last_request(
        redis_client: redis.Redis) -> None:
    polite = Politeness(delay=1.0, concurrency=1)
    a, b = worker(redis_client, "a", polite), worker(redis_client, "b", polite)
    a.exchange(outgoing(a, "http://x.test/1", "http://x.test/2"), {})
    [held] = a.exchange((), {}, lease_from=home("x.test"), want=1).leases
    time.sleep(0.6)  # the request left late: its response came 0.6 s after the lease
    answered = time.monotonic()
    a.exchange((), {home("x.test"): ["%s|%r" % (held.token, answered)]})
    _, wait = lease(b, "x.test")
    took = time.monotonic() - answered
    # a delay from the response, less the time passed since; from the lease it would
    # be 0.6 s less
    assert wait is not None and 1.0 - took - 0.01 < wait <= 1.0 * MARGIN, (wait, took)


def test_an_expired_lease_frees_its_hosts_slot(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.0, concurrency=1)
    dead = worker(redis_client, "dead", polite, lease_timeout=0.2)
    alive = worker(redis_client, "alive", polite)
    dead.exchange(outgoing(dead, "http://x.test/1", "http://x.test/2"), {})
    assert lease(dead, "x.test")[0] == ["http://x.test/1"]  # then the worker dies
    assert lease(alive, "x.test")[0] == []
    time.sleep(0.3)
    assert alive.reap() == 1
    assert sorted(lease(alive, "x.test", want=2)[0]) == ["http://x.test/1"]
    [state] = host_states(redis_client, alive.keys, polite, ["x.test"])
    assert (state.queued, state.in_flight) == (1, 1)


def test_a_deleted_ready_set_is_rebuilt_by_the_next_reaping(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.0, concurrency=2)
    a = worker(redis_client, "a", polite)
    a.exchange(outgoing(a, *("http://x.test/%d" % i for i in range(3))), {})
    redis_client.delete(a.keys.polite(home("x.test"), "ready"))
    assert lease(a, "x.test")[0] == []  # nothing is ready any more
    a.reap()
    assert len(lease(a, "x.test")[0]) == 2  # back, within its concurrency


def test_summary_counts_held_back_requests_and_the_busiest_hosts(
        redis_client: redis.Redis) -> None:
    polite = Politeness(delay=10.0, concurrency=1)
    a = worker(redis_client, "a", polite)
    urls = ["http://big.test/%d" % i for i in range(5)] + ["http://small.test/1"]
    a.exchange(outgoing(a, *urls), {})
    assert lease(a, "big.test", want=1)[0] == ["http://big.test/0"]  # first by name
    summary = politeness_summary(redis_client, a.keys, top_k=1)
    # big.test: 4 queued behind its one slot, held back; small.test: ready now
    assert (summary.hosts, summary.queued, summary.in_flight) == (2, 5, 1)
    assert summary.held_back == 4
    assert [(d.host, d.queued, d.in_flight) for d in summary.domains] == [("big.test", 4, 1)]


def test_queues_of_before_move_into_host_queues(redis_client: redis.Redis) -> None:
    polite = Politeness(delay=0.0, concurrency=8)
    a = worker(redis_client, "a", polite, lease_timeout=0.1, queue_type="priority")
    f = a.keys
    old = [json.dumps({"url": "http://old%d.test/" % i}) for i in range(6)]
    for i, payload in enumerate(old):
        redis_client.zadd(f.queue_part(i % PARTITIONS), {payload: -i})
    # a lease of before: "score|payload", never counted in flight
    redis_client.hset(f.leases(0), "w:0:1", "-9|" + json.dumps({"url": "http://OLD9.test:81/x"}))
    redis_client.zadd(f.deadlines(0), {"w:0:1": 0})
    assert a.migrate() == 6
    assert a.reap() == 1
    assert a.size() == 7
    summary = politeness_summary(redis_client, f, top_k=10)
    assert "old9.test" in {d.host for d in summary.domains}  # host as urlsplit gives it
    leased = [x for p in range(PARTITIONS)
              for x in a.exchange((), {}, lease_from=p, want=10).leases]
    assert sorted(json.loads(x.payload)["url"] for x in leased) == sorted(
        [json.loads(p)["url"] for p in old] + ["http://OLD9.test:81/x"])


def test_new_filters_partition_by_host_and_old_ones_keep_theirs(
        redis_client: redis.Redis) -> None:
    assert bloom(redis_client).params.partition_by == "host"
    redis_client.flushall()
    old = bloom(redis_client, partition_by="fingerprint")
    assert bloom(redis_client).params.partition_by == "fingerprint"  # adopted, not refused
    with pytest.raises(FilterMismatchError, match="partition_by"):
        bloom(redis_client, partition_by="host")
    assert old.params.partition_by == "fingerprint"
    # the host's requests share one partition on a host-partitioned filter
    fps = [filter_fingerprint(hashlib.sha1(b"%d" % i).digest(), "x.test", "host")
           for i in range(20)]
    assert {partition_of(fp, 16) for fp in fps} == {host_partition("x.test", 16)}
    with pytest.raises(SettingError, match="BLOOMFILTER_PARTITION_BY"):
        FilterConfig.from_settings(Settings({"BLOOMFILTER_PARTITION_BY": "url"}))


def test_politeness_comes_from_scrapys_settings() -> None:
    p = politeness_from_settings(Settings({
        "DOWNLOAD_DELAY": 0.25, "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "DOWNLOAD_SLOTS": {"Example.COM": {"delay": 3, "concurrency": 1}},
        "AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_MAX_DELAY": 9}))
    assert (p.delay, p.concurrency, p.jitter) == (0.25, 2, 0.0)
    assert p.slots == (("example.com", 3.0, 1),)
    assert p.autothrottle == (5.0, 9.0, 1.0)
    assert politeness_from_settings(Settings()).jitter == 0.5  # Scrapy's default: randomized

    class Spider:
        download_delay = 1.5
        max_concurrent_requests = 3

    p = politeness_from_settings(Settings({"DOWNLOAD_DELAY": 0.1}), Spider())
    assert (p.delay, p.concurrency) == (1.5, 3)
    for bad, name in (({"DOWNLOAD_DELAY": -1}, "DOWNLOAD_DELAY"),
                      ({"CONCURRENT_REQUESTS_PER_DOMAIN": 0}, "CONCURRENT_REQUESTS_PER_DOMAIN"),
                      ({"DOWNLOAD_SLOTS": {"a.test": {"delay": "soon"}}}, "DOWNLOAD_SLOTS"),
                      ({"DOWNLOAD_SLOTS": {"a.test": {"concurrency": 0}}}, "DOWNLOAD_SLOTS")):
        with pytest.raises(SettingError, match=name):
            politeness_from_settings(Settings(bad))


def test_which_download_slots_a_spider_named() -> None:
    """Only a slot that is no host's keeps its delay in the worker (named_slot)."""
    def request(url: str, **meta: Any) -> Request:
        return Request(url, meta=meta)

    assert named_slot(request("https://Shop.example/a")) is None  # before the downloader
    assert named_slot(request("https://Shop.example/a", download_slot="shop.example")) is None
    assert named_slot(request("https://shop.example/a", download_slot="shop-api")) == "shop-api"
    # a redirect keeps the slot Scrapy gave the URL it came from
    moved = request("https://cdn.example/a", download_slot="shop.example",
                    redirect_urls=["https://shop.example/a"])
    assert named_slot(moved) is None
    assert named_slot(request("https://cdn.example/a", download_slot="shop-api",
                              redirect_urls=["https://shop.example/a"])) == "shop-api"
    # CONCURRENT_REQUESTS_PER_IP: Scrapy's slots are addresses
    assert named_slot(request("https://shop.example/a", download_slot="127.0.0.1"),
                      per_ip=True) is None


class _Response:
    def __init__(self, value: str | None) -> None:
        self.headers = {b"Retry-After": value.encode()} if value is not None else {}


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after(_Response("7")) == 7.0
    assert retry_after(_Response(None)) == 5.0
    assert retry_after(_Response("soon")) == 5.0
    assert retry_after(_Response("99999999")) == 3600.0
    now = 1_700_000_000.0
    assert retry_after(_Response("Tue, 14 Nov 2023 22:13:40 GMT"), now=now) == 20.0
