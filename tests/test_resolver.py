"""bloomcrawl.crawl.resolver.LocalhostResolver in a real Scrapy crawl process.

The hosts site (one 127.0.0.1 port, hosts told apart by ``Host``) serves
``a.localhost``, ``deep.b.localhost``, ``localhost`` and ``127.0.0.1``; a
``scrapy runspider`` process with the resolver fetches each, and one without
it shows why it is needed where the C library does not resolve ``*.localhost``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from twisted.internet import defer

from bloomcrawl.crawl.resolver import (
    LOOPBACK,
    LocalhostResolver,
    is_localhost,
    resolver_setting_name,
    resolver_settings,
)
from bloomcrawl.ops.hosts_site import HostSpec, RunningHostsSite

from kit import CRAWLER

HOSTS = ("a.localhost", "deep.b.localhost", "localhost", "127.0.0.1")

SPIDER = '''
import json
import scrapy


class ResolveSpider(scrapy.Spider):
    """GET each URL once; write {url: status or the failure's class name} to ``out``."""

    name = "resolve"

    def __init__(self, urls="", out="", **kwargs):
        super().__init__(**kwargs)
        self.urls = urls.split(",")
        self.out = out
        self.results = {}

    async def start(self):
        for url in self.urls:
            yield scrapy.Request(url, callback=self.ok, errback=self.failed,
                                 meta={"key": url}, dont_filter=True)

    def ok(self, response):
        self.results[response.meta["key"]] = response.status

    def failed(self, failure):
        self.results[failure.request.meta["key"]] = type(failure.value).__name__

    def closed(self, reason):
        with open(self.out, "w") as f:
            json.dump(self.results, f)
'''


@pytest.mark.parametrize("name, expected", [
    ("localhost", True), ("LocalHost", True), ("localhost.", True), ("a.localhost", True),
    ("h12.localhost", True), ("deep.b.localhost.", True), ("A.LOCALHOST", True),
    ("notlocalhost", False), ("localhost.example", False), ("a.localhost.example.com", False),
    ("127.0.0.1", False), ("example.com", False), ("", False),
])
def test_is_localhost(name: str, expected: bool) -> None:
    assert is_localhost(name) is expected


def test_localhost_names_resolve_without_a_lookup() -> None:
    # no reactor, no thread pool: the answer is there at once
    resolver = LocalhostResolver(reactor=None, cache_size=0, timeout=1.0)  # type: ignore[arg-type]
    results: list[str] = []
    for name in ("localhost", "a.localhost", "H3.Localhost."):
        d: defer.Deferred[str] = resolver.getHostByName(name)
        d.addCallback(results.append)
    assert results == [LOOPBACK] * 3


def test_resolver_setting_name_matches_installed_scrapy() -> None:
    from scrapy.settings import default_settings

    name = resolver_setting_name()
    assert hasattr(default_settings, name)
    assert resolver_settings() == {name: "bloomcrawl.crawl.resolver.LocalhostResolver"}


@pytest.fixture
def hosts_site() -> Iterator[RunningHostsSite]:
    with RunningHostsSite([HostSpec(name, pages=1) for name in HOSTS]).start() as site:
        yield site


def crawl(urls: list[str], tmp_path: Path, settings: dict[str, str]) -> tuple[dict[str, object],
                                                                              str]:
    """Run the spider in its own ``scrapy runspider`` process: (results, log)."""
    spider = tmp_path / "resolve_spider.py"
    spider.write_text(SPIDER)
    out = tmp_path / ("results-%d.json" % len(list(tmp_path.glob("results-*.json"))))
    cmd = [sys.executable, "-m", "scrapy", "runspider", str(spider),
           "-a", "urls=" + ",".join(urls), "-a", "out=%s" % out]
    for key, value in {"LOG_LEVEL": "INFO", "TELNETCONSOLE_ENABLED": "False",
                       "ROBOTSTXT_OBEY": "False", "RETRY_ENABLED": "False",
                       "HTTPERROR_ALLOW_ALL": "True",
                       "DNS_TIMEOUT": "5", **settings}.items():
        cmd += ["-s", "%s=%s" % (key, value)]
    env = dict(os.environ)
    env["HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = str(CRAWLER)
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    results: dict[str, object] = json.loads(out.read_text())
    return results, log


@pytest.mark.slow
def test_scrapy_fetches_localhost_names_through_the_resolver(hosts_site: RunningHostsSite,
                                                             tmp_path: Path) -> None:
    urls = [hosts_site.url(host) for host in HOSTS]
    urls.append(hosts_site.url("A.LOCALHOST", "/p/1"))  # no such page: a 404, but it got there
    results, log = crawl(urls, tmp_path, resolver_settings())
    assert results == {**{url: 200 for url in urls[:-1]}, urls[-1]: 404}, log[-3000:]
    arrived = {(a.host, a.path, a.status) for a in hosts_site.arrivals()}
    assert arrived == {*((host, "/", 200) for host in HOSTS), ("a.localhost", "/p/1", 404)}
    assert "deprecated" not in log  # the setting's name is the one this Scrapy reads


@pytest.mark.slow
def test_default_resolver_fails_where_the_c_library_does_not_know_localhost_names(
        hosts_site: RunningHostsSite, tmp_path: Path) -> None:
    try:
        socket.getaddrinfo("a.localhost", hosts_site.port)
    except socket.gaierror:
        pass
    else:
        pytest.skip("this machine's C library resolves *.localhost itself")
    urls = [hosts_site.url("a.localhost"), hosts_site.url("127.0.0.1")]
    results, log = crawl(urls, tmp_path, {})
    # DNSLookupError in Scrapy 2.13, CannotResolveHostError in 2.19
    assert results[urls[0]] in {"DNSLookupError", "CannotResolveHostError"}, log[-3000:]
    assert results[urls[1]] == 200, log[-3000:]
    assert {a.host for a in hosts_site.arrivals()} == {"127.0.0.1"}
