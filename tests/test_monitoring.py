"""Prometheus config, alert rules and the Grafana dashboard, checked by the real tools.

promtool checks the config and the rules and runs their unit tests; then a
real Prometheus (the Debian package's binary) scrapes the real exporter while
a real ``scrapy crawl site`` crawls the demo site, and every query of every
dashboard panel and every metric every alert reads returns data from it. The
crawl runs on the scrapyd node's host, so its pages per node carry that node's
label.
promtool and prometheus are required: ``make test`` installs them, and these
tests fail rather than skip without them.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bloomcrawl.ops.cluster.processes import free_port, start_prometheus
from bloomcrawl.ops.demo_site import serve_in_thread
from bloomcrawl.ops.noproxy import OPENER
from bloomcrawl.ops.runs import FINISHED, Run, RunStore
from bloomcrawl.ops.schedules import ScheduleStore, Spec

from kit import ROOT
from kit.exporter import Exporter
from kit.fixtures import installed
from kit.redis import RedisServer
from kit.scrapyd import ScrapydNode
from kit.wait import wait_until
from kit.workers import Worker, WorkerPool

MONITORING = ROOT / "monitoring"
PROMETHEUS_DIR = MONITORING / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
GRAFANA = MONITORING / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER = GRAFANA / "provisioning" / "dashboards" / "bloomcrawl.yml"
CRAWL_PAGES = 1000
SITE_DELAY_MS = 20  # with CONCURRENT_REQUESTS=2 below: the crawl takes 10 s at the least


def run(cmd: list[str], cwd: Path = ROOT) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def alert_names() -> list[str]:
    return re.findall(r"^\s*- alert:\s*(\S+)", ALERTS.read_text(), re.M)


def dashboard_targets(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows included."""
    out = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop(0)
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    return out


def as_prometheus_query(expr: str) -> str:
    """A panel query with Grafana's variables set as the dashboard's defaults would."""
    return (expr.replace("$__rate_interval", "1m")
            .replace("$__interval", "15s")
            .replace("$spider", ".*"))


# --- promtool -------------------------------------------------------------------------


def test_promtool_check_config() -> None:
    out = run([installed("promtool"), "check", "config", str(PROMETHEUS_CONFIG)])
    assert "SUCCESS" in out and "1 rule files found" in out


def test_promtool_check_rules() -> None:
    out = run([installed("promtool"), "check", "rules", str(ALERTS)])
    assert f"SUCCESS: {len(alert_names())} rules found" in out


def test_promtool_test_rules() -> None:
    assert RULE_TESTS
    out = run([installed("promtool"), "test", "rules", *[str(p) for p in RULE_TESTS]],
              cwd=PROMETHEUS_DIR)
    assert "SUCCESS" in out and "FAILED" not in out


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    names = alert_names()
    assert len(names) == len(set(names)) >= 6
    text = "\n".join(p.read_text() for p in RULE_TESTS)
    # each "alertname: X" case up to the next case
    cases = re.findall(r"alertname:\s*(\S+)(.*?)(?=\n\s*- eval_time:|\n\s*- name:|\Z)", text, re.S)
    fires = {name for name, body in cases if "exp_labels" in body}
    quiet = {name for name, body in cases if re.search(r"exp_alerts:\s*\[\]", body)}
    assert set(names) - fires == set(), "alerts without a firing test"
    assert set(names) - quiet == set(), "alerts without a test where they stay quiet"
    assert {name for name, _ in cases} <= set(names), "tests of alerts that do not exist"
    for required in ("BloomcrawlFilterNearCapacity", "BloomcrawlFalsePositiveRateAboveTarget",
                     "BloomcrawlQueueNotDraining", "BloomcrawlWorkerDown",
                     "BloomcrawlRedisDown", "BloomcrawlExporterDown"):
        assert required in names


def test_prometheus_scrapes_the_exporter_service_and_itself() -> None:
    text = PROMETHEUS_CONFIG.read_text()
    assert re.search(r'job_name:\s*bloomcrawl\s*\n\s*static_configs:\s*\n\s*- targets:\s*'
                     r'\["exporter:9410"\]', text)
    assert re.search(r'job_name:\s*prometheus\s*\n\s*static_configs:\s*\n\s*- targets:\s*'
                     r'\["localhost:9090"\]', text)


# --- Grafana ---------------------------------------------------------------------------


