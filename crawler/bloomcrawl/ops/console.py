"""How the operations tooling talks to its user: lines on stdout, warnings on stderr.

Each line is flushed at once: ``make`` and the tests read the commands' output
as it comes. :class:`OpsError` is the failure a command reports in one line
(``bloomcrawl <command>: <message>``) and exits 1 for.
"""

from __future__ import annotations

import sys

from bloomcrawl.core.errors import BloomcrawlError


class OpsError(BloomcrawlError):
    """A failure an operations command reports in one line and exits 1 for."""


def say(message: str) -> None:
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
