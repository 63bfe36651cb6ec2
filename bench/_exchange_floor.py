"""The least Redis can spend on one page's exchange: its commands, with no Lua work.

``bench/scale.py`` prints it beside its 64-master estimate, ``bench/crawl.py``
beside its crawl's Redis CPU (that crawl's pages, in the crawl's shape). Each probe is a
script that only issues the commands a partition call cannot do without,
on keys laid out as a partition's, pipelined as the workers pipeline:

* a call that queues ``n`` new links of one host: ``TIME``; per link the
  block's ``GETRANGE`` and a one-byte ``SETRANGE``; one ``ZADD`` of all the
  payloads into the host's queue; the host's depth, the partition's count,
  its ready check and entry, the slice's two counters;
* a seen link: its block's ``GETRANGE``;
* a lease and the previous lease's ack: ``ZRANGEBYSCORE`` of the ready
  hosts, ``ZPOPMIN`` of the host's queue, the lease's hash field and
  deadline, the host's in-flight count and next time; then the same undone.

Redis CPU is ``used_cpu_sys + used_cpu_user`` (or the main thread's alone,
``main_thread``) over many pipelined calls, the least of :data:`ROUNDS`
turns. What the real scripts spend above these is Lua's own work (hashing,
lanes, the host bookkeeping's reads and branches): the probes give what no
Lua change can go below.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from _redis import cpu_sample

ROUNDS = 3
CALLS = 4000
PER_PIPELINE = 100
PAYLOAD = "x" * 450
BLOCK_BYTES = 256
#: links a call queues in the two enqueue probes: the slope is a new link's cost
FEW, MANY = 1, 10

_ENQUEUE = """
redis.call('TIME')
local n = tonumber(ARGV[1])
for i = 1, n do
  local off = tonumber(ARGV[1 + i])
  redis.call('GETRANGE', KEYS[1], off, off + 255)
  redis.call('SETRANGE', KEYS[1], off + 7, 'a')
end
redis.call('ZADD', KEYS[3], unpack(ARGV, n + 2, n + 1 + 2 * n))
redis.call('ZINCRBY', KEYS[4], n, 'host')
redis.call('INCRBY', KEYS[5], n)
if not redis.call('ZSCORE', KEYS[6], 'host') then redis.call('ZADD', KEYS[6], 0, 'host') end
redis.call('HINCRBY', KEYS[2], 'items:0', n)
redis.call('HINCRBY', KEYS[2], 'bits_set:0', n)
return n
"""

_SEEN = """
for i = 1, #ARGV do
  local off = tonumber(ARGV[i])
  redis.call('GETRANGE', KEYS[1], off, off + 255)
end
return #ARGV
"""

_LEASE_ACK = """
redis.call('TIME')
redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '+inf', 'LIMIT', 0, 1)
local got = redis.call('ZPOPMIN', KEYS[3], 1)
redis.call('HSET', KEYS[7], ARGV[1], got[1] or '')
redis.call('ZADD', KEYS[8], 1, ARGV[1])
redis.call('HINCRBY', KEYS[9], 'host', 1)
redis.call('ZADD', KEYS[10], 1, 'host')
redis.call('HDEL', KEYS[7], ARGV[1])
redis.call('ZREM', KEYS[8], ARGV[1])
redis.call('HINCRBY', KEYS[9], 'host', -1)
return 1
"""

KEYS = ["{floor}:s0:c0", "{floor}:state", "{floor}:q:host", "{floor}:depth", "{floor}:queued",
        "{floor}:ready", "{floor}:leases", "{floor}:deadlines", "{floor}:busy", "{floor}:next"]


@dataclass(frozen=True)
class ExchangeFloor:
    """Redis CPU, in us, of the probes (see the module doc)."""

    call_us: float  # a partition call's fixed part
    new_us: float  # one more new link in it
    seen_us: float  # one seen link
    lease_ack_us: float  # a lease and an ack, beyond a call's fixed part

    def page_us(self, calls: float, new: int, seen: int) -> float:
        """A page's exchange: ``calls`` partition calls, its links, a lease and an ack."""
        return calls * self.call_us + new * self.new_us + seen * self.seen_us + self.lease_ack_us


def measure_exchange_floor(client: redis.Redis, calls: int = CALLS,
                           main_thread: bool = False) -> ExchangeFloor:
    """The probes, ``calls`` calls each (a multiple of PER_PIPELINE), each best of
    :data:`ROUNDS`; ``main_thread``: the main thread's CPU (what ``bench/crawl.py``
    judges), not the whole process's."""
    calls = max(PER_PIPELINE, calls - calls % PER_PIPELINE)
    client.flushall()
    client.setrange(KEYS[0], 1 << 20, "\0")  # a 1 MiB chunk of blocks
    shas = {name: client.script_load(src) for name, src in (
        ("enqueue", _ENQUEUE), ("seen", _SEEN), ("lease", _LEASE_ACK))}
    counter = [0]

    def offsets(n: int) -> list[int]:
        counter[0] += n
        return [(counter[0] - i) * 7919 % 4096 * BLOCK_BYTES for i in range(n)]

    def enqueue(n: int) -> list[object]:
        pairs: list[object] = []
        for _ in range(n):
            counter[0] += 1
            pairs += [counter[0], "%d:%s" % (counter[0], PAYLOAD)]
        return [shas["enqueue"], len(KEYS), *KEYS, n, *offsets(n), *pairs]

    probes = {
        "few": lambda i: enqueue(FEW),
        "many": lambda i: enqueue(MANY),
        "seen": lambda i: [shas["seen"], 1, KEYS[0], *offsets(MANY)],
        "lease": lambda i: [shas["lease"], len(KEYS), *KEYS, "token-%d" % i],
        "empty": lambda i: [shas["seen"], 1, KEYS[0]],
    }
    def cpu() -> float:
        sample = cpu_sample(client)
        return sample.main_thread_s if main_thread else sample.process_s

    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for name, args in probes.items():
            before = cpu()
            for start in range(0, calls, PER_PIPELINE):
                pipe = client.pipeline(transaction=False)
                for i in range(start, start + PER_PIPELINE):
                    pipe.execute_command("EVALSHA", *args(i))
                pipe.execute()
            us = (cpu() - before) / calls * 1e6
            best[name] = min(us, best.get(name, us))
    client.flushall()
    new_us = (best["many"] - best["few"]) / (MANY - FEW)
    return ExchangeFloor(call_us=best["few"] - FEW * new_us, new_us=new_us,
                         seen_us=max(0.0, best["seen"] - best["empty"]) / MANY,
                         lease_ack_us=max(0.0, best["lease"] - best["empty"]))
