"""The package's three layers import only downward: core <- crawl <- ops.

core is the library (no Scrapy), crawl is what a worker runs, ops never
ships in a worker's egg. No module imports another module's private names,
and none (nor any class) grows past the size of one job.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kit import CRAWLER

PACKAGE = CRAWLER / "bloomcrawl"
#: what each layer may not import
FORBIDDEN = {
    "core": ("scrapy", "twisted", "bloomcrawl.crawl", "bloomcrawl.ops"),
    "crawl": ("bloomcrawl.ops",),
    "ops": (),
}
#: a module or class longer than this holds more than one job: split it along a seam
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for every import in a file, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
                module = ".".join(parts[: len(parts) - node.level] + ((module,) if module else ()))
            found.append((module, [alias.name for alias in node.names]))
    return found


def modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_downward(layer: str) -> None:
    assert modules(layer), "no modules found in %s" % layer
    wrong = [
        "%s imports %s" % (path.relative_to(PACKAGE), module)
        for path in modules(layer)
        for module, _ in imports(path)
        for banned in FORBIDDEN[layer]
        if module == banned or module.startswith(banned + ".")
    ]
    assert wrong == []


def test_no_module_imports_private_names_of_another() -> None:
    wrong = [
        "%s imports %s from %s" % (path.relative_to(PACKAGE), name, module)
        for path in sorted(PACKAGE.rglob("*.py"))
        for module, names in imports(path)
        if module.startswith("bloomcrawl")
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert wrong == []


def test_no_module_or_class_outgrows_one_job() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(PACKAGE)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append("%s: %d lines (at most %d)" % (name, lines, MAX_MODULE_LINES))
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    too_long.append("%s: class %s: %d lines (at most %d)" % (
                        name, node.name, size, MAX_CLASS_LINES))
    assert not too_long, "split along a seam:\n" + "\n".join(too_long)
