"""``deploy``, ``schedule``, ``seed``, ``crawl``, ``clear``: the project and its crawls.

``deploy`` builds the egg once (``scrapyd-deploy --build-egg``) of the bundled
project or of a user's (``--project-dir``: the directory of its scrapy.cfg),
installs that project's requirements.txt for the cluster's workers, and
uploads the egg to every node, failing when any node fails, or when the
spiders do not import on it; ``schedule`` starts a job on every node;
``seed`` pushes start URLs; ``crawl`` does both; ``clear`` deletes every key
of a spider (its filters, queues, leases, start URLs, stats and items).
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from bloomcrawl.core import defaults, keys
from bloomcrawl.core.connection import redis_errors
from bloomcrawl.ops import inspection, scrapyd, scrapyd_spiders
from bloomcrawl.ops.cli.status import watch
from bloomcrawl.ops.cli.target import Target, TargetOptions, resolve_target
from bloomcrawl.ops.cluster.envfile import read_env_file
from bloomcrawl.ops.cluster.local import LocalCluster
from bloomcrawl.ops.cluster.state import Paths
from bloomcrawl.ops.console import OpsError, say, warn
from bloomcrawl.ops.requirements import REQUIREMENTS_FILE

DEFAULT_PROJECT = "bloomcrawl"
DEFAULT_SPIDER = "site"


def check_project_dir(path: Path) -> Path:
    """``path``, absolute; :class:`OpsError` naming it unless it is a directory with scrapy.cfg."""
    if not path.exists():
        raise OpsError(f"--project-dir {path}: no such directory")
    if not path.is_dir():
        raise OpsError(f"--project-dir {path}: not a directory")
    if not (path / "scrapy.cfg").is_file():
        raise OpsError(f"--project-dir {path}: no scrapy.cfg in it (give the directory of the"
                       " Scrapy project's scrapy.cfg)")
    return path.resolve()


def project_name(project_dir: Path) -> str:
    """``project`` of the ``[deploy]`` section of scrapy.cfg, as scrapyd-deploy reads it
    (environment variables expanded); else the directory's name."""
    config = project_dir / "scrapy.cfg"
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(config)
    except configparser.Error as exc:
        raise OpsError(f"{config}: {str(exc).splitlines()[0]}") from exc
    name = os.path.expandvars(parser.get("deploy", "project", fallback="")).strip()
    return name or project_dir.name


def install_requirements(paths: Paths, target: Target, requirements: Path) -> None:
    """Install what ``requirements`` needs for the workers of the cluster ``up`` started.

    Local: into :attr:`Paths.project_packages`; compose: into every worker
    container. Nodes given by address (``--nodes``, ``SCRAPYD_NODES``,
    ``--scrapyd-service``) are not bloomcrawl's to install on: the upload's
    import check then tells whether they have what the spiders import.
    """
    cluster = target.cluster
    if cluster is None or not target.nodes_recorded:
        say(f"{requirements.name}: not installed (nodes given by address; bloomcrawl installs"
            " it on the cluster `up` started): the upload checks that the spiders import")
        return
    if cluster.mode == "local":
        wheelhouse = LocalCluster(paths, read_env_file(paths.env_file)).install_requirements(
            requirements)
        where = f"for the local workers in {paths.project_packages}"
    else:
        if target.compose is None:
            raise OpsError("the recorded cluster runs in containers, but no compose file is"
                           f" known for it ({paths.cluster_file})")
        wheelhouse = target.compose.install_requirements(requirements)
        where = f"in {len(target.nodes)} worker container(s)"
    done = (f"installed {', '.join(wheelhouse.names)} {where}" if wheelhouse.names
            else "nothing to install")
    have = f" (the workers have {', '.join(wheelhouse.provided)})" if wheelhouse.provided else ""
    say(f"{requirements.name}: {done}{have}")


