"""A project's egg for scrapyd: built as ``scrapyd-deploy`` builds it, and what a failed load says.

:func:`build_egg` builds and checks the egg :func:`bloomcrawl.ops.scrapyd.deploy`
uploads; :func:`load_failure` turns the traceback a node gives back when the
project's spiders do not import there into one line. Nothing here talks to a
node.
"""

from __future__ import annotations

import configparser
import io
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from bloomcrawl.ops.console import OpsError

BUILD_EGG_TIMEOUT = 300.0

#: the last line of an ImportError's traceback
_IMPORT_ERROR = re.compile(r"^(?P<kind>ModuleNotFoundError|ImportError): (?P<message>.*)$")
_NO_MODULE = re.compile(r"No module named '(?P<module>[^']+)'")
#: a traceback's frame in a file of the egg: ``File ".../eggs/p/1.egg/p/spiders/x.py", line 2``
_EGG_FRAME = re.compile(r'^File "[^"]*\.egg/(?P<path>[^"]+)", line (?P<line>\d+)')


def load_failure(traceback: str, own_packages: Iterable[str] = ()) -> str:
    """One line out of the traceback of a failed ``scrapy list``: what does not import.

    ``own_packages``: the egg's top-level packages. A module missing from those
    is the project's own, which no requirements.txt brings.
    """
    lines = [line.strip() for line in traceback.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        found = _IMPORT_ERROR.match(line)
        if found is None:
            continue
        hint = ""
        missing = _NO_MODULE.search(found["message"])
        if found["kind"] == "ModuleNotFoundError" and missing is not None:
            if missing["module"].split(".")[0] in set(own_packages):
                hint = " (a module of the project that is not in the egg: a package needs an" \
                       " __init__.py)"
            else:
                hint = " (add it to requirements.txt)"
        return "the project's spiders do not import on this node: %s%s" % (
            found["message"], hint)
    # where in the project it went wrong: the last frame in the egg (a SyntaxError's file)
    where = ""
    for line in reversed(lines):
        frame = _EGG_FRAME.match(line)
        if frame is not None:
            where = " (%s, line %s)" % (frame["path"], frame["line"])
            break
    return "the project's spiders fail to load on this node: %s%s" % (
        lines[-1] if lines else "scrapy list failed", where)


def egg_packages(egg: bytes) -> set[str]:
    """The top-level packages and modules of an egg."""
    with zipfile.ZipFile(io.BytesIO(egg)) as archive:
        names = archive.namelist()
    return {name.split("/")[0].removesuffix(".py") for name in names
            if not name.startswith("EGG-INFO/")}


def _not_in_egg(directory: str, names: list[str]) -> set[str]:
    """What a copy of a project for its egg leaves out: hidden entries (.git, .scrapy's cache),
    virtualenvs, bytecode, and earlier builds at the top."""
    top = (Path(directory) / "scrapy.cfg").is_file()
    return {name for name in names
            if name.startswith(".") or name == "__pycache__"
            or (Path(directory, name) / "pyvenv.cfg").is_file()
            or (top and (name in ("build", "dist") or name.endswith((".egg-info", ".egg"))))}


def build_egg(project_dir: Path, out: Path) -> None:
    """``scrapyd-deploy --build-egg``: the same egg ``scrapyd-deploy`` would upload.

    It is built in a copy of the project: scrapyd-deploy writes a ``setup.py``
    there when the project has none (``find_packages()``, the settings module
    of scrapy.cfg as its entry point), and setuptools ``build/`` and an
    ``.egg-info``; the project's own directory is left as it is. The egg must
    hold the settings module its entry point names.
    """
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-build-") as tmp:
        copy = Path(tmp) / project_dir.name
        shutil.copytree(project_dir, copy, ignore=_not_in_egg, symlinks=True)
        try:
            result = subprocess.run(
                [sys.executable, "-m", "scrapyd_client.deploy", "--build-egg", str(out)],
                cwd=copy, capture_output=True, text=True, timeout=BUILD_EGG_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise OpsError(f"building the egg of {project_dir} timed out after"
                           f" {BUILD_EGG_TIMEOUT:g}s") from exc
    if result.returncode != 0 or not out.is_file():
        raise OpsError(f"building the egg of {project_dir} failed:\n"
                       f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    check_egg(out, project_dir)


def check_egg(egg: Path, project_dir: Path) -> None:
    """:class:`OpsError` unless ``egg`` holds the settings module of its ``scrapy`` entry point."""
    with zipfile.ZipFile(egg) as archive:
        names = set(archive.namelist())
        entry_points = (archive.read("EGG-INFO/entry_points.txt").decode(errors="replace")
                        if "EGG-INFO/entry_points.txt" in names else "")
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(entry_points)
    except configparser.Error:
        parser.clear()
    settings = parser.get("scrapy", "settings", fallback="").strip()
    if not settings:
        raise OpsError(f"the egg of {project_dir} has no scrapy settings entry point: its"
                       " setup.py must declare entry_points={'scrapy': ['settings = ...']}")
    module = settings.replace(".", "/")
    if not names & {module + ".py", module + ".pyc", module + "/__init__.py"}:
        raise OpsError(f"the egg of {project_dir} lacks its settings module {settings}: the"
                       f" packages of its setup.py must include {settings.rsplit('.', 1)[0]}")

