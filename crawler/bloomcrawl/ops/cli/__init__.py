"""The ``bloomcrawl`` command: run a cluster, ship the project to it, crawl, watch.

One module per job; each command is a thin ``cmd_*`` over plain functions
that other commands call too (``demo`` is ``up``, ``deploy``, ``schedule``,
``seed`` and ``watch`` in a row):

* :mod:`~bloomcrawl.ops.cli.cluster`: ``up``, ``down``, ``scale``, ``logs``, ``nodes``
* :mod:`~bloomcrawl.ops.cli.jobs`: ``deploy``, ``schedule``, ``seed``, ``crawl``, ``clear``
* :mod:`~bloomcrawl.ops.cli.recurring`: ``schedule --every/--cron``, ``schedules``,
  ``runs``, ``timer``
* :mod:`~bloomcrawl.ops.cli.status`: ``status``, ``filter-info``, a crawl's progress
* :mod:`~bloomcrawl.ops.cli.demo`: ``demo``
* :mod:`~bloomcrawl.ops.cli.stack`: which commands run on a Swarm stack's network
* :mod:`~bloomcrawl.ops.cli.parser`: the command line;
  :mod:`~bloomcrawl.ops.cli.target`: where the cluster a command acts on is

The cluster itself (``.env``, its recorded state, docker-compose, local
processes) is :mod:`bloomcrawl.ops.cluster`; scrapyd is reached through
:mod:`bloomcrawl.ops.scrapyd`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import redis

from bloomcrawl.core.connection import INSECURE_ENV
from bloomcrawl.core.errors import BloomcrawlError
from bloomcrawl.ops.cli.parser import build_parser
from bloomcrawl.ops.cli.stack import in_stack, run_in_stack
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.console import warn

__all__ = ["build_parser", "main"]


def failure_line(exc: BaseException) -> str:
    """What a command that failed says (after ``bloomcrawl <command>: ``), never a traceback.

    Our own errors (:class:`~bloomcrawl.ops.console.OpsError`, Redis out of
    reach, a bad setting) say what they could not do and name the server;
    an error redis-py raised where no call of ours named the server still
    names it as redis-py does.
    """
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return f"cannot reach Redis: {exc}"
    if isinstance(exc, redis.RedisError):
        return f"Redis refused a command: {exc}"
    if isinstance(exc, redis.exceptions.RedisClusterException):  # not a RedisError
        return f"Redis Cluster: {exc}"
    return str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    paths = Paths.from_environment()
    if args.insecure:
        # for this command and every process it starts (the workers' jobs)
        os.environ[INSECURE_ENV] = "1"
    try:
        if in_stack(args, paths):
            # a Swarm stack publishes nothing: the command runs on its network
            return run_in_stack(args, paths, argv)
        return int(args.func(args, paths))
    except (BloomcrawlError, redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        warn(f"bloomcrawl {args.command}: {failure_line(exc)}")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``bloomcrawl status | head``): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
