"""Bad data in Redis: seeds, queue entries, meta hashes, a full filter (issue 9, items 6-9).

Two ``scrapy crawl site`` workers through the fault proxy; see
:mod:`faults.harness` for what is measured and
:meth:`faults.harness.Outcome.problems` for the invariants.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from faults.harness import Outcome
from faults.scenarios import MALFORMED_PARAMS
from faults.spiders import INIT_MARK

pytestmark = pytest.mark.slow


def test_bad_seeds_among_good_ones(run_scenario: Callable[..., Outcome]) -> None:
    """``site:start_urls``: a 400-digit priority, meta with ``_bloomcrawl_lease``, 50 good seeds.

    The two bad entries come first, in the same batch as the good ones.
    Every good seed must still be crawled (and so the whole 100-page site),
    with every invariant.
    """
    outcome = run_scenario("bad-seeds")
    hits = outcome.site.get("hits") or {}
    missed = [page for page in range(50) if not hits.get(str(page))]
    assert not missed, "good seeds never crawled: pages %s\n%s" % (missed,
                                                                   outcome.log_tails())
    outcome.check()


def test_queue_entry_naming_init_as_callback(run_scenario: Callable[..., Outcome]) -> None:
    """A request for /robots.txt (a 200) whose callback is ``"__init__"`` is in the queue.

    The spider's ``__init__`` must run once per worker, never as a callback
    (:mod:`faults.spiders` logs each call), and the crawl goes on: every
    invariant. The entry itself may be dropped before or after its download,
    so the shared ``pages`` may count robots.txt or not.
    """
    outcome = run_scenario("init-callback")
    calls = {name: len(re.findall(re.escape(INIT_MARK), outcome.log_text(name)))
             for name in outcome.log_files}
    assert all(n == 1 for n in calls.values()), "__init__ calls per worker: %s" % calls
    outcome.check(stats=False)
    assert outcome.shared.get("pages") in (outcome.page_responses, outcome.site_responses)
    assert outcome.shared.get("items") == outcome.page_responses


def test_exporter_with_a_malformed_meta_hash(run_scenario: Callable[..., Outcome]) -> None:
    """At 1/4, three other spiders' meta hashes appear with params null, a list, not JSON.

    Every scrape from then on must answer 200 with ``bloomcrawl_up 1`` and
    the healthy spider's metrics; and the crawl's invariants hold.
    """
    outcome = run_scenario("malformed-meta")
    since = outcome.facts["malformed_from"] + 0.1
    scrapes = [s for s in outcome.scrape_results if s.at >= since]
    assert len(scrapes) >= 3, "too few scrapes after the fault to judge"
    bad = [s for s in scrapes if s.status != 200 or s.value("bloomcrawl_up") != 1.0
           or s.value("bloomcrawl_pages_total", 'spider="site"') is None]
    assert not bad, "%d of %d scrapes after the malformed meta: %s" % (
        len(bad), len(scrapes), [(s.status, s.body[:200]) for s in bad[:3]])
    for spider in MALFORMED_PARAMS:
        assert spider in outcome.exporter_log, "the exporter said nothing of " + spider
    outcome.check()


def _failed_loudly(outcome: Outcome) -> bool:
    """Every worker stopped, and one logged an error naming the filter and its limit."""
    if outcome.wedged:
        return False
    for name in outcome.log_files:
        for line in outcome.log_text(name).splitlines():
            if (re.search(r"\b(ERROR|CRITICAL)\b", line) and "site:bloomfilter" in line
                    and re.search(r"slice|capacity|full|limit|BLOOMFILTER_", line)):
                return True
    return False


def test_filter_at_its_slice_limit(run_scenario: Callable[..., Outcome]) -> None:
    """One partition, capacity 1, growth 1.01: 24 slices, then the last one fills up.

    (BLOOMFILTER_GROWTH=1 itself is refused as a setting.) The slices get the
    blocks their allocation holds: 129 items each, about 1,340 in all, so a
    1,600-page site outgrows them. Either the crawl goes on correctly (every
    invariant holds) or it fails loudly: every worker stops and an error
    names the filter (``site:bloomfilter``) and its limit. Never new URLs
    silently taken for duplicates.
    """
    outcome = run_scenario("growth-limit")
    problems = outcome.problems()
    assert problems, "the site never outgrew the filter: the test proves nothing"
    if not _failed_loudly(outcome):
        raise AssertionError("pages silently lost to a full filter:\n  %s\n%s" % (
            "\n  ".join(problems), outcome.log_tails()))