def deploy_project(paths: Paths, target: Target, project: str | None = None, *,
                   project_dir: Path | None = None, version: str | None = None,
                   egg: Path | None = None, requirements: bool = True) -> int:
    """Build the egg and upload it to every node; 1 if any failed.

    ``project_dir``: the user's Scrapy project (the directory of its
    scrapy.cfg); by default the bundled one. ``project``: the scrapyd project
    name, by default that of scrapy.cfg's ``[deploy]`` section, else the
    directory's name. ``egg`` is uploaded instead of a build. With
    ``requirements``, the project's requirements.txt is installed for the
    workers first (:func:`install_requirements`).
    """
    source = (check_project_dir(project_dir) if project_dir is not None
              else paths.project_dir() if egg is None else None)
    project = project or (project_name(source) if source is not None else DEFAULT_PROJECT)
    # like scrapyd-deploy: a timestamp, so scrapyd (which runs the highest) runs the newest
    version = version or str(int(time.time()))
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-egg-") as tmp:
        if egg is None:
            assert source is not None
            egg = Path(tmp) / f"{project}-{version}.egg"
            scrapyd.build_egg(source, egg)
        content = egg.read_bytes()
    if requirements and source is not None and (source / REQUIREMENTS_FILE).is_file():
        install_requirements(paths, target, source / REQUIREMENTS_FILE)
    results = scrapyd.deploy(target.nodes, project, version, content)
    failed = 0
    for node, answer, error in results:
        if answer is None:
            failed += 1
            say(f"FAIL {error}")  # names the node
        elif "spider_names" in answer:
            say("ok   {}: {} {}, spiders: {}".format(node.url, project, version,
                                                     ", ".join(answer["spider_names"]) or "none"))
        else:
            say("ok   {}: {} {}, spiders: {}".format(node.url, project, version,
                                                     answer.get("spiders")))
    say("deployed %s %s to %d of %d node(s)" % (project, version,
                                                len(results) - failed, len(results)))
    return 1 if failed else 0


def resolve_project(nodes: Sequence[scrapyd.Node], spider: str, given: str | None) -> str:
    """``given``; else the project deployed on the nodes that has ``spider``: the only
    project there is, or the only one of several whose spiders include it. Several or
    none: :class:`OpsError` naming them. :data:`DEFAULT_PROJECT` when no node answers (the
    call that follows says why)."""
    return resolve_project_checked(nodes, spider, given)[0]


def resolve_project_checked(nodes: Sequence[scrapyd.Node], spider: str, given: str | None
                            ) -> tuple[str, bool]:
    """:func:`resolve_project`, and whether it saw ``spider`` among the project's spiders
    (chosen from several by them): :func:`check_spider` need not list them again."""
    if given is not None:
        return given, False
    found = scrapyd_spiders.projects_with_spider(nodes, spider)
    if found is None:
        return DEFAULT_PROJECT, False
    projects, having = found
    if len(projects) == 1:
        if projects[0] != DEFAULT_PROJECT:
            say(f"project {projects[0]}: the one deployed")
        return projects[0], False
    if not projects:
        raise OpsError("no project is deployed on the nodes: deploy one first (make deploy,"
                       " or make deploy PROJECT=path/to/your/project)")
    if len(having) == 1:
        [project] = having
        say(f"project {project}: the deployed project with spider {spider}")
        return project, True
    if having:
        raise OpsError(f"spider {spider} is in projects {', '.join(sorted(having))}: pass"
                       " --project NAME")
    raise no_such_spider(spider, projects)


def no_such_spider(spider: str, projects: Sequence[str]) -> OpsError:
    return OpsError(f"no deployed project has a spider {spider} (deployed:"
                    f" {', '.join(sorted(projects)) or 'none'}): pass --spider, or"
                    " --project NAME")


def check_spider(nodes: Sequence[scrapyd.Node], spider: str, project: str | None) -> None:
    """:class:`OpsError` unless ``project`` (None: any project) has ``spider`` on the first
    node that answers, with :func:`resolve_project`'s line when no project has it. Nothing
    when no node answers: the spider cannot be checked then."""
    listed = scrapyd_spiders.deployed_spiders(nodes)
    if listed is None or spider in (listed.get(project, []) if project is not None
                                    else [name for names in listed.values() for name in names]):
        return
    having = sorted(name for name, names in listed.items() if spider in names)
    if having:
        raise OpsError(f"spider {spider} is in projects {', '.join(having)}, not in {project}:"
                       " pass --project NAME")
    raise no_such_spider(spider, list(listed))


def parse_pairs(pairs: Sequence[str], what: str) -> list[tuple[str, str]]:
    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise OpsError(f"{what} {pair!r}: expected NAME=VALUE")
        out.append((name, value))
    return out


