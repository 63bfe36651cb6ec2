"""The Redis Cluster fixtures themselves: real topology, real failover, real slot migration.

The cluster tests of the product build on these; if one fails here, a
failure there says nothing about the product.
"""

from __future__ import annotations

import threading
import time

import pytest
from redis.exceptions import MovedError

from kit.cluster import SLOTS, RedisClusterProcesses


def test_three_masters_each_with_a_replica(clean_cluster: RedisClusterProcesses) -> None:
    cluster = clean_cluster
    masters = cluster.masters()
    assert len(masters) == 3
    replicas = [cluster.replica_of(m) for m in masters]
    assert sorted(masters + replicas) == sorted(cluster.ports)
    for master, replica in zip(masters, replicas, strict=True):
        info = cluster.node_client(replica).info("replication")
        assert (info["role"], info["master_port"]) == ("slave", master)
        assert info["master_link_status"] == "up"
        assert cluster.slot_count(master) > 0
    assert sum(cluster.slot_count(m) for m in masters) == SLOTS
    first = cluster.ports[:3]
    assert cluster.startup_url == "redis+cluster://" + ",".join("127.0.0.1:%d" % p for p in first)


def test_keys_written_through_the_cluster_client_are_readable(
        clean_cluster: RedisClusterProcesses) -> None:
    client = clean_cluster.cluster_client()
    for i in range(60):
        client.set("key:%d" % i, i)
    assert [int(client.get("key:%d" % i)) for i in range(60)] == list(range(60))
    # the keys really are spread over the masters, and a node not owning a slot redirects
    masters = clean_cluster.masters()
    assert all(clean_cluster.node_client(m).dbsize() > 0 for m in masters)
    owner = clean_cluster.owner_of_slot(clean_cluster.slot_of("key:0"))
    assert clean_cluster.node_client(owner).get("key:0") == b"0"
    other = next(m for m in masters if m != owner)
    with pytest.raises(MovedError) as moved:
        clean_cluster.node_client(other).get("key:0")
    assert moved.value.node_addr == ("127.0.0.1", owner)
    client.close()


def test_flushall_empties_masters_replicas_and_scripts(
        clean_cluster: RedisClusterProcesses) -> None:
    client = clean_cluster.cluster_client()
    for i in range(30):
        client.set("doomed:%d" % i, i)
    sha = clean_cluster.node_client(clean_cluster.masters()[0]).script_load("return 1")
    clean_cluster.flushall()
    assert [clean_cluster.node_client(p).dbsize() for p in clean_cluster.ports] == [0] * 6
    assert clean_cluster.node_client(clean_cluster.masters()[0]).script_exists(sha) == [False]
    client.close()


def test_kill_master_promotes_its_replica_and_keeps_the_key(
        private_cluster: RedisClusterProcesses) -> None:
    cluster = private_cluster
    client = cluster.cluster_client()
    client.set("survivor", "still here")
    owner = cluster.owner_of_slot(cluster.slot_of("survivor"))
    replica = cluster.replica_of(owner)
    # the replica has acknowledged the write before its master dies
    assert cluster.node_client(owner).execute_command("WAIT", 1, 1000) == 1

    started = time.monotonic()
    promoted = cluster.kill_master(owner)
    assert time.monotonic() - started < 15
    assert promoted == replica
    assert owner not in cluster.masters() and promoted in cluster.masters()
    assert cluster.owner_of_slot(cluster.slot_of("survivor")) == promoted
    fresh = cluster.cluster_client()
    assert fresh.get("survivor") == b"still here"

    cluster.ensure_healthy()  # restarts the dead node: it rejoins as the new master's replica
    assert cluster.running(owner)
    assert cluster.replica_of(promoted) == owner
    assert cluster.node_client(owner).info("replication")["master_port"] == promoted
    fresh.close()
    client.close()


def test_manual_failover_swaps_master_and_replica(clean_cluster: RedisClusterProcesses) -> None:
    cluster = clean_cluster
    master = cluster.masters()[0]
    replica = cluster.replica_of(master)
    client = cluster.cluster_client()
    key = next("k%d" % i for i in range(10_000)
               if cluster.owner_of_slot(cluster.slot_of("k%d" % i)) == master)
    client.set(key, "v")
    assert cluster.failover(replica) == master
    assert cluster.replica_of(replica) == master
    assert cluster.owner_of_slot(cluster.slot_of(key)) == replica
    assert client.get(key) == b"v"
    client.close()


def test_migrate_slot_of_key_moves_its_keys_while_clients_keep_working(
        private_cluster: RedisClusterProcesses) -> None:
    cluster = private_cluster
    client = cluster.cluster_client()
    keys = ["{account}:%d" % i for i in range(500)]  # one slot, several MIGRATE batches
    for key in keys:
        client.set(key, key)
    slot = cluster.slot_of(keys[0])
    source = cluster.owner_of_slot(slot)
    target = next(m for m in cluster.masters() if m != source)

    done = threading.Event()
    errors: list[BaseException] = []
    increments = [0]

    def keep_writing() -> None:
        writer = cluster.cluster_client()
        try:
            while not done.is_set():
                writer.incr("{account}:counter")
                increments[0] += 1
                assert writer.get(keys[increments[0] % len(keys)]) is not None
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            writer.close()

    thread = threading.Thread(target=keep_writing, daemon=True)
    thread.start()
    try:
        assert cluster.migrate_slot_of_key(keys[0], target) == slot
    finally:
        done.set()
        thread.join(10)
    assert errors == []
    assert increments[0] > 0
    assert cluster.owner_of_slot(slot) == target
    # the keys are on the target node itself now, none left on the source
    assert cluster.node_client(target).execute_command(
        "CLUSTER", "COUNTKEYSINSLOT", slot) == len(keys) + 1
    assert cluster.node_client(source).execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert [v.decode() for v in client.mget(keys)] == keys
    assert int(client.get("{account}:counter")) == increments[0]
    client.close()


def test_migrate_slots_reshards_with_the_keys(private_cluster: RedisClusterProcesses) -> None:
    cluster = private_cluster
    client = cluster.cluster_client()
    for i in range(300):
        client.set("r:%d" % i, i)
    source, target = cluster.masters()[:2]
    before = cluster.slot_count(source), cluster.slot_count(target)
    moved_keys = [k for k in ("r:%d" % i for i in range(300))
                  if cluster.owner_of_slot(cluster.slot_of(k)) == source]
    cluster.migrate_slots(200, source, target)
    assert (cluster.slot_count(source), cluster.slot_count(target)) == (
        before[0] - 200, before[1] + 200)
    now_on_target = [k for k in moved_keys if cluster.owner_of_slot(cluster.slot_of(k)) == target]
    assert now_on_target, "no key was in the 200 slots moved"
    assert all(cluster.node_client(target).exists(k) for k in now_on_target)
    assert [int(client.get("r:%d" % i)) for i in range(300)] == list(range(300))
    client.close()
