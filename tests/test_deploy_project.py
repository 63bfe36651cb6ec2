"""``bloomcrawl deploy --project-dir``: a user's own Scrapy project on real scrapyd nodes.

``tests/userproject`` has no setup.py, and spiders that import ``pricefmt``,
which its requirements.txt names (``./vendor/pricefmt``) and the test
interpreter does not have. The nodes are real scrapyd processes on free
ports (:class:`kit.scrapyd.ScrapydNode`); the CLI runs in-process.
The project is copied first: pip builds ./vendor/pricefmt in place.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from shopsite import serve_shop

from bloomcrawl.ops import cli, requirements, scrapyd
from bloomcrawl.ops.cluster.compose import PROJECT_PACKAGES
from bloomcrawl.ops.cluster.processes import free_port
from bloomcrawl.ops.cluster.state import Cluster, Paths, save_cluster
from bloomcrawl.ops.console import OpsError

from kit import ROOT
from kit.redis import RedisServer
from kit.scrapyd import PASSWORD, USERNAME, ScrapydNode
from kit.wait import wait_until

USERPROJECT = ROOT / "tests" / "userproject"
SPIDERS = ["catalog", "deals", "direct", "inline", "listing", "news", "outage", "redis_catalog",
           "redis_seeds", "sitemap", "starter", "stock"]
NO_PRICEFMT = ("the project's spiders do not import on this node: No module named 'pricefmt'"
               " (add it to requirements.txt)")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """tests/userproject, copied to a directory whose name is not the project's."""
    dest = tmp_path / "my-shop"
    shutil.copytree(USERPROJECT, dest, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info"))
    return dest


@pytest.fixture
def paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Paths:
    """The CLI's state and .env in ``tmp_path``; no cluster recorded yet."""
    env_file = tmp_path / ".env"
    env_file.write_text(f"SCRAPYD_USERNAME={USERNAME}\nSCRAPYD_PASSWORD={PASSWORD}\n")
    monkeypatch.setenv("BLOOMCRAWL_ROOT", str(ROOT))
    monkeypatch.setenv("BLOOMCRAWL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("BLOOMCRAWL_ENV_FILE", str(env_file))
    monkeypatch.setenv("SCRAPYD_USERNAME", USERNAME)
    monkeypatch.setenv("SCRAPYD_PASSWORD", PASSWORD)
    for name in ("SCRAPYD_NODES", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    return Paths.from_environment()


@pytest.fixture
def bare_nodes(scrapyd_nodes: Callable[..., ScrapydNode],
               redis_server: RedisServer) -> list[ScrapydNode]:
    """Two scrapyd nodes with nothing on their PYTHONPATH."""
    return [scrapyd_nodes(f"node-{i}", redis_url=redis_server.url) for i in (1, 2)]


@pytest.fixture
def local_cluster(scrapyd_nodes: Callable[..., ScrapydNode], redis_server: RedisServer,
                  paths: Paths) -> list[ScrapydNode]:
    """Two scrapyd nodes recorded as a local cluster, started as the local cluster starts
    its nodes: with the projects' requirements directory on their PYTHONPATH."""
    nodes = [scrapyd_nodes(f"node-{i}", redis_url=redis_server.url,
                           pythonpath=paths.project_packages) for i in (1, 2)]
    records = [dataclasses.replace(node.process.record, name=f"scrapyd-{i}")
               for i, node in enumerate(nodes, 1) if node.process is not None]
    save_cluster(paths, Cluster("local", redis_server.url, USERNAME, PASSWORD,
                                processes=records, ports={"redis": redis_server.port}))
    return nodes


def deploy(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    """``bloomcrawl deploy ARGS`` in-process: (exit code, stdout lines, stderr)."""
    code = cli.main(["deploy", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_the_egg_of_a_project_without_setup_py_holds_its_package(
        project: Path, tmp_path: Path) -> None:
    egg = tmp_path / "shopcrawl.egg"
    scrapyd.build_egg(project, egg)
    with zipfile.ZipFile(egg) as archive:
        names = set(archive.namelist())
        entry_points = archive.read("EGG-INFO/entry_points.txt").decode()
        info = archive.read("EGG-INFO/PKG-INFO").decode()
    assert {"shopcrawl/__init__.py", "shopcrawl/settings.py", "shopcrawl/items.py",
            "shopcrawl/spiders/__init__.py"} <= names
    assert {f"shopcrawl/spiders/{spider}.py" for spider in SPIDERS} <= names
    assert "settings = shopcrawl.settings" in entry_points
    assert "Name: project\n" in info  # the setup.py scrapyd-deploy writes when there is none
    # the dependency is not in the egg: requirements.txt brings it
    assert not [n for n in names if n.startswith(("vendor/", "pricefmt/"))], names
    # built in a copy: the project's directory is left as it was
    assert sorted(p.name for p in project.iterdir()) == [
        "requirements.txt", "scrapy.cfg", "shopcrawl", "vendor"]


def test_deploy_fails_naming_the_module_the_spiders_cannot_import(
        project: Path, paths: Paths, bare_nodes: list[ScrapydNode],
        capsys: pytest.CaptureFixture[str]) -> None:
    urls = ",".join(node.url for node in bare_nodes)
    code, out, err = deploy(capsys, "--nodes", urls, "--project-dir", str(project),
                            "--version", "1")
    assert code == 1, (out, err)
    assert out == [
        "requirements.txt: not installed (nodes given by address; bloomcrawl installs it on"
        " the cluster `up` started): the upload checks that the spiders import",
        *[f"FAIL {node.url}: {NO_PRICEFMT}" for node in bare_nodes],
        "deployed shopcrawl 1 to 0 of 2 node(s)"]
    # the broken version was deleted again: no job can ever start it
    for node in bare_nodes:
        assert "shopcrawl" not in node.node.request("listprojects.json")["projects"]


@pytest.mark.long
@pytest.mark.slow
def test_deploy_installs_the_requirements_for_a_local_cluster_then_a_job_runs(
        project: Path, paths: Paths, local_cluster: list[ScrapydNode], redis_server: RedisServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    # --no-requirements: nothing installed, and the check of the upload says what is missing
    code, out, _ = deploy(capsys, "--project-dir", str(project), "--no-requirements",
                          "--version", "1")
    assert code == 1
    assert out[:2] == [f"FAIL {node.url}: {NO_PRICEFMT}" for node in local_cluster], out

    code, out, err = deploy(capsys, "--project-dir", str(project), "--version", "2")
    assert code == 0, (out, err)
    assert out == [
        f"requirements.txt: installed pricefmt 1.0.0 for the local workers in"
        f" {paths.project_packages} (the workers have scrapy {version('scrapy')},"
        f" scrapy-redis {version('scrapy-redis')})",
        *[f"ok   {node.url}: shopcrawl 2, spiders: {', '.join(SPIDERS)}"
          for node in local_cluster],
        "deployed shopcrawl 2 to 2 of 2 node(s)"]
    installed = sorted(p.name for p in paths.project_packages.iterdir())
    assert installed == ["pricefmt", "pricefmt-1.0.0.dist-info"], installed
    for node in local_cluster:
        assert node.node.list_spiders("shopcrawl") == SPIDERS
        assert node.node.request("listversions.json?project=shopcrawl")["versions"] == ["2"]

    # schedule --project: a job of the project on every node imports pricefmt and ends
    closed = f"http://127.0.0.1:{free_port()}"
    assert cli.main(["schedule", "--project", "shopcrawl", "--spider", "catalog",
                     "--max-idle", "1", "-a", f"shop_url={closed}",
                     "-s", f"REDIS_URL={redis_server.url}"]) == 0
    jobs = dict(line.split() for line in capsys.readouterr().out.splitlines())
    assert sorted(jobs) == sorted(node.url for node in local_cluster)
    for node in local_cluster:
        log = node.wait_finished("shopcrawl", "catalog", jobs[node.url])
        assert "No module named" not in log and "Spider closed (finished)" in log, log[-3000:]


@pytest.mark.slow
def test_without_project_the_deployed_project_that_has_the_spider_is_used(
        project: Path, paths: Paths, local_cluster: list[ScrapydNode], redis_server: RedisServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``schedule``, ``crawl`` and ``cancel`` without ``--project`` (the bundled project's
    name was the default, and a user's own project then 'was not found'): the one project
    deployed, or the only one with the spider; several or none is an error naming them,
    and nothing is scheduled."""
    assert deploy(capsys, "--project-dir", str(project), "--version", "1")[0] == 0
    closed = f"http://127.0.0.1:{free_port()}"
    schedule = ["schedule", "--spider", "catalog", "-a", f"shop_url={closed}",
                "-s", f"REDIS_URL={redis_server.url}"]
    assert cli.main([*schedule, "--max-idle", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "project shopcrawl: the one deployed", out
    jobs = dict(line.split() for line in out[1:])
    for node in local_cluster:
        log = node.wait_finished("shopcrawl", "catalog", jobs[node.url])
        assert "Spider closed (finished)" in log, log[-3000:]

    # the same project under a second name, with the spiders of both: which is meant?
    assert deploy(capsys, "--project-dir", str(project), "--project", "shop2", "--version", "1",
                  "--no-requirements")[0] == 0

    def ran_jobs() -> int:
        return sum(len(node.node.list_jobs(name)[state]) for node in local_cluster
                   for name in ("shopcrawl", "shop2") for state in ("pending", "running",
                                                                    "finished"))

    before = ran_jobs()
    assert cli.main(schedule) == 1
    assert capsys.readouterr().err == ("bloomcrawl schedule: spider catalog is in projects"
                                       " shop2, shopcrawl: pass --project NAME\n")
    assert cli.main(["crawl", "--spider", "nosuch", closed]) == 1
    assert capsys.readouterr().err == ("bloomcrawl crawl: no deployed project has a spider"
                                       " nosuch (deployed: shop2, shopcrawl): pass --spider,"
                                       " or --project NAME\n")
    assert ran_jobs() == before
    assert redis_server.client().llen("nosuch:start_urls") == 0

    # cancel without --project: the spider's jobs in every project (these never idle out)
    assert cli.main([*schedule, "--project", "shop2"]) == 0
    capsys.readouterr()
    assert cli.main(["cancel", "--spider", "catalog"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "cancelled 2 job(s) of catalog on 2 of 2 node(s)", out
    for node in local_cluster:
        wait_until(lambda node=node: not any(node.node.list_jobs("shop2")[state]
                                             for state in ("pending", "running")),
                   60, what="the cancelled jobs' end")


@pytest.mark.long
def test_crawl_wait_of_a_spider_that_starts_itself_without_and_with_a_start_url(
        project: Path, paths: Paths, local_cluster: list[ScrapydNode], redis_server: RedisServer,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``crawl`` with no URL runs the spider's own start requests; the progress counts this
    crawl's pages; a URL the spider cannot take is refused, and the wait says so."""
    assert deploy(capsys, "--project-dir", str(project), "--version", "1")[0] == 0
    with serve_shop(12) as shop:
        args = ["crawl", "--project", "shopcrawl", "--spider", "starter", "-a",
                f"shop_url={shop.url}", "-s", f"REDIS_URL={redis_server.url}", "--wait",
                "--timeout", "120"]
        assert cli.main([*args, "--max-idle", "1"]) == 0
        out, err = capsys.readouterr()
        assert "starter running on 2 node(s), from its own start requests" in out, out
        # 3 pages, their 3 items and the one start() yields: every node runs start(), and
        # one of them takes its items
        assert out.splitlines()[-1].startswith("[") and " pages 3  items 4 " in out, out
        # again, with a start URL: the same 3 pages (this crawl's), the URL refused
        assert cli.main([*args, "--max-idle", "1", shop.url + "/category/books"]) == 0
        out, err = capsys.readouterr()
        assert "seeded 1 URL(s)" in out and " pages 3 " in out.splitlines()[-1], out
        assert ("this crawl counted 0 error(s) (callbacks that raised, downloads that failed"
                " for good) and 1 refused start URL entry") in err, err
        assert sum(shop.hits().values()) == 6
        # without --max-idle the wait warns that nothing may end the jobs
        code = cli.main([*args, "--timeout", "1"])
        out, err = capsys.readouterr()
        assert code == 1 and "without --max-idle the jobs end only if" in err, err
        wait_until(lambda: sum(shop.hits().values()) == 9, 60, what="the third crawl's pages")
        assert "stop them with bloomcrawl cancel --project shopcrawl --spider starter" in err
        assert cli.main(["cancel", "--project", "shopcrawl", "--spider", "starter"]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[-1] == "cancelled 2 job(s) of starter on 2 of 2 node(s)", out

        def ended() -> bool:
            return not any(node.node.request("listjobs.json?project=shopcrawl")[state]
                           for node in local_cluster for state in ("pending", "running"))

        wait_until(ended, 60, what="the cancelled jobs' end")
        # a crawl after a cancelled one is a crawl of its own: its start requests again
        assert cli.main([*args, "--max-idle", "1"]) == 0
        out, err = capsys.readouterr()
        assert " pages 3 " in out.splitlines()[-1], out
        assert sum(shop.hits().values()) == 12
        # a crawl whose jobs all fail (a revisit window the stored filter does not have)
        # takes back the start URL it pushed: the next crawl must not start from it
        bad = [*args, "--max-idle", "1", "-s", "BLOOMFILTER_REVISIT_AFTER=3600"]
        assert cli.main([*bad, shop.url + "/category/toys"]) == 1
        out, err = capsys.readouterr()
        assert "FilterMismatchError" in err, err
        assert "every job failed: took back the 1 start URL(s) this crawl pushed" in err, err
        assert redis_server.client().llen("starter:start_urls") == 0
        assert sum(shop.hits().values()) == 12
    # a shop that is gone: the downloads fail, and the wait says which besides how many
    dead = "http://127.0.0.1:%d" % free_port()
    dead_args = [arg.replace(f"shop_url={shop.url}", f"shop_url={dead}") for arg in args]
    assert cli.main([*dead_args, "--max-idle", "1", "-s", "RETRY_TIMES=0"]) == 1
    out, err = capsys.readouterr()
    assert "this crawl counted 3 error(s)" in err, err
    # which ones, in the order the logs have them (Scrapy logs two lines a failure)
    assert re.search(r"Error downloading <GET %s/category/(books|games|tools)>"
                     % re.escape(dead), err), err


def version(name: str) -> str:
    return requirements.worker_environment([sys.executable]).packages[name]


@pytest.mark.parametrize(("name", "reason"), [
    ("no-such-project", "no such directory"),
    ("empty", "no scrapy.cfg in it (give the directory of the Scrapy project's scrapy.cfg)"),
])
def test_a_project_dir_that_is_not_a_project_is_a_one_line_error(
        name: str, reason: str, tmp_path: Path, paths: Paths,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    if name == "empty":
        path.mkdir()
    code, out, err = deploy(capsys, "--project-dir", str(path))
    assert (code, out) == (1, [])
    assert err == f"bloomcrawl deploy: --project-dir {path}: {reason}\n"


MODULE_MISSING = """Traceback (most recent call last):
  File "/n/eggs/shopcrawl/1.egg/shopcrawl/spiders/catalog.py", line 8, in <module>
    from shopcrawl.util import money
ModuleNotFoundError: No module named 'shopcrawl.util'
"""
SYNTAX_ERROR = """Traceback (most recent call last):
  File "<frozen zipimport>", line 695, in _compile_source
  File "/n/eggs/shopcrawl/1.egg/shopcrawl/spiders/deals.py", line 2
    def (:
        ^
SyntaxError: invalid syntax
"""


@pytest.mark.parametrize(("traceback", "line"), [
    (MODULE_MISSING, "the project's spiders do not import on this node: No module named"
     " 'shopcrawl.util' (a module of the project that is not in the egg: a package needs an"
     " __init__.py)"),
    (SYNTAX_ERROR, "the project's spiders fail to load on this node: SyntaxError: invalid"
     " syntax (shopcrawl/spiders/deals.py, line 2)"),
    ("ImportError: cannot import name 'parse' from 'pricefmt'\n",
     "the project's spiders do not import on this node: cannot import name 'parse' from"
     " 'pricefmt'"),
], ids=["own-module", "syntax-error", "import-error"])
def test_a_failed_scrapy_list_is_told_in_one_line(traceback: str, line: str) -> None:
    assert scrapyd.load_failure(traceback, {"shopcrawl"}) == line


# --- requirements.txt as the workers read it -------------------------------------------


WORKERS = requirements.WorkerEnvironment("3.11.7", {"scrapy": "2.19.0", "scrapy-redis": "0.9.1"})


def test_requirements_the_workers_have_are_left_out_and_includes_are_followed(
        tmp_path: Path) -> None:
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "base.txt").write_text("Scrapy_Redis  # theirs\n-c pins.txt\n")
    (tmp_path / "requirements.txt").write_text(
        "# comment\nScrapy>=2.11 \\\n  ; python_version >= '3'\n./vendor/pricefmt\n"
        "-r more/base.txt\nscrapy[extra]\nlxml==5.0 --hash=sha256:00\n")
    found = requirements.read_requirements(tmp_path / "requirements.txt", WORKERS)
    assert found.provided == ["Scrapy 2.19.0", "Scrapy_Redis 0.9.1"]
    assert found.lines == ["./vendor/pricefmt", f"-c {tmp_path / 'more' / 'pins.txt'}",
                           "scrapy[extra]", "lxml==5.0 --hash=sha256:00"]


def test_a_requirement_that_would_replace_a_workers_package_is_an_error(
        tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("pricefmt\nscrapy==2.11.0\n")
    with pytest.raises(OpsError) as caught:
        requirements.read_requirements(tmp_path / "requirements.txt", WORKERS)
    assert str(caught.value) == (
        f"{tmp_path / 'requirements.txt'}:2: 'scrapy==2.11.0' asks for another scrapy than the"
        " workers' 2.19.0, which scrapyd and bloomcrawl run on: a project's requirements"
        " cannot replace the workers' own packages")


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``files``, written by hand."""
    info = f"{name}-{version}.dist-info"
    contents = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\n"
                f"Version: {version}\n", f"{info}/WHEEL": "Wheel-Version: 1.0\n"
                "Generator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    contents[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*contents, f"{info}/RECORD"])
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in contents.items():
            archive.writestr(path, text)
    return wheel


def test_a_worker_container_installs_wheels_from_stdin_replacing_older_versions(
        tmp_path: Path) -> None:
    """What ``deploy`` runs in each worker container, run by this interpreter."""
    target = tmp_path / "project-packages"
    command = requirements.install_command([sys.executable], str(target))
    old = make_wheel(tmp_path, "pricefmt", "1.0.0", {"pricefmt/__init__.py": "",
                                                     "pricefmt/legacy.py": ""})
    requirements.send_wheels(command, [old], what="installing 1.0.0")
    assert (target / "pricefmt" / "legacy.py").is_file()
    new_dir = tmp_path / "new"
    new_dir.mkdir()
    new = make_wheel(new_dir, "pricefmt", "1.1.0", {"pricefmt/__init__.py": "VERSION = 2\n"})
    requirements.send_wheels(command, [new], what="installing 1.1.0")
    assert sorted(p.name for p in target.iterdir()) == ["pricefmt", "pricefmt-1.1.0.dist-info"]
    assert sorted(p.name for p in (target / "pricefmt").iterdir() if p.suffix == ".py") == [
        "__init__.py"]
    result = subprocess.run([sys.executable, "-c", "import pricefmt; print(pricefmt.VERSION)"],
                            env={"PYTHONPATH": str(target)}, capture_output=True, text=True,
                            check=True)
    assert result.stdout == "2\n"


def test_the_worker_image_has_the_project_packages_on_its_pythonpath() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"ENV PYTHONPATH={PROJECT_PACKAGES}\n" in dockerfile
    assert f"install -d -o scrapyd -g scrapyd {PROJECT_PACKAGES}\n" in dockerfile
