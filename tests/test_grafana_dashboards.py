"""Every Grafana dashboard under monitoring/, checked without a Grafana server.

Each dashboard JSON is parsed into the typed models of the Grafana Foundation
SDK (``grafana-foundation-sdk``, pinned in pyproject.toml to the schema of the
Grafana image docker-compose.yml runs), and then:

* every panel has a panel type the SDK knows, the provisioned Prometheus
  datasource, and at least one query, each typed by the SDK as a Prometheus
  query with an expression;
* every query, and every query variable's selector, is valid PromQL: promtool
  (Debian package prometheus) checks them, written as recording rules;
* every metric a query reads is one the exporter exports (a real
  ``ClusterCollector`` scrape over a real redis-server), and every label it
  matches on is one that metric has;
* every variable a query uses (``$spider``, ``${spider}``, ``[[spider]]``) is
  defined on the dashboard or is one of Grafana's own, and every query
  variable's query is a Prometheus variable query that reads known metrics and
  labels;
* parsing and writing the dashboard back with the SDK loses no key but those
  this SDK does not model (:data:`UNMODELLED`) and changes no value, which
  also catches a misspelled key Grafana would silently ignore.

Each check returns the problems it found; test_each_check_catches_its_problem
feeds a broken dashboard to each. tests/test_monitoring.py runs the same
queries against a real Prometheus scraping a real crawl.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as grafana
from grafana_foundation_sdk.models import prometheus

from bloomcrawl.core import keys
from bloomcrawl.core.bloom import BloomFilter
from bloomcrawl.core.frontier import Frontier, Outgoing
from bloomcrawl.core.politeness import filter_fingerprint, host_of
from bloomcrawl.ops.cluster.processes import free_port
from bloomcrawl.ops.exporter import ClusterCollector, ScrapydNodes, build_registry
from bloomcrawl.ops.exporter import redis_client as exporter_client
from bloomcrawl.ops.runs import FINISHED, Run, RunStore
from bloomcrawl.ops.schedules import ScheduleStore, Spec

from kit import ROOT
from kit.data import populate_frontier
from kit.fixtures import installed
from kit.redis import RedisServer

MONITORING = ROOT / "monitoring"
DASHBOARDS = sorted(MONITORING.rglob("*.json"))
#: the folder docker-compose.yml mounts where the provider
#: (grafana/provisioning/dashboards/bloomcrawl.yml) loads dashboards from
PROVISIONED = MONITORING / "grafana" / "dashboards"
DATASOURCES = MONITORING / "grafana" / "provisioning" / "datasources"

#: keys of a dashboard that this SDK version does not model (path, lists as ``[]``): they
#: are dropped by a round trip through it, and Grafana still reads them
UNMODELLED = {
    # the query editor's copy of a query variable's query; Grafana runs ``query``
    "templating.list[].definition",
}
#: Grafana's own variables, and a value each may take in a query
GRAFANA_VARIABLES = {
    "__interval": "1m", "__interval_ms": "60000", "__rate_interval": "1m",
    "__rate_interval_ms": "60000", "__range": "1h", "__range_s": "3600",
    "__range_ms": "3600000", "__from": "0", "__to": "0", "__dashboard": "x", "__org": "1",
    "__user": "x",
}
VARIABLE_REF = re.compile(r"\$(\w+)|\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]")
#: series Prometheus makes of each scrape itself, and the labels it gives every series
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                     "scrape_samples_post_metric_relabeling", "scrape_series_added"}
TARGET_LABELS = frozenset({"job", "instance"})
#: the series a metric family of each type is exposed as (suffixes of its name)
SERIES_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "untyped": ("",), "unknown": ("",),
                   "histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count"),
                   "info": ("_info",), "stateset": ("",),
                   "gaugehistogram": ("_bucket", "_gsum", "_gcount")}

#: series name -> its label names (None: no sample showed them)
Exported = dict[str, frozenset[str] | None]


@dataclass(frozen=True)
class Query:
    """A PromQL expression of a dashboard and where it is (for the messages)."""

    where: str
    expr: str


# --- the SDK's models ------------------------------------------------------------------


def parse(raw: Any) -> tuple[grafana.Dashboard | None, list[str]]:
    """The dashboard as the SDK's typed model, or the problem that kept it from being one."""
    plugins.register_default_plugins()  # panel options and queries by type (idempotent)
    if not isinstance(raw, dict):
        return None, [f"not a JSON object: {type(raw).__name__}"]
    try:
        return grafana.Dashboard.from_json(raw), []
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return None, [f"does not parse into the SDK's Dashboard: {type(exc).__name__}: {exc}"]


