"""``@shop_url /path``: a contract URL on the shop the test serves (SHOP_URL)."""

from __future__ import annotations

import os
from typing import Any

from scrapy.contracts import Contract


class ShopUrlContract(Contract):
    name = "shop_url"

    def adjust_request_args(self, args: dict[str, Any]) -> dict[str, Any]:
        base = os.environ.get("SHOP_URL", "http://127.0.0.1:8000").rstrip("/")
        args["url"] = base + self.args[0]
        return args
