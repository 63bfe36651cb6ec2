"""Issue 20's crawl targets over interleaved rounds (``bench/crawl.py --repeat N``).

On the shared 2-core VMs these benchmarks run on, one crawl's ratio to the
in-memory scheduler moves by 5-20 % from one run to the next, as much as
the targets ask for. A round runs every contender, 1 process and then 2,
with the contenders in the opposite order from the round before, so that a
slow minute of the machine falls on both sides of the ratios. The
verdicts go by the median of the rounds, printed with their range; each
round's ratios are its own runs' (its own ceiling), never mixed across
rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from _crawl import BLOOMCRAWL, MEMORY, CrawlRun, run_of
from _report import fmt, ratio, table, verdict


@dataclass(frozen=True)
class Round:
    """One round's ratios: bloomcrawl beside the in-memory scheduler of the same round."""

    #: the in-memory scheduler's one-process pages/s: the ceiling
    ceiling: float | None
    #: bloomcrawl's pages/s per process over the ceiling, with 1 and with 2 processes
    rate_1: float | None
    rate_2: float | None
    #: bloomcrawl's worker CPU per page over the in-memory one-process run's
    cpu_1: float | None
    cpu_2: float | None
    #: Redis main-thread CPU per page, us
    redis_1: float | None
    redis_2: float | None
    #: two separate in-memory crawls side by side: what 2 processes of any scheduler
    #: reach here (per process over the ceiling), and their CPU per page over one's
    separate_rate: float | None
    separate_cpu: float | None
    #: every bloomcrawl run of the round fetched every page exactly once
    once: bool


def round_of(runs: Sequence[CrawlRun]) -> Round:
    """The ratios of one round's runs."""
    memory = run_of(runs, MEMORY)
    separate = run_of(runs, MEMORY, 2)  # its 2-process run is two separate crawls
    mine = {w: run_of(runs, BLOOMCRAWL, w) for w in (1, 2)}
    ceiling = memory.pages_per_second if memory is not None else None
    memory_cpu = memory.per_page(memory.worker_cpu_s) if memory is not None else None

    def rate(run: CrawlRun | None) -> float | None:
        return ratio(run.pages_per_second / run.workers, ceiling) if run else None

    def cpu(run: CrawlRun | None) -> float | None:
        return ratio(run.per_page(run.worker_cpu_s), memory_cpu) if run else None

    def redis_us(run: CrawlRun | None) -> float | None:
        return run.per_page(run.redis_cpu_s) * 1e6 if run else None

    return Round(ceiling, rate(mine[1]), rate(mine[2]), cpu(mine[1]), cpu(mine[2]),
                 redis_us(mine[1]), redis_us(mine[2]), rate(separate), cpu(separate),
                 all(r is not None and r.missing == 0 and r.duplicates == 0
                     for r in mine.values()))


def spread(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(median, lowest, highest) of the measured values; None when there are none."""
    got = [v for v in values if v is not None]
    if not got:
        return None
    return statistics.median(got), min(got), max(got)


def _cell(s: tuple[float, float, float] | None, spec: str) -> str:
    """A :func:`spread` as "median (lowest-highest)"."""
    if s is None:
        return "n/a"
    return "%s (%s-%s)" % tuple(format(v, spec) for v in s)


def report(rounds: Sequence[Round], *, rate_target: float, cpu_target: float,
           redis_target_us: float) -> list[str]:
    """The rounds side by side, then each target against the rounds' median."""
    header = ["round", "ceiling pages/s", "pages/s x ceiling 1 / 2 proc",
              "worker CPU x in-memory 1 / 2", "Redis us/page 1 / 2",
              "2 separate in-memory: pages/s, CPU", "once"]
    rows = [[str(i + 1), fmt(r.ceiling, ".1f"),
             "%s / %s" % (fmt(r.rate_1), fmt(r.rate_2)),
             "%s / %s" % (fmt(r.cpu_1), fmt(r.cpu_2)),
             "%s / %s" % (fmt(r.redis_1, ".0f"), fmt(r.redis_2, ".0f")),
             "%s, %s" % (fmt(r.separate_rate), fmt(r.separate_cpu)),
             "yes" if r.once else "NO"] for i, r in enumerate(rounds)]
    lines = ["issue 20's crawl targets over %d rounds (each round's ratios to its own"
             " in-memory run; contenders in turn first and last): median (lowest-highest)"
             % len(rounds), *table(header, rows)]

    def target(name: str, pick: Callable[[Round], float | None], spec: str, goal: float,
               higher: bool, floor: Callable[[Round], float | None] | None = None) -> None:
        def meets(value: float) -> bool:
            return value >= goal if higher else value <= goal

        values = [pick(r) for r in rounds]
        s = spread(values)
        line = "  %-46s %-22s %s %s: %s" % (name, _cell(s, spec),
                                            ">=" if higher else "<=", format(goal, spec),
                                            verdict(None if s is None else meets(s[0])))
        if floor is not None:
            bounds = [floor(r) for r in rounds]
            bound = spread(bounds)
            if bound is not None:
                line += ("; 2 separate in-memory crawls here: %s, so the target is %s on"
                         " this machine; bloomcrawl over them: %s" % (
                             _cell(bound, spec),
                             "reachable" if meets(bound[0]) else "NOT reachable",
                             _cell(spread([ratio(v, b) for v, b in zip(values, bounds,
                                                                       strict=True)]),
                                   ".2f")))
        lines.append(line)

    lines.append("targets, by the median of the rounds:")
    target("1 process: pages/s x ceiling", lambda r: r.rate_1, ".2f", rate_target, True)
    target("1 process: worker CPU x in-memory", lambda r: r.cpu_1, ".2f", cpu_target, False)
    target("1 process: Redis CPU us a page", lambda r: r.redis_1, ".0f", redis_target_us,
           False)
    target("2 processes: pages/s per process x ceiling", lambda r: r.rate_2, ".2f",
           rate_target, True, lambda r: r.separate_rate)
    target("2 processes: worker CPU x in-memory", lambda r: r.cpu_2, ".2f", cpu_target, False,
           lambda r: r.separate_cpu)
    once = all(r.once for r in rounds)
    lines.append("  %-46s %-22s %s" % ("every page exactly once, every round",
                                      "yes" if once else "NO", verdict(once)))
    return lines


def as_json(rounds: Sequence[Round]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rounds]