def test_dashboard_is_provisionable_as_is() -> None:
    datasource_uid = re.search(r"^\s*uid:\s*(\S+)", DATASOURCES.read_text(), re.M)
    assert datasource_uid is not None
    provider = DASHBOARD_PROVIDER.read_text()
    assert re.search(r"^\s*path:\s*/var/lib/grafana/dashboards\s*$", provider, re.M)
    assert [p.name for p in DASHBOARDS] == ["bloomcrawl-overview.json"]
    for path in DASHBOARDS:
        raw = path.read_text()
        assert "${DS_" not in raw and "__inputs" not in raw and "__requires" not in raw
        dashboard = json.loads(raw)
        assert dashboard["uid"] == "bloomcrawl-overview"
        assert dashboard["title"] == "bloomcrawl overview"
        assert dashboard.get("id") is None
        datasources = re.findall(r'"datasource":\s*\{[^}]*"uid":\s*"([^"]+)"', raw)
        assert datasources and set(datasources) == {datasource_uid.group(1)}
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dashboard["panels"]:
            if panel["type"] == "row":
                assert "targets" not in panel, panel["title"]
                continue
            assert panel["targets"], panel["title"]
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, panel["title"]
        titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
        for wanted in ("fill", "false-positive", "duplicates filtered per second",
                       "pages per second", "pages per second per node", "queue and leases",
                       "nodes up", "redis memory", "recurring crawls",
                       "current run of each schedule", "last runs",
                       "schedules: last and next fire", "last firing outcome"):
            assert wanted in titles, wanted


# --- a real Prometheus, the real exporter, a real crawl -----------------------------------


