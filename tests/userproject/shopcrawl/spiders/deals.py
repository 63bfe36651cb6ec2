"""A plain Spider with start_urls, a FormRequest, and one request the frontier cannot share."""

from __future__ import annotations

import threading
from typing import Any

import scrapy

from shopcrawl.items import Search


class DealsSpider(scrapy.Spider):
    name = "deals"

    def __init__(self, shop_url: str = "http://127.0.0.1:8000", *args: Any,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        base = shop_url.rstrip("/")
        self.start_urls = [base + "/search", base + "/category/books"]

    def parse(self, response: Any) -> Any:
        """Start pages: the search form, or a category listing.

        @shop_url /search
        @returns requests 1
        """
        if response.css("form#search"):
            for category in response.css("option::attr(value)").getall():
                # a dataclass that cannot be built again from what it holds: these
                # requests stay with the worker that made them too
                yield scrapy.FormRequest.from_response(
                    response, formid="search", formdata={"q": category},
                    callback=self.parse_results, cb_kwargs={"category": category},
                    meta={"search": Search(category)})
        else:
            # a lock is no data: this request stays with the worker that made it
            yield response.follow("/deals", callback=self.parse_deals,
                                  meta={"lock": threading.Lock()})

    def parse_results(self, response: Any, category: str) -> Any:
        """@shop_url /search?q=books
        @cb_kwargs {"category": "books"}
        @returns items 1
        """
        search = response.meta.get("search")
        yield {"search": category,
               "results": len(response.css("a.result::attr(href)").getall()),
               "asked": search.terms if isinstance(search, Search) else None}

    def parse_deals(self, response: Any) -> Any:
        yield {"deals": response.css("li.deal::text").getall(),
               "locked": isinstance(response.meta.get("lock"), type(threading.Lock()))}
