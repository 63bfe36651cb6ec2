"""Items pipeline benchmark: what storing an item costs the worker and Redis.

``RedisItemsPipeline`` (each item stored once under its page's id, see
``crawl/pipelines.py``) beside scrapy-redis's ``RedisPipeline`` (an RPUSH
per item, no id), both writing to a real redis-server, driven the way
Scrapy's scraper drives them: the items of one page handed to the pipeline
together (``--burst``, default 1 and 48, a listing page's products), each
page's items awaited before the next page's come. Per item: the worker's
CPU (this process, its threads included), Redis's main-thread CPU, and the
calls Redis ran. Wall-clock and CPU figures depend on what else the machine
does: compare the rows of one run. Nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "crawler"), str(ROOT / "tests")]

from twisted.internet import asyncioreactor  # noqa: E402

asyncioreactor.install()

import redis  # noqa: E402
from _redis import cpu_sample  # noqa: E402
from _report import emit, table  # noqa: E402
from scrapy import Spider  # noqa: E402
from scrapy.utils.defer import maybe_deferred_to_future  # noqa: E402
from scrapy.utils.misc import build_from_crawler  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402
from twisted.internet import reactor  # noqa: E402
from twisted.internet.defer import Deferred  # noqa: E402

from bloomcrawl.crawl import origins  # noqa: E402
from bloomcrawl.crawl.pipelines import RedisItemsPipeline  # noqa: E402

from kit.redis import RedisServer  # noqa: E402


class ItemsSpider(Spider):
    name = "items"


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    build: Callable[[Any], Any]
    #: whether items are tagged with their page (only RedisItemsPipeline reads tags)
    tags: bool
    #: the commands the pipeline sends (INFO commandstats also counts a script's own)
    commands: tuple[str, ...]


def _bloomcrawl(crawler: Any) -> Any:
    pipeline = build_from_crawler(RedisItemsPipeline, crawler)
    pipeline.open_spider()
    return pipeline


def _scrapy_redis(crawler: Any) -> Any:
    from scrapy_redis.pipelines import RedisPipeline

    return build_from_crawler(RedisPipeline, crawler)


CONTENDERS = (
    Contender("bloomcrawl", "bloomcrawl RedisItemsPipeline", _bloomcrawl, tags=True,
              commands=("evalsha", "eval")),
    Contender("scrapy-redis", "scrapy-redis RedisPipeline", _scrapy_redis, tags=False,
              commands=("rpush",)),
)


@dataclass(frozen=True)
class Result:
    contender: Contender
    burst: int
    items: int
    worker_us: float
    redis_us: float
    calls: float
    wall_us: float
    stored: int


def item(n: int) -> dict[str, Any]:
    """A listing's item: a product's URL, name, price and category."""
    return {"url": "https://shop.test/product/%d" % n, "name": "Product %d" % n,
            "price": "%d.50" % (10 + n % 90), "category": "books", "in_stock": n % 3 != 0}


async def measure(contender: Contender, burst: int, count: int, server: RedisServer,
                  client: redis.Redis) -> Result:
    client.flushall()
    crawler = get_crawler(ItemsSpider, settings_dict={"REDIS_URL": server.url})
    spider = ItemsSpider.from_crawler(crawler)
    crawler.spider = spider
    pipeline = contender.build(crawler)
    items = [item(n) for n in range(count)]
    if contender.tags:
        for n, it in enumerate(items):
            origins.tag(it, "page%d:%d" % (n // burst, n % burst))
    client.config_resetstat()
    before = cpu_sample(client)
    cpu, wall = time.process_time(), time.perf_counter()
    for first in range(0, count, burst):
        # a page's items reach the pipeline together, as the scraper hands them on
        await asyncio.gather(*(asyncio.ensure_future(
            maybe_deferred_to_future(_call(pipeline, it, spider)))
            for it in items[first:first + burst]))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    redis_s = (cpu_sample(client) - before).main_thread_s
    calls = sum(int(v["calls"]) for name, v in client.info("commandstats").items()
                if name in {"cmdstat_" + c for c in contender.commands})
    stored = int(client.llen("items:items"))
    return Result(contender, burst, count, cpu / count * 1e6, redis_s / count * 1e6,
                  calls / count, wall / count * 1e6, stored)


def _call(pipeline: Any, it: Any, spider: Spider) -> Deferred[Any]:
    result = pipeline.process_item(it, spider)
    if asyncio.iscoroutine(result):
        return Deferred.fromFuture(asyncio.ensure_future(result))
    return result  # scrapy-redis: a Deferred from deferToThread


def report(results: Sequence[Result]) -> None:
    rows = []
    by_key = {(r.contender.key, r.burst): r for r in results}
    for r in results:
        other = by_key.get(("scrapy-redis", r.burst))
        ratio = ("%.2fx" % (r.worker_us / other.worker_us)
                 if other is not None and r is not other else "")
        rows.append([r.contender.label, str(r.burst), "%.1f" % r.worker_us, ratio,
                     "%.1f" % r.redis_us, "%.3f" % r.calls, "%.1f" % r.wall_us,
                     "%d/%d" % (r.stored, r.items)])
    for line in table(["pipeline", "items a page", "worker CPU us/item", "x scrapy-redis",
                       "Redis CPU us/item", "calls/item", "wall us/item", "stored"], rows,
                      left=1):
        emit(line)
    emit()
    emit("worker CPU: this process's (its threads included); Redis CPU: the server's main"
         " thread; calls: the commands the pipeline sent (EVALSHA, or RPUSH), per item")


async def run(args: argparse.Namespace) -> list[Result]:
    results = []
    with RedisServer() as server:
        client = server.client()
        for burst in args.burst:
            for contender in CONTENDERS:
                if contender.key in args.contenders:
                    results.append(await measure(contender, burst, args.items, server, client))
        client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 items a case")
    parser.add_argument("--items", type=int, default=3000, help="items a case (%(default)s)")
    parser.add_argument("--burst", type=int, nargs="+", default=[1, 48],
                        help="items a page: handed to the pipeline together (%(default)s)")
    parser.add_argument("--contenders", default=",".join(c.key for c in CONTENDERS))
    args = parser.parse_args(argv)
    if args.quick:
        args.items = 300
    args.contenders = set(args.contenders.split(","))
    emit("items pipeline benchmark: %d items a case; %s, Python %s, %d CPUs, load average %s"
         % (args.items, platform.platform(terse=True), platform.python_version(),
            os.cpu_count() or 0, " ".join("%.2f" % x for x in os.getloadavg())))
    outcome: list[Result] = []

    async def body() -> None:
        outcome.extend(await run(args))

    def start() -> None:
        done = Deferred.fromFuture(asyncio.ensure_future(body()))
        done.addErrback(lambda failure: failure.printTraceback())
        done.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(start)
    reactor.run()
    if not outcome:
        return 1
    emit()
    report(outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
