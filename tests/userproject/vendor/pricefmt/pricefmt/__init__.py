"""Parses prices such as "EUR 12.50" into (currency, Decimal)."""

from __future__ import annotations

from decimal import Decimal

__version__ = "1.0.0"


def parse_price(text: str) -> tuple[str, Decimal]:
    currency, _, amount = text.strip().partition(" ")
    return currency, Decimal(amount)
