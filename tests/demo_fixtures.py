"""The ``demo_site`` fixture: a fresh demo website per test, on a free 127.0.0.1 port.

Imported by conftest.py. Change the site's parameters with indirect
parametrization::

    @pytest.mark.parametrize("demo_site", [{"pages": 500, "delay_ms": 50}], indirect=True)
    def test_slow_site(demo_site: RunningSite) -> None: ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bloomcrawl.ops.demo_site import RunningSite, serve_in_thread

DEMO_SITE_PAGES = 2000


@pytest.fixture
def demo_site(request: pytest.FixtureRequest) -> Iterator[RunningSite]:
    """A 2,000-page demo site served from a thread; ``.hits()`` counts this test's GETs."""
    options: dict[str, Any] = {"pages": DEMO_SITE_PAGES, **getattr(request, "param", {})}
    with serve_in_thread(**options) as site:
        yield site
