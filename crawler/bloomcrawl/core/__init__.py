"""The library: Bloom filter, frontier protocol, keys, defaults, errors. No Scrapy import."""