@dataclass
class CrawlOptions:
    """A crawl's spider, project, Scrapy settings and spider arguments, as given."""

    spider: str = DEFAULT_SPIDER
    project: str = DEFAULT_PROJECT
    #: ``NAME=VALUE`` Scrapy settings (``-s``)
    settings: Sequence[str] = ()
    #: ``NAME=VALUE`` spider arguments (``-a``)
    arguments: Sequence[str] = ()
    allowed_domains: str | None = None
    depth_limit: int | None = None
    #: MAX_IDLE_TIME_BEFORE_CLOSE, unless a setting gives it
    max_idle: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, project: str | None = None) -> CrawlOptions:
        """``project``: the one :func:`resolve_project` found, when ``--project`` was not
        given."""
        return cls(spider=args.spider, project=args.project or project or DEFAULT_PROJECT,
                   settings=args.setting or (),
                   arguments=args.arg or (), allowed_domains=args.allowed_domains,
                   depth_limit=args.depth_limit, max_idle=args.max_idle)

    def closes_when_idle(self) -> bool:
        """Whether the jobs are told to close once the frontier stays empty."""
        return self.max_idle is not None or any(
            name == "MAX_IDLE_TIME_BEFORE_CLOSE" for name, _ in parse_pairs(self.settings,
                                                                             "setting"))

    def idle_close_s(self) -> float | None:
        """The jobs' MAX_IDLE_TIME_BEFORE_CLOSE in seconds, as given here (``--max-idle`` or
        a setting); None when not given or not a number."""
        value = dict(self.scrapy_settings()).get("MAX_IDLE_TIME_BEFORE_CLOSE")
        try:
            return None if value is None else float(value)
        except ValueError:
            return None

    def scrapy_settings(self) -> list[tuple[str, str]]:
        settings = parse_pairs(self.settings, "setting")
        if self.max_idle is not None and "MAX_IDLE_TIME_BEFORE_CLOSE" not in dict(settings):
            # "10", not "10.0": scrapy-redis's spiders read it with int()
            settings.append(("MAX_IDLE_TIME_BEFORE_CLOSE", "%g" % self.max_idle))
        return settings

    def spider_arguments(self, urls: Sequence[str]) -> list[tuple[str, str]]:
        """The arguments; for the bundled project, ``allowed_domains`` defaults to the hosts
        of ``urls``. A user's spider gets only what was given: its ``allowed_domains`` is
        its own (a string argument would replace a list)."""
        spider_args = parse_pairs(self.arguments, "spider argument")
        names = {name for name, _ in spider_args}
        if self.allowed_domains:
            spider_args.append(("allowed_domains", self.allowed_domains))
        elif urls and "allowed_domains" not in names and self.project == DEFAULT_PROJECT:
            hosts = sorted({urllib.parse.urlsplit(u).hostname or "" for u in urls} - {""})
            spider_args.append(("allowed_domains", ",".join(hosts)))
        if self.depth_limit is not None:
            spider_args.append(("depth_limit", str(self.depth_limit)))
        return spider_args

    def schedule(self, nodes: Sequence[scrapyd.Node], urls: Sequence[str]) -> dict[str, str]:
        """One job on every node, all of one new crawl; {node url: job id}.

        The jobs get a crawl id of their own (``FRONTIER_CRAWL_ID``, unless a setting
        gives one), as recurring runs do: each crawl fetches its start requests once, also
        after a crawl whose jobs were cancelled left its id in Redis.
        """
        settings = self.scrapy_settings()
        if "FRONTIER_CRAWL_ID" not in dict(settings):
            settings.append(("FRONTIER_CRAWL_ID", "crawl-" + uuid.uuid4().hex))
        return scrapyd.schedule(nodes, self.project, self.spider, settings,
                                self.spider_arguments(urls))


def check_start_urls(urls: Sequence[str]) -> None:
    """:class:`OpsError` unless every one of ``urls`` is an http(s) URL."""
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise OpsError(f"not an http(s) URL: {url!r}")


def start_key(client: redis.Redis, spider: str) -> str:
    """The list the spider's workers read start URLs from: the one a worker of it recorded
    (a scrapy-redis spider's ``redis_key``), else ``<spider>:start_urls``."""
    with redis_errors(client):
        recorded = client.hget(keys.FrontierKeys(spider).meta, "start_urls")
    if isinstance(recorded, bytes) and recorded:
        return recorded.decode()
    return keys.spider_key(defaults.START_URLS_KEY, spider)


