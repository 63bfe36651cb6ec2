"""The project's items: a Scrapy Item filled over two pages, and dataclasses."""

from __future__ import annotations

import dataclasses
import datetime

import scrapy


class ProductItem(scrapy.Item):
    url = scrapy.Field()
    name = scrapy.Field()
    price = scrapy.Field()
    currency = scrapy.Field()
    category = scrapy.Field()
    reviews = scrapy.Field()
    seen_at = scrapy.Field()
    spider = scrapy.Field()
    enriched = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class Listing:
    """Where a product was found: passed along in meta."""

    category: str
    page: int
    found_at: datetime.datetime


@dataclasses.dataclass
class Search:
    """What a search asked, given as the form's comma-separated value: its __post_init__
    splits it, so it cannot be built again from what it holds (a list)."""

    terms: list[str]

    def __post_init__(self) -> None:
        self.terms = [t.strip() for t in self.terms.split(",")]  # type: ignore[attr-defined]
