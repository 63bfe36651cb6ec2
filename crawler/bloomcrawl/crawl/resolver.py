"""DNS_RESOLVER = "bloomcrawl.crawl.resolver.LocalhostResolver": ``*.localhost`` is loopback.

RFC 6761 (6.3) reserves ``localhost`` and every name under it for the
loopback interface, and browsers resolve them so without asking DNS. The C
library's ``getaddrinfo`` usually knows ``localhost`` only (from
``/etc/hosts``), so ``http://h7.localhost:8000/`` fails with Scrapy's default
resolver. :class:`LocalhostResolver` answers ``127.0.0.1`` for those names
and hands every other name to Scrapy's own
:class:`~scrapy.resolver.CachingThreadedResolver` (its cache, its
DNS_TIMEOUT). It lets one server on 127.0.0.1 stand for many hosts (one
downloader slot, one politeness budget each), which is what the politeness
tests and ``bench/politeness.py`` crawl.

Scrapy 2.14 renamed the setting to ``TWISTED_DNS_RESOLVER`` (``DNS_RESOLVER``
still works there, with a deprecation warning); :func:`resolver_settings`
gives the name the installed Scrapy reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from scrapy.resolver import CachingThreadedResolver
from scrapy.settings import default_settings
from twisted.internet import defer
from twisted.internet.interfaces import IResolverSimple
from zope.interface import implementer

if TYPE_CHECKING:
    from collections.abc import Sequence

LOOPBACK: Final = "127.0.0.1"
#: the value of the resolver setting
RESOLVER_PATH: Final = "bloomcrawl.crawl.resolver.LocalhostResolver"


def is_localhost(name: str) -> bool:
    """Whether ``name`` is ``localhost`` or a name under it (case and a final dot ignored)."""
    name = name.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def resolver_setting_name() -> str:
    """``TWISTED_DNS_RESOLVER`` where the installed Scrapy has it (2.14+), else ``DNS_RESOLVER``."""
    return ("TWISTED_DNS_RESOLVER" if hasattr(default_settings, "TWISTED_DNS_RESOLVER")
            else "DNS_RESOLVER")


def resolver_settings() -> dict[str, str]:
    """The one setting that installs :class:`LocalhostResolver` in the installed Scrapy."""
    return {resolver_setting_name(): RESOLVER_PATH}


@implementer(IResolverSimple)
class LocalhostResolver(CachingThreadedResolver):
    """Scrapy's default resolver, except that ``localhost`` and ``*.localhost`` are 127.0.0.1.

    IPv4 only, like the resolver it extends; built by Scrapy through the
    inherited ``from_crawler`` (DNSCACHE_ENABLED, DNSCACHE_SIZE, DNS_TIMEOUT).
    """

    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> defer.Deferred[str]:
        if is_localhost(name):
            return defer.succeed(LOOPBACK)
        return super().getHostByName(name, timeout)