def check_start_entries(entries: Sequence[str]) -> None:
    """:class:`OpsError` unless every entry is an http(s) URL or a JSON object whose
    ``url`` is one (bloomcrawl's ``{"url", "meta", "priority", "dont_filter"}``, or
    scrapy-redis's ``{"url", "meta", "method", ...}``). Nothing is pushed then."""
    for entry in entries:
        if not entry.lstrip().startswith("{"):
            check_start_urls([entry])
            continue
        try:
            data = json.loads(entry)
        except ValueError as exc:
            raise OpsError(f"not a JSON object: {entry!r}: {exc}") from exc
        url = data.get("url") if isinstance(data, dict) else None
        if not isinstance(url, str):
            raise OpsError(f'a JSON entry needs an http(s) "url": {entry!r}')
        check_start_urls([url])


def seed(client: redis.Redis, spider: str, urls: Sequence[str], key: str | None = None) -> int:
    """Push ``urls`` to the spider's start URLs (``key``, else :func:`start_key`): http(s)
    URLs or JSON entries (:func:`check_start_entries`), all checked before any is pushed."""
    check_start_entries(urls)
    if urls:
        key = key or start_key(client, spider)
        with redis_errors(client):
            client.rpush(key, *urls)
    return len(urls)


#: one partition's keys of a filter (after ``{<filter>:``) and of its queue
_PARTITION = r"\d+\}.*"


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a SCAN pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def _partitioned(prefix: str) -> tuple[str, re.Pattern[str]]:
    """A SCAN pattern for keys starting ``prefix``, and the exact form of partition keys."""
    return _glob_escape(prefix) + "*", re.compile(re.escape(prefix) + _PARTITION, re.S)


def _names_of(frontier: keys.FrontierKeys) -> tuple[set[str], list[tuple[str, re.Pattern[str]]]]:
    exact = {frontier.meta, frontier.stats, frontier.stats_applied, frontier.pages_by_node,
             frontier.workers, frontier.requeued_added,
             frontier.start_urls, frontier.start_leases, frontier.start_deadlines,
             frontier.start_counter, frontier.items, frontier.item_ids,
             frontier.recent_item_ids,
             keys.crawl_key(frontier.spider)}
    tag = "{%s:" % frontier.filter
    calls = keys.item_calls_prefix(frontier.items)
    return exact, [_partitioned(tag), _partitioned("%s:%s" % (frontier.queue, tag)),
                   (_glob_escape(calls) + "*", re.compile(re.escape(calls) + r"[0-9a-f]+"))]


def spider_key_names(client: redis.Redis, spider: str
                     ) -> tuple[set[str], list[tuple[str, re.Pattern[str]]]]:
    """Every key of a spider: exact names, and (SCAN pattern, exact form) of partitioned ones.

    The filters are the spider's default one and every filter whose meta hash
    names the spider (``BLOOMFILTER_KEY`` set otherwise), with the queues the
    meta hashes record. The patterns match ``{<filter>:<P>}...`` (state, bits,
    RedisBloom) and ``<queue>:{<filter>:<P>}:...`` (queue, leases, deadlines,
    lease counter) for any partition number, whatever the parameters say now.
    """
    default = keys.FrontierKeys(spider)
    found = inspection.find_meta_keys(client)
    pipe = client.pipeline(transaction=False)
    for meta_key in found:
        pipe.hget(meta_key, "spider")
    owners = pipe.execute(raise_on_error=False) if found else []
    metas = [default.meta] + [meta_key for meta_key, owner in zip(found, owners, strict=True)
                              if owner == spider.encode() and meta_key != default.meta]
    pipe = client.pipeline(transaction=False)
    for meta_key in metas:
        pipe.hgetall(meta_key)
    exact, patterns = _names_of(default)
    for meta_key, reply in zip(metas, pipe.execute(raise_on_error=False), strict=True):
        meta = ({k.decode(errors="replace"): v.decode(errors="replace") for k, v in reply.items()}
                if isinstance(reply, dict) else {})
        exact.add(meta_key)
        try:
            recorded = inspection.frontier_keys(keys.filter_name_from_meta(meta_key), meta, spider)
        except ValueError:
            continue  # names that break hash tags were never used: the default ones were
        more, more_patterns = _names_of(recorded)
        exact |= more
        patterns += [p for p in more_patterns if p not in patterns]
    return exact, patterns


