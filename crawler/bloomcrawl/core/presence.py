"""Which workers of a spider's frontier are alive (``{<spider>:stats}:workers``).

A worker says it is alive when it opens and each time it renews its leases, for one
lease time; it says it is gone when it closes. A worker killed without a word counts
until its lease time runs out, as its leases do. What flushes a crawl
(``SCHEDULER_PERSIST = False``, ``SCHEDULER_FLUSH_ON_START``) asks first, so that no
worker deletes a crawl another is still running, with or without leases at that moment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bloomcrawl.core.scripts import Script, ScriptCall

if TYPE_CHECKING:
    from bloomcrawl.core.frontier import Frontier

_WORKERS = Script("frontier_workers.lua")


def here(frontier: Frontier) -> None:
    """Record ``frontier``'s worker as alive for one lease time."""
    frontier.bloom.run_scripts([ScriptCall(_WORKERS, [frontier.keys.workers],
                                           ["here", frontier.worker_id, frontier.lease_ms])])


def gone(frontier: Frontier) -> int:
    """Forget ``frontier``'s worker (closing, or not recorded yet); returns how many other
    workers are alive: those that said so within their lease time and did not close since."""
    return int(frontier.bloom.run_scripts([ScriptCall(_WORKERS, [frontier.keys.workers],
                                                      ["gone", frontier.worker_id])])[0])
