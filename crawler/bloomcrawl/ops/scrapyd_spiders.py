"""Which deployed projects have which spiders, asked of the scrapyd nodes
(``listprojects.json``, then ``listspiders.json`` for each project at once)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from bloomcrawl.ops.scrapyd import MAX_PARALLEL, Node, ScrapydError


def projects_with_spider(nodes: Sequence[Node], spider: str
                         ) -> tuple[list[str], dict[str, list[str]]] | None:
    """The projects deployed on the first node that answers, and {project: its spiders}
    for those with ``spider`` (``scrapy list`` runs on the node for each, at once; a
    single project is not asked); None when no node answers."""
    for node in nodes:
        try:
            projects = node.list_projects()
        except ScrapydError:
            continue
        if len(projects) <= 1:
            return projects, {}
        listed = _spiders_of(node, projects)
        return projects, {name: names for name, names in listed.items() if spider in names}
    return None


def deployed_spiders(nodes: Sequence[Node]) -> dict[str, list[str]] | None:
    """{project: its spiders} on the first node that answers (``scrapy list`` runs on the
    node for each project, at once); None when no node answers."""
    for node in nodes:
        try:
            projects = node.list_projects()
        except ScrapydError:
            continue
        return _spiders_of(node, projects) if projects else {}
    return None


def _spiders_of(node: Node, projects: Sequence[str]) -> dict[str, list[str]]:
    """{project: its spiders on ``node``}, asked at once (none for a project that fails)."""
    def spiders(name: str) -> list[str]:
        try:
            return node.list_spiders(name)
        except ScrapydError:
            return []

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(projects)),
                            thread_name_prefix="scrapyd") as pool:
        return dict(zip(projects, pool.map(spiders, projects), strict=True))