def panels(model: grafana.Dashboard) -> Iterator[grafana.Panel | grafana.RowPanel]:
    """Every panel, those inside collapsed rows included."""
    for panel in model.panels or []:
        yield panel
        if isinstance(panel, grafana.RowPanel):
            yield from panel.panels or []


def variables(model: grafana.Dashboard) -> list[grafana.VariableModel]:
    return list(model.templating.list_val or [])


def where(panel: grafana.Panel | grafana.RowPanel) -> str:
    return f"panel {panel.id_val} {panel.title!r}"


def datasource_uids() -> set[str]:
    """The uids of the provisioned datasources (a dashboard's may name no other)."""
    text = "\n".join(p.read_text() for p in sorted(DATASOURCES.glob("*.y*ml")))
    return set(re.findall(r"^\s*uid:\s*(\S+)\s*$", text, re.M))


def check_panels(model: grafana.Dashboard, uids: set[str]) -> list[str]:
    """A known panel type, the provisioned datasource and typed queries for each panel."""
    known_types = set(cogruntime.Runtime().panelcfg_variants)
    problems = []
    ids = [panel.id_val for panel in panels(model)]
    if len(ids) != len(set(ids)):
        problems.append(f"panel ids are not unique: {ids}")
    for panel in panels(model):
        if isinstance(panel, grafana.RowPanel):
            continue
        at = where(panel)
        if panel.type_val not in known_types:
            problems.append(f"{at}: unknown panel type {panel.type_val!r}")
        source = panel.datasource
        if source is None or source.uid not in uids or source.type_val != "prometheus":
            problems.append(f"{at}: datasource {source and source.to_json()} is not the"
                            f" provisioned Prometheus ({sorted(uids)})")
        if not panel.targets:
            problems.append(f"{at}: no query")
        ref_ids = []
        for target in panel.targets or []:
            if not isinstance(target, prometheus.Dataquery):
                problems.append(f"{at}: a query the SDK does not read as Prometheus's:"
                                f" {json.dumps(target, cls=JSONEncoder)}")
                continue
            ref_ids.append(target.ref_id)
            if not target.expr.strip():
                problems.append(f"{at}: query {target.ref_id!r} has no expression")
            if target.datasource is not None and target.datasource.uid not in uids:
                problems.append(f"{at}: query {target.ref_id!r} names datasource"
                                f" {target.datasource.uid!r}")
        if len(ref_ids) != len(set(ref_ids)) or "" in ref_ids:
            problems.append(f"{at}: refIds not unique and set: {ref_ids}")
    return problems


def panel_queries(model: grafana.Dashboard) -> list[Query]:
    return [Query(f"{where(panel)} query {target.ref_id!r}", target.expr)
            for panel in panels(model) if isinstance(panel, grafana.Panel)
            for target in panel.targets or [] if isinstance(target, prometheus.Dataquery)]


# --- variables ---------------------------------------------------------------------------

_LABEL_VALUES = re.compile(
    r"\s*label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*", re.S)
_LABEL_NAMES = re.compile(r"\s*label_names\(\s*(?P<selector>.*?)\s*\)\s*", re.S)
_QUERY_RESULT = re.compile(r"\s*query_result\(\s*(?P<expr>.+)\)\s*", re.S)
_METRICS = re.compile(r"\s*metrics\(\s*(?P<regex>.*?)\s*\)\s*", re.S)


def variable_query(variable: grafana.VariableModel) -> str:
    query = variable.query
    if isinstance(query, dict):
        return str(query.get("query") or "")
    return query or ""


def referenced(text: str) -> list[str]:
    """The variables a query names."""
    return [next(name for name in match.groups() if name) for match in VARIABLE_REF.finditer(text)]


