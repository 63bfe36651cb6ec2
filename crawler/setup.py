"""The Scrapy project as scrapyd-deploy packages it (an egg for scrapyd).

scrapyd-client builds eggs from a ``setup.py`` next to ``scrapy.cfg``; the
``scrapy`` entry point tells scrapyd which settings module the project uses.
The library itself is installed from ``pyproject.toml`` at the repository root.

The egg holds what a worker runs: the library (``bloomcrawl.core``) and the
Scrapy integration (``bloomcrawl.crawl``); the operations tooling
(``bloomcrawl.ops``: CLI, exporter, demo site) never ships in it.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
VERSION = re.search(
    r'^__version__ = "([^"]+)"', (HERE / "bloomcrawl" / "__init__.py").read_text(), re.M
).group(1)

setup(
    name="bloomcrawl",
    version=VERSION,
    packages=find_packages(include=["bloomcrawl", "bloomcrawl.core", "bloomcrawl.core.*",
                                    "bloomcrawl.crawl", "bloomcrawl.crawl.*"]),
    package_data={"bloomcrawl": ["py.typed"], "bloomcrawl.core": ["lua/*.lua"]},
    entry_points={"scrapy": ["settings = bloomcrawl.crawl.settings"]},
    zip_safe=True,
)
