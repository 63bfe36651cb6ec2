"""Scrapy's tool commands (``scrapy shell``, ``parse``, ``fetch``, ``check``) in a project
whose SCHEDULER is bloomcrawl's.

Such a command tries a spider out rather than crawls: it must not take the
cluster's work or mark its URLs seen. It gets Scrapy's own in-memory
scheduler, with no duplicate filter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: scrapy.commands.<name> replaces the spider's start for these
TOOL_COMMANDS = frozenset({"parse", "fetch", "check", "view", "shell", "bench"})


def tool_command(crawler: Crawler) -> str | None:
    """The Scrapy command trying this crawler's spider out, if any (None: a crawl).

    ``scrapy parse``, ``fetch`` and ``check`` replace the spider class's
    ``start`` with one of their own; ``scrapy shell`` is found later, when
    the engine opens the scheduler
    (:meth:`~bloomcrawl.crawl.engine.EngineInterface.opened_by_shell`).
    """
    spidercls = getattr(crawler, "spidercls", None)
    module = getattr(getattr(spidercls, "start", None), "__module__", "") or ""
    if module.startswith("scrapy.commands."):
        name = module.rpartition(".")[2]
        return name if name in TOOL_COMMANDS else None
    return None


def local_scheduler(crawler: Crawler) -> Any:
    """Scrapy's own in-memory scheduler, with no duplicate filter."""
    from scrapy.core.scheduler import Scheduler as ScrapyScheduler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.utils.misc import load_object

    settings = crawler.settings
    return ScrapyScheduler(
        BaseDupeFilter(), jobdir=None,
        mqclass=load_object(settings["SCHEDULER_MEMORY_QUEUE"]),
        dqclass=load_object(settings["SCHEDULER_DISK_QUEUE"]),
        pqclass=load_object(settings["SCHEDULER_PRIORITY_QUEUE"]),
        stats=crawler.stats, crawler=crawler)
