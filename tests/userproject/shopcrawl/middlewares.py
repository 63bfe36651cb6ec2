"""A downloader middleware of the project's own."""

from __future__ import annotations

from typing import Any

import scrapy
from scrapy.exceptions import IgnoreRequest


class FirstPageMiddleware:
    """Answers a category's bare first page with a fresh request for ``?page=1``, the
    form the shop's own pager links to (a new Request, not a copy of the old one)."""

    def process_response(self, request: Any, response: Any, spider: Any = None) -> Any:
        if "/category/" in response.url and "?" not in response.url:
            return scrapy.Request(response.url + "?page=1", callback=request.callback)
        return response


class RejectReviewsMiddleware:
    """Rejects the reviews page of every fifth product once downloaded, as a middleware
    that screens responses does (IgnoreRequest from ``process_response``, which Scrapy's
    HttpCompressionMiddleware raises too, past DOWNLOAD_MAXSIZE)."""

    def process_response(self, request: Any, response: Any, spider: Any = None) -> Any:
        if response.url.endswith("/reviews") and int(response.url.split("/")[-2]) % 5 == 0:
            raise IgnoreRequest("reviews of %s withheld" % response.url)
        return response
