"""The exporter's command line: flags over environment over defaults.

Every flag of ``bloomcrawl-exporter`` can also be set from the environment
(``REDIS_URL``, ``SCRAPYD_NODES``, ``SCRAPYD_SERVICE``, ``SCRAPYD_USERNAME``,
``SCRAPYD_PASSWORD``, ``BLOOMCRAWL_EXPORTER_PORT``, ...; see ``--help``); a
value that does not parse exits with status 2, as a wrong flag does.
:mod:`bloomcrawl.ops.exporter` runs what it parsed.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from bloomcrawl.core import defaults
from bloomcrawl.ops import inspection, scrapyd
from bloomcrawl.ops.console import OpsError

DEFAULT_PORT = 9410
DEFAULT_BIND = "127.0.0.1"
DEFAULT_REDIS_TIMEOUT = 2.0
DEFAULT_TOP_DOMAINS = inspection.TOP_DOMAINS


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def parse_args(
    argv: Sequence[str] | None = None,
) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Flags over environment over defaults; errors exit with status 2."""
    parser = argparse.ArgumentParser(
        prog="bloomcrawl-exporter",
        description="Prometheus exporter for a bloomcrawl cluster: Bloom filters, queues,"
        " leases and crawl stats from Redis, and the scrapyd nodes' jobs.",
        epilog="Each flag defaults to the environment variable named in its help.",
    )

    def env_float(name: str, default: float) -> float:
        raw = _env(name)
        try:
            return float(raw) if raw is not None else default
        except ValueError:
            parser.error(f"{name}={raw!r} is not a number")

    def env_int(name: str, default: int) -> int:
        raw = _env(name)
        try:
            return int(raw) if raw is not None else default
        except ValueError:
            parser.error(f"{name}={raw!r} is not an integer")

    parser.add_argument("--redis-url", default=_env("REDIS_URL", defaults.REDIS_URL),
                        help="Redis holding the frontier (REDIS_URL; default %(default)s)")
    parser.add_argument("--port", type=int,
                        default=env_int("BLOOMCRAWL_EXPORTER_PORT", DEFAULT_PORT),
                        help="port to serve /metrics on (BLOOMCRAWL_EXPORTER_PORT;"
                        " default %(default)s)")
    parser.add_argument("--bind", default=_env("BLOOMCRAWL_EXPORTER_BIND", DEFAULT_BIND),
                        help="address to listen on; 0.0.0.0 in a container"
                        " (BLOOMCRAWL_EXPORTER_BIND; default %(default)s)")
    parser.add_argument("--scrapyd-nodes", default=_env("SCRAPYD_NODES", ""),
                        help="comma-separated scrapyd URLs, e.g. http://127.0.0.1:6800"
                        " (SCRAPYD_NODES)")
    parser.add_argument("--scrapyd-service", default=_env("SCRAPYD_SERVICE"),
                        help="DNS name whose every address is a scrapyd node, e.g. the"
                        " compose service 'worker' (SCRAPYD_SERVICE)")
    parser.add_argument("--scrapyd-port", type=int,
                        default=env_int("SCRAPYD_HTTP_PORT", scrapyd.DEFAULT_PORT),
                        help="scrapyd port on the addresses of --scrapyd-service"
                        " (SCRAPYD_HTTP_PORT; default %(default)s)")
    parser.add_argument("--scrapyd-username", default=_env("SCRAPYD_USERNAME"),
                        help="scrapyd basic-auth user (SCRAPYD_USERNAME)")
    parser.add_argument("--scrapyd-password", default=_env("SCRAPYD_PASSWORD"),
                        help="scrapyd basic-auth password; prefer the environment"
                        " (SCRAPYD_PASSWORD)")
    parser.add_argument("--scrapyd-timeout", type=float,
                        default=env_float("BLOOMCRAWL_SCRAPYD_TIMEOUT",
                                          scrapyd.STATUS_TIMEOUT),
                        help="seconds to wait for a node (BLOOMCRAWL_SCRAPYD_TIMEOUT;"
                        " default %(default)s)")
    parser.add_argument("--redis-timeout", type=float,
                        default=env_float("BLOOMCRAWL_REDIS_TIMEOUT", DEFAULT_REDIS_TIMEOUT),
                        help="seconds to wait for Redis (BLOOMCRAWL_REDIS_TIMEOUT;"
                        " default %(default)s)")
    parser.add_argument("--top-domains", type=int,
                        default=env_int("BLOOMCRAWL_TOP_DOMAINS", DEFAULT_TOP_DOMAINS),
                        help="hosts per spider whose queue, delay and concurrency are"
                        " reported, the busiest first; bounds the domain labels"
                        " (BLOOMCRAWL_TOP_DOMAINS; default %(default)s)")
    parser.add_argument("--log-level", default=_env("BLOOMCRAWL_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="(BLOOMCRAWL_LOG_LEVEL; default %(default)s)")
    parser.add_argument("--once", action="store_true",
                        help="write the metrics to standard output once and exit")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    if not 0 < args.scrapyd_port < 65536:
        parser.error(f"--scrapyd-port must be in 1..65535, got {args.scrapyd_port}")
    if args.scrapyd_timeout <= 0 or args.redis_timeout <= 0:
        parser.error("timeouts must be > 0")
    if args.top_domains < 0:
        parser.error(f"--top-domains must be >= 0, got {args.top_domains}")
    args.scrapyd_nodes = [u.strip() for u in args.scrapyd_nodes.split(",") if u.strip()]
    for url in args.scrapyd_nodes:
        try:
            scrapyd.check_node_url(url)
        except OpsError as exc:
            parser.error(str(exc))
    return parser, args