class Prometheus:
    """A prometheus process this test owns, with the project's config retargeted."""

    def __init__(self, workdir: Path, exporter_port: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = PROMETHEUS_CONFIG.read_text()
        replacements = {
            '"exporter:9410"': f'"127.0.0.1:{exporter_port}"',
            '"localhost:9090"': f'"127.0.0.1:{self.port}"',
            "scrape_interval: 15s": "scrape_interval: 1s",
            "scrape_timeout: 10s": "scrape_timeout: 1s",
            "evaluation_interval: 15s": "evaluation_interval: 1s",
            "  - alerts.yml": f"  - {ALERTS}",
        }
        for old, new in replacements.items():
            assert config.count(old) == 1, f"{old!r} not once in {PROMETHEUS_CONFIG}"
            config = config.replace(old, new)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(config)
        installed("prometheus")  # fails the test, saying how to install it, when it is missing
        # started, and ready (its /-/ready answers), by the project's process manager
        self.process = start_prometheus(
            workdir / "prometheus.yml", workdir / "data", port=self.port,
            log=workdir / "prometheus.log", extra_args=["--log.level=warn"], cwd=workdir)

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with OPENER.open(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 60) -> list[dict[str, Any]]:
        """The result of ``expr`` once it has data (Prometheus scrapes every second)."""
        return wait_until(lambda: self.query(expr), timeout, interval=0.25,
                          what=f"data for {expr!r}")

    def stop(self) -> None:
        # its data is thrown away: a graceful exit (seen taking 15 s) saves nothing
        self.process.stop(timeout=3)


def recurring_crawl(client: redis.Redis) -> None:
    """A schedule of the crawl's spider, fired twice: its first run ended, the second runs
    (the timer is not running here: the test records what it would have)."""
    store = ScheduleStore(client)
    made = store.add(Spec("hourly", "site", "bloomcrawl", every=3600).check())
    runs = RunStore(client)
    for n, slot in enumerate((made.created - 3600, made.created)):
        run = Run("hourly-%d" % n, "hourly", "site", "bloomcrawl", slot, slot + 1,
                  jobs={"http://127.0.0.1:6800": "job%d" % n}, stats_end={"pages": 5 + n})
        runs.start(run)
        if n == 0:
            run.status, run.finished, run.reasons = FINISHED, slot + 60, {"job0": "finished"}
            runs.save(run)
    assert store.claim("hourly", made.created, "timer-1")
    store.record("hourly", {"slot": made.created, "fired_at": made.created + 1,
                            "manual": False, "result": "started", "run": "hourly-1",
                            "started": {}, "refused": {}, "reason": ""})


@pytest.fixture
def monitored_crawl(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis,
    scrapyd_node: ScrapydNode, worker_pool: WorkerPool,
) -> Iterator[tuple[Prometheus, Worker, str]]:
    """Demo site + ``scrapy crawl site`` + exporter + Prometheus, all on 127.0.0.1."""
    closed_node = f"127.0.0.1:{free_port()}"
    prometheus: Prometheus | None = None
    with serve_in_thread(pages=CRAWL_PAGES, delay_ms=SITE_DELAY_MS) as site, Exporter(
            redis_server.url, tmp_path, nodes=[scrapyd_node.url, closed_node],
            env={"SCRAPYD_USERNAME": scrapyd_node.username,
                 "SCRAPYD_PASSWORD": scrapyd_node.password}) as exporter:
        try:
            prometheus = Prometheus(tmp_path / "prometheus", exporter.port)
            prometheus.wait_for('up{job="bloomcrawl"} == 1')
            recurring_crawl(redis_client)
            redis_client.rpush("site:start_urls", site.url)
            # the kit's filter settings: no false positive drops a page the test counts
            worker = worker_pool.start("worker", redis_server.url, {"CONCURRENT_REQUESTS": "2"})
            yield prometheus, worker, closed_node
        finally:
            worker_pool.close()
            if prometheus is not None:
                prometheus.stop()


@pytest.mark.long
def test_every_panel_and_alert_query_returns_data_from_a_real_crawl(
    monitored_crawl: tuple[Prometheus, Worker, str],
    scrapyd_node: ScrapydNode,
) -> None:
    prometheus, worker, closed_node = monitored_crawl
    # scrapyd's node_name is this host's name, which the crawl's scheduler records
    node = f"127.0.0.1:{scrapyd_node.port}"
    # the crawl is under way, seen through the exporter by Prometheus
    prometheus.wait_for('bloomcrawl_pages_total{spider="site"} > 0', timeout=90)
    prometheus.wait_for('bloomcrawl_queue_requests{spider="site"} > 0', timeout=30)
    # duplicates: a worker drops the links it sent lately itself (the shared count has
    # them all); the filter answers for the rest, and checks every new one
    prometheus.wait_for('bloomcrawl_requests_filtered_total{spider="site"} > 0')
    prometheus.wait_for('bloomcrawl_filter_checked_total{spider="site"} > 0')
    prometheus.wait_for('count_over_time(bloomcrawl_pages_total{spider="site"}[1m]) >= 5')
    # Prometheus saw the crawl under way, not only its end: the site's delay makes the
    # crawl last at least CRAWL_PAGES * SITE_DELAY_MS / CONCURRENT_REQUESTS (10 s), many
    # times the 1 s scrape interval, however loaded the machine
    assert prometheus.query(
        f'count_over_time((bloomcrawl_pages_total{{spider="site"}} > 0 < {CRAWL_PAGES})[5m:1s])')
    assert prometheus.query('rate(bloomcrawl_pages_total{spider="site"}[1m]) > 0')
    per_node = prometheus.wait_for(
        'rate(bloomcrawl_node_pages_total{spider="site"}[1m]) > 0')
    assert [r["metric"]["node"] for r in per_node] == [node]

    # the recurring crawl, as the exporter reports it
    prometheus.wait_for('bloomcrawl_schedule_last_outcome{schedule="hourly",spider="site",'
                        'result="started"} == 1')
    assert prometheus.query('bloomcrawl_schedule_overdue_seconds{schedule="hourly"} == 0')
    assert prometheus.query('bloomcrawl_run_running{schedule="hourly",ago="0"} == 1')
    assert prometheus.query('bloomcrawl_run_pages{schedule="hourly",ago="1"} == 5')
    assert prometheus.query('bloomcrawl_run_finished_jobs{schedule="hourly",ago="1",'
                            'reason="finished"} == 1')
    assert not prometheus.query('{__name__=~"bloomcrawl_run_.*", ago="2"}')

    # every query of every panel
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for title, expr in dashboard_targets(dashboard):
            query = as_prometheus_query(expr)
            assert "$" not in query, (title, query)
            assert prometheus.query(query), f"panel {title!r}: no data for {query!r}"
        for variable in dashboard["templating"]["list"]:
            match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"])
            assert match, variable["definition"]
            values = prometheus.api(f"label/{match.group(2)}/values",
                                    **{"match[]": match.group(1)})
            assert "site" in values

    # every alert: loaded from the project's rule file, evaluated without error, and every
    # series it reads has data (its threshold may legitimately leave the result empty)
    rules = {r["name"]: r for g in prometheus.api("rules")["groups"] for r in g["rules"]}
    assert set(rules) == set(alert_names())

    def evaluated() -> dict[str, Any] | None:
        rules = {r["name"]: r for g in prometheus.api("rules")["groups"] for r in g["rules"]}
        return None if any(r["lastEvaluation"].startswith("0001")
                           for r in rules.values()) else rules

    rules = wait_until(evaluated, 30, interval=0.25, what="every rule evaluated")
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        prometheus.query(rule["query"])  # a valid query
        selectors = re.findall(r"\b((?:bloomcrawl_\w+|up)(?:\{[^}]*\})?)", rule["query"])
        assert selectors, name
        for selector in selectors:
            assert prometheus.query(selector), f"alert {name}: no data for {selector!r}"
    # the closed port is a worker down, seen by the rule on real data
    worker_down = prometheus.query(rules["BloomcrawlWorkerDown"]["query"])
    assert [r["metric"]["node"] for r in worker_down] == [closed_node]
    alerts = prometheus.api("alerts")["alerts"]
    assert any(a["labels"]["alertname"] == "BloomcrawlWorkerDown"
               and a["labels"]["node"] == closed_node for a in alerts)

    # the crawl completes and Prometheus's last word agrees with it
    assert worker.wait(120) == 0, worker.tail()
    prometheus.wait_for(f'bloomcrawl_pages_total{{spider="site"}} == {CRAWL_PAGES}')
    prometheus.wait_for(
        f'bloomcrawl_node_pages_total{{spider="site",node="{node}"}} == {CRAWL_PAGES}')
    prometheus.wait_for('bloomcrawl_queue_requests{spider="site"} == 0')
    prometheus.wait_for('bloomcrawl_leased_requests{spider="site"} == 0')
