"""bloomcrawl.ops.demo_site over real HTTP on 127.0.0.1, checked with Scrapy's own link extraction
and request fingerprinter."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit
from urllib.robotparser import RobotFileParser

import pytest
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.utils.test import get_crawler
from w3lib.url import canonicalize_url

from bloomcrawl.ops.cluster.processes import free_port
from bloomcrawl.ops.demo_site import (
    DEFAULT_LINKS_PER_PAGE,
    DemoSite,
    RunningSite,
    main,
    page_id,
    page_path,
    page_title,
    page_url,
    serve_in_thread,
)

from kit import CRAWLER
from kit.wait import wait_until
from kit.web import fetch


def fetch_json(url: str, method: str = "GET") -> dict[str, Any]:
    status, body, _ = fetch(url, method=method)
    assert status == 200
    result: dict[str, Any] = json.loads(body)
    return result


def fingerprinter() -> Any:
    return get_crawler().request_fingerprinter


def html_response(url: str, **kwargs: Any) -> HtmlResponse:
    status, body, headers = fetch(url, **kwargs)
    assert status == 200, url
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    return HtmlResponse(url, body=body, headers=headers)


def test_page_helpers_agree_with_canonicalize_url() -> None:
    base = "http://127.0.0.1:8000"
    assert page_url(0, base) == base + "/"
    assert page_url(12, base + "/") == base + "/page/12?cat=12&lang=en&sort=desc"
    for page in [0, 1, 2, 3, 16, 17, 999, 123_456]:
        url = page_url(page, base)
        assert canonicalize_url(url) == url
        assert page_id(url) == page
        assert page_id(page_path(page)) == page
    assert page_id("http://h:1") == 0
    assert page_id("/page/12#x") == 12
    for not_a_page in ["/page/", "/page/0", "/page/012", "/page/1/", "/robots.txt", "/x"]:
        assert page_id(not_a_page) is None


def test_site_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="pages"):
        DemoSite(0)
    with pytest.raises(ValueError, match="links_per_page"):
        DemoSite(10, links_per_page=-1)
    with pytest.raises(IndexError):
        DemoSite(10).links(10)
    with pytest.raises(SystemExit) as excinfo:
        main(["--pages", "0"])
    assert excinfo.value.code == 2


def test_pages_depend_only_on_pages_links_and_seed() -> None:
    host = "127.0.0.1:8000"
    with serve_in_thread(pages=300, seed=3) as first, serve_in_thread(pages=300, seed=3) as second:
        assert first.port != second.port
        for page in [0, 1, 150, 299]:
            a = fetch(first.page_url(page), host=host)[1]
            b = fetch(second.page_url(page), host=host)[1]
            assert a == b
            assert a == DemoSite(300, seed=3).body(page, host)
    other_seed = DemoSite(300, seed=4)
    assert [other_seed.links(p) for p in range(20)] != [DemoSite(300, seed=3).links(p)
                                                       for p in range(20)]


def test_pages_have_titles_and_many_links(demo_site: RunningSite) -> None:
    for page in [0, 1, demo_site.site.pages - 1]:
        response = html_response(demo_site.page_url(page))
        assert response.css("title::text").get() == page_title(page)
        hrefs = response.xpath("//a/@href").getall()
        assert len(hrefs) == DEFAULT_LINKS_PER_PAGE
        assert hrefs == demo_site.site.links(page, f"127.0.0.1:{demo_site.port}")


def test_every_spelling_of_a_link_has_its_page_fingerprint(demo_site: RunningSite) -> None:
    """Every href on a sample of pages: Scrapy's fingerprint equals the target page's."""
    fp = fingerprinter()
    site = demo_site.site
    last = demo_site.site.pages - 1
    sample = [0, 1, 2, last, *random.Random(5).sample(range(3, last), 60)]
    spellings: dict[bytes, set[str]] = {}
    styles: set[str] = set()
    for page in sample:
        response = html_response(demo_site.page_url(page))
        hrefs = response.xpath("//a/@href").getall()
        targets = set()
        for href in hrefs:
            url = response.urljoin(href)
            target = page_id(url)
            assert target is not None and 0 <= target < site.pages, href
            targets.add(target)
            assert canonicalize_url(url) == demo_site.page_url(target), href
            fingerprint = fp.fingerprint(Request(url))
            assert fingerprint == fp.fingerprint(Request(demo_site.page_url(target))), href
            spellings.setdefault(fingerprint, set()).add(href)
            styles.add(spelling_style(href))
        assert targets == site.targets(page)
    assert styles == {"absolute", "scheme-relative", "root", "fragment", "relative", "dot-relative"}
    # the same page written differently, often: the duplicate filter has real work
    assert sum(len(v) > 1 for v in spellings.values()) > 100
    assert max(len(v) for v in spellings.values()) >= 5


def spelling_style(href: str) -> str:
    if href.startswith("http://"):
        return "absolute"
    if href.startswith("//"):
        return "scheme-relative"
    if "#" in href:
        return "fragment"
    if href.startswith("/"):
        return "root"
    if href.startswith("."):
        return "dot-relative"
    return "relative"


def test_query_parameters_come_in_every_order(demo_site: RunningSite) -> None:
    orders = set()
    for page in range(1, 40):
        for href in demo_site.site.links(page):
            query = urlsplit(href).query
            if query:
                orders.add(tuple(pair.split("=")[0] for pair in query.split("&")))
    assert len(orders) == 6  # all permutations of cat, lang, sort


def test_absolute_links_use_the_request_host(demo_site: RunningSite) -> None:
    host = f"localhost:{demo_site.port}"
    _, body, _ = fetch(demo_site.url, host=host)
    response = HtmlResponse(f"http://{host}/", body=body)
    absolute = [h for h in response.xpath("//a/@href").getall() if "//" in h]
    assert absolute
    assert all(urlsplit(h).netloc == host for h in absolute)
    # markup in a Host header is escaped, never injected
    _, body, _ = fetch(demo_site.url, host='evil"><script>')
    assert b"<script>" not in body
    assert b"evil&quot;&gt;&lt;script&gt;" in body


def test_every_page_is_reachable_from_home_and_fetched_once(demo_site: RunningSite) -> None:
    """Breadth-first crawl over HTTP with Scrapy's LinkExtractor, deduplicated by fingerprint."""
    fp = fingerprinter()
    extractor = LinkExtractor()
    seen = {fp.fingerprint(Request(demo_site.url))}
    queue = deque([(demo_site.url, 0)])
    crawled: list[int] = []
    links_found = 0
    max_depth = 0
    while queue and len(crawled) <= demo_site.site.pages:
        url, depth = queue.popleft()
        response = html_response(url)
        target = page_id(url)
        assert target is not None
        crawled.append(target)
        max_depth = max(max_depth, depth)
        for link in extractor.extract_links(response):
            links_found += 1
            fingerprint = fp.fingerprint(Request(link.url))
            if fingerprint not in seen:
                seen.add(fingerprint)
                queue.append((link.url, depth + 1))
    assert sorted(crawled) == list(range(demo_site.site.pages))
    assert max_depth <= 11  # binary-tree links: depth about log2(pages)
    assert links_found > 10 * len(crawled)  # after LinkExtractor's own exact-URL dedup
    stats = fetch_json(demo_site.base + "/__stats")
    assert stats["total"] == stats["distinct"] == stats["pages"] == demo_site.site.pages
    assert stats["duplicates"] == stats["missing"] == stats["not_found"] == 0
    assert demo_site.hits() == [1] * demo_site.site.pages