def clear_spider(client: redis.Redis, spider: str) -> int:
    """Delete every key of a spider (:func:`spider_key_names`); how many there were.

    On Redis Cluster ``scan_iter`` scans every master, and redis-py's cluster
    client splits each ``UNLINK`` into one call per slot (pipelined).
    """
    with inspection.reachable(client):
        exact, patterns = spider_key_names(client, spider)
        doomed = set(exact)
        for glob, form in patterns:
            for raw in client.scan_iter(match=glob, count=1000):
                name = raw.decode(errors="replace")
                if form.fullmatch(name):
                    doomed.add(name)
        names = sorted(doomed)
        return sum(int(client.unlink(*names[i:i + 500])) for i in range(0, len(names), 500))


# --- the commands -----------------------------------------------------------------


def cmd_deploy(args: argparse.Namespace, paths: Paths) -> int:
    # the project first: a wrong directory is the error, whether a cluster runs or not
    project_dir = check_project_dir(args.project_dir) if args.project_dir else None
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True)
    return deploy_project(paths, target, args.project, project_dir=project_dir,
                          version=args.version, egg=Path(args.egg) if args.egg else None,
                          requirements=not args.no_requirements)


def cmd_schedule(args: argparse.Namespace, paths: Paths) -> int:
    if args.every or args.cron:
        from bloomcrawl.ops.cli.recurring import add_schedule  # it imports this module

        return add_schedule(args, paths)
    if args.name or args.urls or args.replace:
        raise OpsError("--name, --replace and URLs make a recurring schedule: add --every or"
                       " --cron (or use `bloomcrawl crawl URL...` to crawl once)")
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True)
    project = resolve_project(target.nodes, args.spider, args.project)
    for url, job in CrawlOptions.from_args(args, project).schedule(target.nodes, []).items():
        say(f"{url} {job}")
    return 0


def cmd_seed(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False,
                            need_redis=True)
    client = target.redis()
    key = start_key(client, args.spider)
    count = seed(client, args.spider, args.urls, key)
    say("pushed %d start URL(s) to %s" % (count, key))
    return 0


def cmd_crawl(args: argparse.Namespace, paths: Paths) -> int:
    check_start_urls(args.urls)
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True,
                            need_redis=True)
    client = target.redis()  # before any job starts: jobs without their seeds would idle
    options = CrawlOptions.from_args(args, resolve_project(target.nodes, args.spider,
                                                           args.project))
    if not options.closes_when_idle():
        warn("without --max-idle the jobs end only if the project (or the workers'"
             " environment) sets MAX_IDLE_TIME_BEFORE_CLOSE: bloomcrawl's default, 0, never"
             " closes a job")
    jobs = options.schedule(target.nodes, args.urls)
    key = start_key(client, options.spider)
    if args.urls:
        count = seed(client, options.spider, args.urls, key)
        say("seeded %d URL(s); %s running on %d node(s)" % (count, options.spider, len(jobs)))
    else:
        say("%s running on %d node(s), from its own start requests" % (options.spider,
                                                                        len(jobs)))
    if args.wait:
        return watch(target, options.spider, options.project, jobs, args.timeout,
                     (key, list(args.urls)), options.idle_close_s())
    return 0


def cmd_cancel(args: argparse.Namespace, paths: Paths) -> int:
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=True)
    results = scrapyd.cancel_spider(target.nodes, args.project, args.spider)
    for node, jobs, error in results:
        if error:
            warn(f"{node.url}: {error}")
        elif jobs:
            say(f"{node.url}: cancelled {' '.join(jobs)}")
    cancelled = sum(len(jobs or ()) for _, jobs, _ in results)
    answered = sum(1 for _, _, error in results if not error)
    say(f"cancelled {cancelled} job(s) of {args.spider} on {answered} of {len(results)}"
        " node(s)")
    if not cancelled and answered:
        try:  # a mistyped spider cancels nothing, as a spider with no job running does
            check_spider(target.nodes, args.spider, args.project)
        except OpsError as exc:
            warn(str(exc))
    return 0 if answered == len(results) else 1


def cmd_clear(args: argparse.Namespace, paths: Paths) -> int:
    if not args.yes:
        raise OpsError(f"this deletes {args.spider}'s filter, queue and stats: add --yes")
    target = resolve_target(paths, TargetOptions.from_args(args), need_nodes=False,
                            need_redis=True)
    say("deleted %d key(s) of %s" % (clear_spider(target.redis(), args.spider), args.spider))
    return 0
