"""Commands on a Docker Swarm stack: where they run.

A stack publishes nothing (docker-compose.swarm.yml), so the commands that
talk to the cluster's Redis or scrapyd nodes run, on a recorded stack, in a
container on its network (:meth:`~bloomcrawl.ops.cluster.swarm.Swarm.run_inside`):
the same command line, acting there on ``redis:6379`` and every address of
``worker``. ``up``, ``down``, ``scale``, ``logs`` and ``demo``'s start run on the
manager itself (:mod:`~bloomcrawl.ops.cli.cluster`, :mod:`~bloomcrawl.ops.cli.demo`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from bloomcrawl.ops import scrapyd
from bloomcrawl.ops.cli.status import table
from bloomcrawl.ops.cluster.state import Paths, load_cluster
from bloomcrawl.ops.cluster.swarm import IN_STACK_ENV, WORKER_SERVICE, Swarm
from bloomcrawl.ops.console import say

#: the commands that talk to the cluster's Redis or scrapyd nodes: on a Swarm stack they
#: run in a container on the stack's network (:func:`run_in_stack`)
IN_STACK_COMMANDS = frozenset({"nodes", "deploy", "schedule", "seed", "crawl", "clear",
                               "status", "filter-info", "throttle", "schedules", "runs"})
#: options that point a command at a cluster by address: it then runs where it was started
TARGET_OPTIONS = ("nodes", "scrapyd_service", "redis_url")


def in_stack(args: argparse.Namespace, paths: Paths) -> bool:
    """Whether the command is to run on the recorded Swarm stack's network: it talks to
    the cluster, is not already running there, and was given no cluster by address."""
    if args.command not in IN_STACK_COMMANDS or os.environ.get(IN_STACK_ENV):
        return False
    if any(getattr(args, name, None) for name in TARGET_OPTIONS):
        return False
    if os.environ.get("REDIS_URL") or os.environ.get("SCRAPYD_NODES"):
        return False
    cluster = load_cluster(paths)
    return cluster is not None and cluster.mode == "swarm"


def run_in_stack(args: argparse.Namespace, paths: Paths, argv: Sequence[str]) -> int:
    """The command ``argv`` in a container on the stack's network; ``status`` first lists
    each worker replica with its node and address."""
    swarm = Swarm(paths)
    if args.command == "status":
        rows = [[t.name, t.node, t.state, "http://%s:%d" % (t.address, scrapyd.DEFAULT_PORT)]
                for t in swarm.tasks(WORKER_SERVICE, running_only=False)]
        say(f"stack {swarm.stack} (Docker Swarm): worker replicas")
        say(table([["replica", "node", "state", "scrapyd"], *rows]))
    mounts = [Path(p) for p in (getattr(args, "project_dir", None),) if p]
    egg = getattr(args, "egg", None)
    if egg:
        mounts.append(Path(egg).resolve().parent)
    return swarm.run_inside(argv, mounts=mounts)