@pytest.mark.parametrize("demo_site", [{"pages": 50}], indirect=True)
def test_stats_count_gets_and_reset_zeroes_them(demo_site: RunningSite) -> None:
    assert demo_site.site.pages == 50
    fetch(demo_site.url)
    fetch(demo_site.url + "#ignored-by-http")
    fetch(demo_site.page_url(7))
    fetch(demo_site.base + "/page/7")  # the query string does not change the page
    fetch(demo_site.base + "/page/9?lang=xx")
    fetch(demo_site.page_url(9), method="HEAD")  # not a GET: not counted
    for path in ["/page/0", "/page/50", "/page/007", "/page/x", "/page/%D9%A3", "/missing"]:
        assert fetch(demo_site.base + path)[0] == 404
    stats = fetch_json(demo_site.base + "/__stats")
    assert stats == {
        "pages": 50, "links_per_page": DEFAULT_LINKS_PER_PAGE, "seed": 0,
        "total": 5, "distinct": 3, "duplicates": 2, "missing": 47,
        "not_found": 6, "robots": 0, "hits": {"0": 2, "7": 2, "9": 1},
    }
    assert demo_site.stats() == stats
    assert demo_site.hits()[:10] == [2, 0, 0, 0, 0, 0, 0, 2, 0, 1]
    assert fetch_json(demo_site.base + "/__reset", method="POST") == {"reset": True}
    assert fetch_json(demo_site.base + "/__stats")["total"] == 0
    fetch(demo_site.page_url(3))
    demo_site.reset()
    assert demo_site.hits() == [0] * 50
    assert demo_site.page_urls() == [demo_site.page_url(i) for i in range(50)]


