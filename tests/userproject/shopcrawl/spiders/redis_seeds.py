"""A scrapy-redis spider as its users write them: its own list, its own entries.

``redis_key`` is not ``<name>:start_urls``, and ``make_request_from_data`` is
overridden, the way scrapy-redis's docs suggest: an entry is this project's own
JSON (``{"shop": URL, "category": NAME}``), or scrapy-redis's JSON
(``{"url": ..., "method": "POST", <form fields>}``), which the base class reads.
"""

from __future__ import annotations

import json
from typing import Any

from scrapy import Request
from scrapy_redis.spiders import RedisSpider


class RedisSeedsSpider(RedisSpider):
    name = "redis_seeds"
    redis_key = "shopcrawl:seeds"

    def make_request_from_data(self, data: bytes) -> Any:
        entry = json.loads(data)
        if "url" in entry:  # scrapy-redis's own format: the base class makes a FormRequest
            return super().make_request_from_data(data)
        # one entry, two requests: the category's first page and its second
        base = "%s/category/%s" % (entry["shop"], entry["category"])
        return [Request(base, callback=self.parse_category, cb_kwargs={"category":
                                                                           entry["category"]}),
                Request(base + "?page=2", callback=self.parse_category,
                        cb_kwargs={"category": entry["category"]})]

    def parse_category(self, response: Any, category: str) -> Any:
        yield {"category": category, "page": response.url.partition("?page=")[2] or "1",
               "products": len(response.css("a[href^=\"/product/\"]"))}

    def parse(self, response: Any) -> Any:
        """scrapy-redis's FormRequest has no callback: the search results land here."""
        yield {"posted": response.url, "results": len(response.css("a.result"))}