def check_variables_defined(model: grafana.Dashboard) -> list[str]:
    """Every variable a query (or a variable's query) uses is the dashboard's or Grafana's."""
    defined = {variable.name for variable in variables(model)}
    problems = []
    queries = panel_queries(model) + [Query(f"variable {v.name!r}", variable_query(v))
                                      for v in variables(model)]
    for query in queries:
        for name in referenced(query.expr):
            if name not in defined and name not in GRAFANA_VARIABLES:
                problems.append(f"{query.where}: ${name} is not a variable of the dashboard"
                                f" ({sorted(defined)})")
    return problems


def check_variable_queries(model: grafana.Dashboard, uids: set[str], exported: Exported
                           ) -> tuple[list[str], list[Query]]:
    """Each query variable's query is one Grafana's Prometheus datasource runs, over
    exported metrics and labels; returns the problems and the PromQL it holds (for
    :func:`check_promql` and :func:`check_metrics`)."""
    problems: list[str] = []
    promql: list[Query] = []
    all_labels = set(TARGET_LABELS).union(*(labels for labels in exported.values() if labels))
    for variable in variables(model):
        if variable.type_val != grafana.VariableType.QUERY:
            continue
        at = f"variable {variable.name!r}"
        if variable.datasource is None or variable.datasource.uid not in uids:
            problems.append(f"{at}: datasource is not the provisioned Prometheus")
        query = variable_query(variable)
        if match := _LABEL_VALUES.fullmatch(query):
            label, selector = match["label"], match["selector"]
            if selector is None:
                if label not in all_labels:
                    problems.append(f"{at}: no exported metric has a label {label!r}")
                continue
            promql.append(Query(at, selector))
            for metric, _ in selectors(substitute(selector, model)):
                labels = exported.get(metric or "")
                if labels is not None and label not in labels | TARGET_LABELS:
                    problems.append(f"{at}: {metric} has no label {label!r}"
                                    f" (it has {sorted(labels)})")
        elif match := _LABEL_NAMES.fullmatch(query):
            if match["selector"]:
                promql.append(Query(at, match["selector"]))
        elif match := _QUERY_RESULT.fullmatch(query):
            promql.append(Query(at, match["expr"]))
        elif match := _METRICS.fullmatch(query):
            try:
                pattern = re.compile(match["regex"])
            except re.error as exc:
                problems.append(f"{at}: bad regular expression: {exc}")
                continue
            if not any(pattern.search(name) for name in exported):
                problems.append(f"{at}: {match['regex']!r} matches no exported metric")
        else:
            problems.append(f"{at}: {query!r} is not a Prometheus variable query"
                            " (label_values, label_names, metrics, query_result)")
    return problems, promql


def sample_value(variable: grafana.VariableModel) -> str:
    """A value the variable may take in a query: its "All" value, else its current one."""
    if variable.include_all and variable.all_value:
        return variable.all_value
    value: Any = variable.current.value if variable.current is not None else None
    if isinstance(value, list):
        value = value[0] if value else None
    return ".*" if value in (None, "", "$__all") else str(value)


def substitute(expr: str, model: grafana.Dashboard) -> str:
    """``expr`` as Grafana sends it to Prometheus (undefined variables as ``.*``)."""
    values = {**GRAFANA_VARIABLES, **{v.name: sample_value(v) for v in variables(model)}}

    def value(match: re.Match[str]) -> str:
        name = next(name for name in match.groups() if name)
        return values.get(name, ".*")

    return VARIABLE_REF.sub(value, expr)


# --- PromQL ------------------------------------------------------------------------------


def check_promql(queries: list[Query], model: grafana.Dashboard, workdir: Path) -> list[str]:
    """promtool parses every query, written as a recording rule (JSON is YAML)."""
    if not queries:
        return []
    rules = [{"record": f"dashboard_query_{n}", "expr": substitute(q.expr, model)}
             for n, q in enumerate(queries)]
    path = workdir / "dashboard_queries.rules.json"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run([installed("promtool"), "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode == 0:
        return []
    output = done.stdout + done.stderr
    problems = [f"{queries[int(n)].where}: {queries[int(n)].expr!r}: {error}"
                for n, error in re.findall(r'"dashboard_query_(\d+)": (.*)', output)]
    return problems or [f"promtool check rules failed:\n{output}"]


_PROMQL_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?:ms|[smhdwy]|\d)*)
  | (?P<name>[A-Za-z_:][\w:]*)
  | (?P<symbol>=~|!~|!=|==|<=|>=|[{}(),=<>+\-*/%^@])
