"""How the benchmarks print: one line at a time, tables, and the cells in them.

Benchmarks run as scripts (``python bench/dedup.py``), so this module is
imported as ``_report`` from the script's own directory. What a number means
(microseconds, a ratio, a size) is formatted by the benchmark that measured
it; the helpers here are the ones every benchmark writes the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def emit(line: str = "") -> None:
    """One line on stdout, flushed: a long run shows its progress as it goes."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """Columns padded to their widest cell; the first ``left`` columns left-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(widths[i]) if i < left else cell.rjust(widths[i])
                         for i, cell in enumerate(cells)).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def fmt(value: float | None, spec: str = ".2f") -> str:
    """``value`` formatted by ``spec``, or "n/a" when it was not measured."""
    return "n/a" if value is None else format(value, spec)


def verdict(ok: bool | None) -> str:
    """A target met (PASS), missed (MISS) or not measured (n/a)."""
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def ratio(value: float | None, by: float | None) -> float | None:
    """``value / by``, or None when either is unknown or ``by`` is 0."""
    return None if value is None or not by else value / by
