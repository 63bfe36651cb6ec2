"""``worker-host``: this host's scrapyd nodes join a cluster whose Redis is elsewhere
(:mod:`bloomcrawl.ops.cluster.worker_host`)."""

from __future__ import annotations

import argparse
import os

from bloomcrawl.ops.cluster.envfile import read_env_file
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.cluster.worker_host import WorkerHost


def cmd_worker_host(args: argparse.Namespace, paths: Paths) -> int:
    redis_url = args.redis_url or os.environ.get("REDIS_URL", "")
    return WorkerHost(paths, read_env_file(paths.env_file)).up(redis_url, args.node_url,
                                                               args.workers)