def test_robots_txt_allows_everything(demo_site: RunningSite) -> None:
    status, body, _ = fetch(demo_site.base + "/robots.txt")
    assert status == 200
    robots = RobotFileParser()
    robots.parse(body.decode().splitlines())
    assert robots.can_fetch("Scrapy", demo_site.page_url(5))
    assert robots.can_fetch("*", demo_site.url)
    assert demo_site.stats()["robots"] == 1
    assert demo_site.stats()["total"] == 0


@pytest.mark.parametrize("demo_site", [{"pages": 20, "delay_ms": 150}], indirect=True)
def test_delay_ms_delays_each_response(demo_site: RunningSite) -> None:
    for url in [demo_site.url, demo_site.page_url(3), demo_site.base + "/robots.txt"]:
        started = time.monotonic()
        assert fetch(url)[0] == 200
        assert time.monotonic() - started >= 0.150


def test_a_taken_port_is_reported(demo_site: RunningSite) -> None:
    with pytest.raises(RuntimeError, match="could not listen"):
        serve_in_thread(pages=10, port=demo_site.port)


def wait_until_serving(base: str, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The site's /__stats, once it answers (the process must not exit first)."""

    def stats() -> dict[str, Any] | None:
        try:
            return fetch_json(base + "/__stats")
        except OSError:
            assert proc.poll() is None, "the site exited"
            return None

    return wait_until(stats, 30, what=f"{base} serving")


def start_cli(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(CRAWLER), **(extra_env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "bloomcrawl.ops.demo_site", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def stop_cli(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=5)
    return proc.returncode, stderr.decode(errors="replace")


def test_cli_serves_the_same_site_and_stops_on_sigterm() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_cli(["--port", str(port), "--pages", "300", "--seed", "3", "--delay-ms", "100"])
    try:
        stats = wait_until_serving(base, proc)
        assert (stats["pages"], stats["seed"]) == (300, 3)
        assert stats["links_per_page"] == DEFAULT_LINKS_PER_PAGE
        started = time.monotonic()
        status, body, _ = fetch(page_url(42, base), host="127.0.0.1:8000")
        assert time.monotonic() - started >= 0.100
        assert status == 200
        # another process, another hash seed: the same bytes
        assert body == DemoSite(300, seed=3).body(42, "127.0.0.1:8000")
        assert fetch_json(base + "/__stats")["hits"] == {"42": 1}
    finally:
        returncode, stderr = stop_cli(proc)
    assert returncode == 0, stderr
    assert f"on http://127.0.0.1:{port}/" in stderr
    assert "stopped" in stderr


def test_cli_reads_environment_overrides() -> None:
    port = free_port()
    proc = start_cli([], {"DEMO_PORT": str(port), "DEMO_PAGES": "25", "DEMO_LINKS_PER_PAGE": "4"})
    try:
        stats = wait_until_serving(f"http://127.0.0.1:{port}", proc)
        assert (stats["pages"], stats["links_per_page"]) == (25, 4)
        _, body, _ = fetch(f"http://127.0.0.1:{port}/")
        assert body.count(b"<a href=") == 4
    finally:
        returncode, stderr = stop_cli(proc)
    assert returncode == 0, stderr