""", re.X)
#: names followed by a list of labels in parentheses
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                 "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(expr):
        match = _PROMQL_TOKEN.match(expr, at)
        if match is None:  # promtool says what is wrong
            at += 1
            continue
        kind = match.lastgroup or ""
        if kind != "space":
            out.append((kind, match.group()))
        at = match.end()
    return out


def _matchers(tokens: list[tuple[str, str]], at: int) -> tuple[list[tuple[str, str, str]], int]:
    """The ``(label, op, value)`` matchers of the braces opening at ``tokens[at]``, and
    the index after them."""
    found, at = [], at + 1
    while at < len(tokens) and tokens[at][1] != "}":
        if (at + 2 < len(tokens) and tokens[at][0] == "name"
                and tokens[at + 1][1] in ("=", "!=", "=~", "!~")):
            value = tokens[at + 2][1]
            found.append((tokens[at][1], tokens[at + 1][1], value[1:-1]))
            at += 3
        else:
            at += 1
    return found, at + 1


def selectors(expr: str) -> list[tuple[str | None, list[str]]]:
    """``(metric name, label names matched)`` of every vector selector of a PromQL
    expression; the name is ``None`` for a selector that names no metric."""
    tokens = _tokens(expr)
    out: list[tuple[str | None, list[str]]] = []
    at = 0
    while at < len(tokens):
        kind, text = tokens[at]
        following = tokens[at + 1][1] if at + 1 < len(tokens) else ""
        if kind == "name" and text.lower() in _LABEL_LISTS:
            at += 1
            if following == "(":
                depth = 0
                while at < len(tokens):
                    depth += {"(": 1, ")": -1}.get(tokens[at][1], 0)
                    at += 1
                    if depth == 0:
                        break
        elif kind == "name" and (text.lower() in _KEYWORDS | _AGGREGATIONS or following == "("):
            at += 1  # an operator, an aggregation or a function
        elif kind == "name":
            matchers: list[tuple[str, str, str]] = []
            at += 1
            if following == "{":
                matchers, at = _matchers(tokens, at)
            out.append((text, [label for label, _, _ in matchers]))
        elif text == "{":
            matchers, at = _matchers(tokens, at)
            names = [value for label, op, value in matchers if label == "__name__" and op == "="]
            out.append((names[0] if names else None,
                        [label for label, _, _ in matchers if label != "__name__"]))
        else:
            at += 1
    return out


def check_metrics(queries: list[Query], model: grafana.Dashboard, exported: Exported
                  ) -> list[str]:
    """Every metric a query reads is exported (or made by Prometheus), with the labels
    it matches on."""
    problems = []
    for query in queries:
        for metric, labels in selectors(substitute(query.expr, model)):
            if metric is None:
                problems.append(f"{query.where}: a selector without a metric name in"
                                f" {query.expr!r}")
            elif metric in PROMETHEUS_SERIES:
                unknown = set(labels) - TARGET_LABELS
                if unknown:
                    problems.append(f"{query.where}: {metric} has no label {sorted(unknown)}")
            elif metric not in exported:
                problems.append(f"{query.where}: {metric} is not a metric the exporter"
                                " exports")
            elif (known := exported[metric]) is not None and set(labels) - known - TARGET_LABELS:
                problems.append(f"{query.where}: {metric} has no label"
                                f" {sorted(set(labels) - known - TARGET_LABELS)}"
                                f" (it has {sorted(known)})")
    return problems


# --- the round trip ----------------------------------------------------------------------


def check_round_trip(raw: dict[str, Any], model: grafana.Dashboard) -> list[str]:
    """Written back by the SDK, the dashboard keeps every key the SDK models, unchanged.

    The SDK may add its defaults; it may drop only :data:`UNMODELLED` keys.
    """
    written = json.loads(json.dumps(model, cls=JSONEncoder))
    problems: list[str] = []

    def compare(old: Any, new: Any, path: str, shape: str) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            for key, value in old.items():
                if key not in new:
                    if f"{shape}.{key}".lstrip(".") not in UNMODELLED:
                        problems.append(f"{path}.{key}: dropped by the SDK (misspelled, or"
                                        " not in this Grafana's schema)".lstrip("."))
                else:
                    compare(value, new[key], f"{path}.{key}", f"{shape}.{key}")
        elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                compare(a, b, f"{path}[{i}]", f"{shape}[]")
        elif old != new or isinstance(old, bool) != isinstance(new, bool):
            problems.append(f"{path.lstrip('.')}: {old!r} written back as {new!r}")

    compare(raw, written, "", "")
    return problems


# --- what the exporter exports ------------------------------------------------------------


def recurring_crawl(client: redis.Redis) -> None:
    """A schedule fired once, whose run ended, and a paused one: every label the
    ``bloomcrawl_schedule*`` and ``bloomcrawl_run_*`` families have shows in a sample."""
    store = ScheduleStore(client)
    made = store.add(Spec("news", "site", "bloomcrawl", every=3600).check())
    store.add(Spec("nightly", "site", "bloomcrawl", cron="0 3 * * *").check())
    store.set_paused("nightly", True)
    assert store.claim("news", made.created, "timer-1")
    store.record("news", {"slot": made.created, "fired_at": made.created, "manual": False,
                          "result": "started", "run": "news-1", "started": {}, "refused": {}})
    run = Run("news-1", "news", "site", "bloomcrawl", made.created, made.created,
              jobs={"http://127.0.0.1:6800": "job1"}, stats_end={"pages": 3})
    RunStore(client).start(run)
    run.status, run.finished, run.reasons = FINISHED, made.created + 5, {"job1": "finished"}
    RunStore(client).save(run)


@pytest.fixture(scope="module")
def exported(redis_server: RedisServer) -> Iterator[Exported]:
    """Every series one scrape of the real exporter has, and their labels where a sample
    showed them: over a frontier, a politeness state and a scrapyd node that is down."""
    client = redis_server.client()
    client.flushall()
    try:
        populate_frontier(client, "site")
        frontier_keys = keys.FrontierKeys("polite", partitions=2)
        bloom = BloomFilter(client, frontier_keys.filter, capacity=1000, error_rate=0.01,
                            partitions=2)
        front = Frontier(client, bloom, frontier_keys, queue_type="priority",
                         lease_timeout=60, worker_id="w1", node="worker-a")
        front.record_layout()
        urls = ["http://a.test/1", "http://a.test/2", "http://b.test/1"]
        front.exchange([Outgoing(filter_fingerprint(hashlib.sha1(url.encode()).digest(),
                                                    host_of(url), bloom.params.partition_by),
                                 False, 0.0, json.dumps({"url": url}), host_of(url))
                        for url in urls], {})
        recurring_crawl(client)
        down = ScrapydNodes(urls=[f"http://127.0.0.1:{free_port()}"], timeout=1.0)
        registry = build_registry(ClusterCollector(exporter_client(redis_server.url),
                                                   scrapyd=down))
        out: Exported = {}
        for family in registry.collect():
            for suffix in SERIES_SUFFIXES[family.type]:
                out.setdefault(family.name + suffix, None)
            for sample in family.samples:
                out[sample.name] = (out.get(sample.name) or frozenset()) | set(sample.labels)
        yield out
    finally:
        client.flushall()
        client.close()


# --- the dashboards -------------------------------------------------------------------------


def load(path: Path) -> tuple[dict[str, Any], grafana.Dashboard]:
    raw = json.loads(path.read_text())
    model, problems = parse(raw)
    assert model is not None and problems == [], problems
    return raw, model


def test_every_provisioned_dashboard_is_checked() -> None:
    provisioned = sorted(PROVISIONED.glob("*.json"))
    assert provisioned, f"no dashboard in {PROVISIONED}"
    assert set(provisioned) <= set(DASHBOARDS)


dashboards = pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])


@dashboards
def test_dashboard_parses_into_the_sdk_model(path: Path) -> None:
    raw, model = load(path)
    assert isinstance(model, grafana.Dashboard)
    assert model.uid and model.title and model.schema_version == raw["schemaVersion"]
    assert all(isinstance(p, grafana.Panel | grafana.RowPanel) for p in model.panels or [])
    # every variable of the file came through the parse, with its name and type
    assert [(v.name, v.type_val) for v in variables(model)] == [
        (v["name"], v.get("type", "query")) for v in raw.get("templating", {}).get("list", [])]


@dashboards
def test_every_panel_has_a_known_type_the_datasource_and_a_query(path: Path) -> None:
    _, model = load(path)
    assert check_panels(model, datasource_uids()) == []
    assert panel_queries(model)


@dashboards
def test_every_query_is_valid_promql(path: Path, exported: Exported, tmp_path: Path) -> None:
    _, model = load(path)
    _, variable_promql = check_variable_queries(model, datasource_uids(), exported)
    assert check_promql(panel_queries(model) + variable_promql, model, tmp_path) == []


@dashboards
def test_every_metric_a_query_reads_is_exported(path: Path, exported: Exported) -> None:
    _, model = load(path)
    _, variable_promql = check_variable_queries(model, datasource_uids(), exported)
    assert check_metrics(panel_queries(model) + variable_promql, model, exported) == []


@dashboards
def test_every_variable_is_defined_and_its_query_valid(path: Path, exported: Exported) -> None:
    _, model = load(path)
    assert check_variables_defined(model) == []
    problems, _ = check_variable_queries(model, datasource_uids(), exported)
    assert problems == []


@dashboards
def test_the_sdk_round_trip_loses_nothing_it_models(path: Path) -> None:
    raw, model = load(path)
    assert check_round_trip(raw, model) == []


def test_the_politeness_panels_read_the_politeness_metrics() -> None:
    _, model = load(PROVISIONED / "bloomcrawl-overview.json")
    read = {metric for query in panel_queries(model) for metric, _ in selectors(query.expr)}
    assert {"bloomcrawl_politeness_held_back_requests", "bloomcrawl_politeness_hosts",
            "bloomcrawl_domain_queued_requests", "bloomcrawl_domain_in_flight_requests",
            "bloomcrawl_domain_delay_seconds", "bloomcrawl_domain_concurrency"} <= read
    table = next(p for p in panels(model) if p.title == "Busiest domains")
    assert table.type_val == "table"


def test_the_recurring_crawls_row_reads_the_schedule_and_run_metrics(exported: Exported
                                                                     ) -> None:
    _, model = load(PROVISIONED / "bloomcrawl-overview.json")
    rows = [p for p in panels(model) if isinstance(p, grafana.RowPanel)]
    assert [row.title for row in rows] == ["Recurring crawls"]
    read = {metric for query in panel_queries(model) for metric, _ in selectors(query.expr)}
    recurring = {name for name in exported
                 if name.startswith(("bloomcrawl_schedule_", "bloomcrawl_run_"))}
    # the current run, the last runs, each schedule's last and next fire, its last outcome
    assert {"bloomcrawl_run_running", "bloomcrawl_run_start_timestamp_seconds",
            "bloomcrawl_run_duration_seconds", "bloomcrawl_run_pages",
            "bloomcrawl_run_finished_jobs", "bloomcrawl_schedule_last_fire_timestamp_seconds",
            "bloomcrawl_schedule_next_fire_timestamp_seconds",
            "bloomcrawl_schedule_overdue_seconds", "bloomcrawl_schedule_last_outcome"
            } <= read & recurring
    # and the scrape showed each of their labels
    assert all(exported[name] for name in recurring), {
        name: exported[name] for name in recurring if not exported[name]}
    assert exported["bloomcrawl_run_pages"] == {"schedule", "spider", "ago"}
    assert exported["bloomcrawl_schedule_last_outcome"] == {"schedule", "spider", "result"}
    titles = {p.title for p in panels(model)}
    assert {"Current run of each schedule", "Last runs", "Schedules: last and next fire",
            "Last firing outcome"} <= titles


# --- each check can fail --------------------------------------------------------------------


def test_the_promql_reader_finds_metrics_and_labels() -> None:
    assert selectors('sum by (spider) (rate(a_total{spider=~"$x", node!="n"}[5m] offset 1h))'
                     " / on(spider) group_left(node) b + topk(3, c) > bool 2") == [
        ("a_total", ["spider", "node"]), ("b", []), ("c", [])]
    assert selectors('{__name__="d", job="j"} and count(e) without (x) unless f @ start()') == [
        ("d", ["job"]), ("e", []), ("f", [])]
    assert selectors('{job="j"}') == [(None, ["job"])]


def test_each_check_catches_its_problem(exported: Exported, tmp_path: Path) -> None:
    raw = json.loads((PROVISIONED / "bloomcrawl-overview.json").read_text())
    broken = copy.deepcopy(raw)
    by_id = {panel["id"]: panel for panel in broken["panels"]}
    by_id[1]["targets"][0]["expr"] = "sum(rate(bloomcrawl_pages_total[5m])"  # unbalanced
    by_id[2]["targets"][0]["expr"] = 'bloomcrawl_no_such_metric{spider=~"$spider"}'
    by_id[3]["targets"][0]["expr"] = 'bloomcrawl_filter_items{spider=~"$nope"}'
    by_id[4]["type"] = "no-such-panel"
    del by_id[5]["datasource"]
    by_id[6]["targets"] = []
    by_id[7]["targets"][0]["legendFormt"] = by_id[7]["targets"][0].pop("legendFormat")
    by_id[8]["targets"][0]["expr"] = 'bloomcrawl_queue_requests{no_such_label="x"}'
    spider = broken["templating"]["list"][0]
    spider["query"]["query"] = "label_values(bloomcrawl_filter_capacity, no_such_label)"
    broken["templating"]["list"] += [
        {**copy.deepcopy(spider), "name": "bad", "query": {
            "query": "label_values(bloomcrawl_up{, spider)", "refId": "bad"}},
        {**copy.deepcopy(spider), "name": "odd", "query": {"query": "up", "refId": "odd"}},
    ]
    model, problems = parse(broken)
    assert model is not None and problems == []
    uids = datasource_uids()

    panel_problems = "\n".join(check_panels(model, uids))
    assert "panel 4 " in panel_problems and "unknown panel type 'no-such-panel'" in panel_problems
    assert re.search(r"panel 5 .*datasource None is not the provisioned", panel_problems)
    assert re.search(r"panel 6 .*no query", panel_problems)

    variable_problems, variable_promql = check_variable_queries(model, uids, exported)
    text = "\n".join(variable_problems)
    assert "variable 'spider': bloomcrawl_filter_capacity has no label 'no_such_label'" in text
    assert "variable 'odd': 'up' is not a Prometheus variable query" in text

    queries = panel_queries(model) + variable_promql
    promql = "\n".join(check_promql(queries, model, tmp_path))
    assert re.search(r"panel 1 .*parse error", promql)
    assert re.search(r"variable 'bad': .*parse error", promql)
    assert len(promql.splitlines()) == 2, promql

    metric_problems = "\n".join(check_metrics(queries, model, exported))
    assert re.search(r"panel 2 .*bloomcrawl_no_such_metric is not a metric the exporter",
                     metric_problems)
    assert re.search(r"panel 8 .*bloomcrawl_queue_requests has no label \['no_such_label'\]",
                     metric_problems)

    assert check_variables_defined(model) == [
        "panel 3 'Estimated false-positive rate' query 'A': $nope is not a variable of the"
        " dashboard (['bad', 'odd', 'spider'])"]

    assert check_round_trip(broken, model) == [
        "panels[6].targets[0].legendFormt: dropped by the SDK (misspelled, or not in this"
        " Grafana's schema)"]

    assert parse({"panels": "not a list"})[1], "a dashboard the SDK cannot read"
    assert parse([])[1]

    # and the real dashboard has none of these problems
    real, _ = parse(raw)
    assert real is not None
    assert check_panels(real, uids) == check_variables_defined(real) == []
    assert check_round_trip(raw, real) == []
