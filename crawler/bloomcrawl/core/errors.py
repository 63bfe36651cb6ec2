"""Every error bloomcrawl raises on purpose; each message names what is wrong."""

from __future__ import annotations


class BloomcrawlError(Exception):
    """Base class of bloomcrawl's own errors."""


class SettingError(BloomcrawlError, ValueError):
    """A setting has a value bloomcrawl cannot use; the message names it."""


class BloomFilterError(BloomcrawlError):
    """A Bloom filter cannot be opened or used."""


class InvalidFilterParameters(BloomFilterError, ValueError):
    """A filter parameter is out of range; raised before Redis is touched."""


class UnknownWindow(BloomFilterError, ValueError):
    """A request or spider names a revisit window the filter does not have."""


class FilterMismatchError(BloomFilterError):
    """The filter stored in Redis was created with other parameters."""


class FilterFullError(BloomFilterError):
    """The filter's last slice is full: it refuses new items instead of calling them seen."""


class RedisUnavailableError(BloomFilterError, ConnectionError):
    """Redis could not be reached; the message names the server (never its password)."""
