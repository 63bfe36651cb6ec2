"""Two versions of the bitmap filter's add script, timed call by call on one Redis.

On a shared 2-core VM the same script's Redis time moves 10-30 % between runs a
minute apart: more than most changes to a script take back. This bench sends
each call to one version's filter and then the same call to the other's, the
order alternating, on one redis-server, and times each by Redis's own SLOWLOG
(the command's duration): both versions see the machine at the same moment.
SLOWLOG keeps the calls slower than a threshold, and the commands a script runs
are calls too: the threshold (``--threshold``, 20 us) keeps a script's calls of
many fingerprints and leaves out its own GETRANGEs and SETRANGEs, whose logging
would add to the script's time; a call it missed is an error, never a gap.
It also checks that both versions answer every call alike (a change to how a
script works must not change what it decides).

    python bench/script_ab.py --old HEAD~1                 # against the working tree
    python bench/script_ab.py --old v1.4 --new HEAD --error-rate 1e-3

A version is a git revision (its ``bloom_common.lua`` and ``bloom_add.lua``) or
``tree``, the working tree's. The filters are made by the working tree's
Python, so the versions must share the filter's stored layout. Printed:
each version's us a fingerprint, new (every call adds) and seen (the same
fingerprints again), as the median and least of the rounds, and the median
of the rounds' ratios new version / old.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "crawler"), str(ROOT / "tests")]

import redis  # noqa: E402

from bloomcrawl.core import keys  # noqa: E402
from bloomcrawl.core.bloom import BloomFilter  # noqa: E402
from bloomcrawl.core.scripts import BACKEND_PRELUDES, Script  # noqa: E402

from kit.redis import RedisServer  # noqa: E402

LUA = "crawler/bloomcrawl/core/lua/"
SCRIPT = (BACKEND_PRELUDES["bitmap"], "bloom_add.lua")
PHASES = ("new", "seen")


def source(version: str) -> str:
    """The bitmap add script as the product joins it (``tree``: the one it runs)."""
    if version == "tree":
        return Script.for_backend("bitmap", "bloom_add.lua").source
    try:
        return "\n".join(subprocess.run(
            ["git", "-C", str(ROOT), "show", "%s:%s%s" % (version, LUA, name)],
            check=True, capture_output=True, text=True).stdout for name in SCRIPT)
    except (subprocess.CalledProcessError, OSError) as exc:
        why = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else exc
        raise SystemExit("script_ab: no %s at git revision %r: %s"
                         % (" and ".join(SCRIPT), version, why)) from exc


def slowlog_us(log: list[dict], sha: str, calls: int) -> int:
    """The summed duration of the ``calls`` logged EVALSHA calls of ``sha``."""
    mark = sha.encode()
    durations = [int(e["duration"]) for e in log
                 if e["command"].split(b" ", 2)[1:2] == [mark]]
    if len(durations) != calls:
        raise SystemExit("script_ab: SLOWLOG holds %d of the %d calls of a version: a call"
                         " took less than --threshold; send more fingerprints a call"
                         " (--batch)" % (len(durations), calls))
    return sum(durations)


def run(client: redis.Redis, versions: dict[str, str], args: argparse.Namespace
        ) -> dict[str, dict[str, list[float]]]:
    """us a fingerprint of each version, each phase, each round."""
    shas = {name: client.script_load(text) for name, text in versions.items()}
    fps = [hashlib.sha1(b"ab-%d" % i).digest() for i in range(args.items + 1)]
    out: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PHASES} for v in versions}
    names = list(versions)
    for _ in range(args.rounds):
        client.flushall()
        states = {}
        for i, name in enumerate(names):
            key = "ab%d:bloomfilter" % i
            BloomFilter(client, key, error_rate=args.error_rate, partitions=1,
                        initial_capacity=args.initial_capacity)
            states[name] = keys.state_key(key, 0)
            client.evalsha(shas[name], 1, states[name], fps[0])
        for phase in PHASES:
            client.slowlog_reset()
            for number, start in enumerate(range(1, args.items + 1, args.batch)):
                blob = b"".join(fps[start:start + args.batch])
                order = names if number % 2 == 0 else names[::-1]
                replies = {name: client.evalsha(shas[name], 1, states[name], blob)
                           for name in order}
                if len(set(replies.values())) > 1:
                    raise SystemExit("script_ab: the versions answered a call differently"
                                     " (%s call %d): %r" % (phase, number, replies))
            log = client.slowlog_get(-1)
            for name in names:
                out[name][phase].append(
                    slowlog_us(log, shas[name], number + 1) / args.items)
    return out


def report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    old, new = list(results)
    print("bloom_add.lua, old %s against new %s: %d fingerprints in calls of %d, error rate"
          " %g, first slice %s, %d rounds; us a fingerprint (SLOWLOG, call by call, the"
          " order alternating); both answered every call alike" % (
              args.old, args.new, args.items, args.batch, args.error_rate,
              args.initial_capacity or "the default", args.rounds))
    print("%-6s %-22s %-22s %s" % ("phase", "old: median (least)", "new: median (least)",
                                   "new / old, median of the rounds"))
    for phase in PHASES:
        a, b = results[old][phase], results[new][phase]
        ratios = [y / x for x, y in zip(a, b, strict=True) if x > 0]
        print("%-6s %-22s %-22s %.3f" % (
            phase, "%.2f (%.2f)" % (statistics.median(a), min(a)),
            "%.2f (%.2f)" % (statistics.median(b), min(b)),
            statistics.median(ratios) if ratios else float("nan")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="HEAD", help="git revision or 'tree' (default HEAD)")
    parser.add_argument("--new", default="tree", help="git revision or 'tree' (default)")
    parser.add_argument("--items", type=int, default=3000, help="fingerprints a round")
    parser.add_argument("--batch", type=int, default=40, help="fingerprints a call")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--error-rate", type=float, default=1e-6,
                        help="the filter's (default 1e-6, bench/crawl.py's)")
    parser.add_argument("--initial-capacity", type=int, default=None,
                        help="BLOOMFILTER_INITIAL_CAPACITY (default: the project's)")
    parser.add_argument("--threshold", type=int, default=20,
                        help="slowlog-log-slower-than, us (default 20)")
    args = parser.parse_args(argv)
    if min(args.items, args.batch, args.rounds) < 1:
        parser.error("--items, --batch and --rounds must be at least 1")
    versions = {"old": source(args.old), "new": source(args.new)}
    if versions["old"] == versions["new"]:  # two SHAs, so SLOWLOG tells the calls apart
        versions["new"] += "\n-- the same script, loaded again under another SHA"
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.config_set("slowlog-log-slower-than", args.threshold)
        client.config_set("slowlog-max-len", args.items * 4 + 1000)
        report(run(client, versions, args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
