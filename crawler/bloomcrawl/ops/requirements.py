"""A project's ``requirements.txt`` on the workers: wheels built here, installed beside bloomcrawl.

Workers may have no package index to reach (containers have no network), so
the wheels are built where ``bloomcrawl deploy`` runs and installed on the
workers from those files alone:

1. :func:`worker_environment` asks the workers' interpreter for its Python
   version and the distributions it has (bloomcrawl, Scrapy, scrapyd,
   Twisted ...).
2. :func:`build_wheelhouse` reads the file as pip does from its directory
   (relative paths from there, a ``-r`` file relative to the file naming it).
   A line naming one of the workers' own packages at a version it allows is
   left out: the workers have it. At a version it does not allow it is an
   error: a project cannot replace the Scrapy (or Twisted ...) that scrapyd
   and bloomcrawl run on. ``pip wheel`` builds the rest with the workers'
   packages as constraints, so a dependency they share resolves to the very
   version the workers have.
3. :func:`install_wheels` installs the wheels of what the workers lack with
   ``pip install --no-index --no-deps --target`` into a directory on the
   PYTHONPATH of scrapyd, which passes its environment on to ``scrapy list``
   (the check of every upload) and to every job. An older version of the
   same distribution there is removed first. None of the workers' own
   packages is ever copied there, so nothing in it shadows them.

The directory is the local cluster's ``.run/local/site-packages``, and
``/opt/bloomcrawl/project-packages`` in a worker container
(``deploy/Dockerfile``), where ``python -m bloomcrawl.ops.requirements
install-wheels --target DIR`` installs the wheels of a tar archive it reads
on stdin. One directory serves every project deployed to the cluster.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from bloomcrawl.ops.console import OpsError, say, warn

REQUIREMENTS_FILE = "requirements.txt"
#: seconds for ``pip wheel`` (downloads, builds) and for ``pip install`` of the wheels
PIP_TIMEOUT = 900.0
QUERY_TIMEOUT = 60.0
#: lines of a failed command's output an error quotes
ERROR_LINES = 15

#: run with ``-I`` by the workers' interpreter: PYTHONPATH, where the projects'
#: packages are, does not count as the workers' own
_ENVIRONMENT_SCRIPT = """\
import importlib.metadata, json, platform
packages = {}
for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"]
    if name:
        packages.setdefault(name, dist.version)
print(json.dumps({"python": platform.python_version(), "packages": packages}))
"""
#: a comment, as pip strips it: at the start or after whitespace
_COMMENT = re.compile(r"(^|\s+)#.*$")
#: ``-r FILE`` / ``--requirement=FILE`` / ``-c FILE`` ...
_INCLUDE = re.compile(r"^(?:-(?P<short>[rc])\s*|--(?P<long>requirement|constraint)(?:=|\s+))"
                      r"(?P<path>\S+)$")
#: the options pip allows after a requirement on its line (``--hash=...``)
_LINE_OPTIONS = re.compile(r"\s+--?[A-Za-z]")


def canonical_name(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): ``Scrapy_Redis`` -> ``scrapy-redis``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(wheel: Path) -> tuple[str, str]:
    """(canonical name, version) of a wheel file (``pricefmt-1.0.0-py3-none-any.whl``)."""
    name, version = wheel.name.split("-")[:2]
    return canonical_name(name), version


def _run(cmd: Sequence[str], *, what: str, timeout: float, cwd: Path | None = None,
         stdin: bytes | None = None) -> str:
    """``cmd``'s stdout; :class:`OpsError` saying ``what`` failed, with its last lines."""
    try:
        result = subprocess.run(list(cmd), cwd=cwd, input=stdin, capture_output=True,
                                timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise OpsError(f"{what}: {cmd[0]} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise OpsError(f"{what} timed out after {timeout:g}s") from exc
    if result.returncode != 0:
        output = (result.stderr or result.stdout).decode(errors="replace")
        lines = [line for line in output.splitlines()
                 if line.strip() and "is ignored: it is neither a file nor a directory" not in line]
        raise OpsError("%s failed (exit %d):\n%s" % (what, result.returncode,
                                                     "\n".join(lines[-ERROR_LINES:])))
    return result.stdout.decode(errors="replace")


# --- the workers' interpreter ---------------------------------------------------------


@dataclass
class WorkerEnvironment:
    """The workers' interpreter: its Python version, its distributions (canonical name: version)."""

    python_version: str
    packages: dict[str, str] = field(default_factory=dict)

    def version_of(self, name: str) -> str | None:
        """The version of distribution ``name`` the workers have, or ``None``."""
        return self.packages.get(canonical_name(name))

    def constraints(self) -> str:
        """A constraints file pinning every distribution the workers have (PEP 440 versions)."""
        lines = []
        for name, version in sorted(self.packages.items()):
            try:
                Version(version)
            except InvalidVersion:
                continue  # pip would reject the whole file
            lines.append(f"{name}=={version}\n")
        return "".join(lines)


def worker_environment(python: Sequence[str]) -> WorkerEnvironment:
    """What the interpreter ``python`` runs with: ``[sys.executable]`` for the local cluster,
    ``["docker", "exec", ID, "python"]`` for a worker container."""
    out = _run([*python, "-I", "-c", _ENVIRONMENT_SCRIPT], timeout=QUERY_TIMEOUT,
               what="asking the workers' Python (%s) for its packages" % " ".join(python))
    try:
        data = json.loads(out)
        packages = {canonical_name(str(k)): str(v) for k, v in data["packages"].items()}
        return WorkerEnvironment(str(data["python"]), packages)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise OpsError("the workers' Python (%s) gave no package list: %r" % (
            " ".join(python), out[:200])) from exc


def wheel_builder(python_version: str, cache: Path) -> list[str]:
    """A Python here of the workers' ``major.minor`` (their wheels' tags) that has pip.

    This interpreter when it matches; else ``python3.X`` (or ``python3``) on
    the PATH, in a virtualenv under ``cache`` named as scripts/build-images.sh
    names the one it builds the image's wheelhouse with.
    """
    wanted = tuple(int(part) for part in python_version.split(".")[:2])
    if sys.version_info[:2] == wanted:
        return [sys.executable]
    short = "%d.%d" % wanted
    for candidate in (f"python{short}", "/usr/bin/python3", "python3"):
        found = shutil.which(candidate)
        if found is None:
            continue
        version = _run([found, "-c", "import platform; print(platform.python_version())"],
                       what=f"asking {found} for its version", timeout=QUERY_TIMEOUT).strip()
        if tuple(int(part) for part in version.split(".")[:2]) != wanted:
            continue
        venv = cache / f"wheelhouse-venv-{version}"
        if not (venv / "bin" / "pip").exists():
            _run([found, "-m", "venv", str(venv)], what=f"creating {venv}",
                 timeout=QUERY_TIMEOUT)
        return [str(venv / "bin" / "python")]
    raise OpsError(f"no Python {short} (the workers') here to build the project's wheels with:"
                   f" install one (on Debian: apt-get install python{short} python3-venv)")


# --- reading requirements.txt ---------------------------------------------------------


@dataclass
class Requirements:
    """A requirements file read for the workers: the lines pip gets, and what the workers have."""

    lines: list[str] = field(default_factory=list)
    #: the lines left out, as ``name version`` of the workers' distribution
    provided: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) with continuations joined and comments gone, as pip reads them."""
    start, parts = 0, list[str]()
    for number, raw in enumerate(text.splitlines(), 1):
        if not parts:
            start = number
        if raw.endswith("\\"):
            parts.append(raw[:-1])
            continue
        parts.append(raw)
        line = _COMMENT.sub("", " ".join(parts)).strip()
        parts = []
        if line:
            yield start, line
    if parts:
        line = _COMMENT.sub("", " ".join(parts)).strip()
        if line:
            yield start, line


def _requirement(line: str) -> Requirement | None:
    """The PEP 508 requirement of a line, or ``None`` (a path, a URL, an option ...)."""
    try:
        return Requirement(_LINE_OPTIONS.split(line, maxsplit=1)[0])
    except InvalidRequirement:
        return None


def read_requirements(path: Path, workers: WorkerEnvironment) -> Requirements:
    """The lines of ``path`` (and of the files it includes) the workers do not satisfy.

    Raises :class:`OpsError` naming the file and line when a line asks for a
    version of one of the workers' own distributions other than theirs.
    """
    found = Requirements()
    _read(path, workers, found, set())
    return found


def _read(path: Path, workers: WorkerEnvironment, found: Requirements, seen: set[Path]) -> None:
    path = path.resolve()
    if path in seen:
        return
    seen.add(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise OpsError(f"cannot read {path}: {exc.strerror or exc}") from exc
    for number, line in _logical_lines(text):
        include = _INCLUDE.match(line)
        if include is not None:
            target = include["path"]
            local = "://" not in target
            if local and not os.path.isabs(target):
                target = str(path.parent / target)  # as pip: relative to the including file
            if (include["short"] == "r" or include["long"] == "requirement") and local:
                _read(Path(target), workers, found, seen)
            else:
                kind = "-r" if include["short"] == "r" or include["long"] == "requirement" else "-c"
                found.lines.append(f"{kind} {target}")
            continue
        requirement = None if line.startswith("-") else _requirement(line)
        have = workers.version_of(requirement.name) if requirement is not None else None
        if (requirement is None or have is None or requirement.url or requirement.extras
                or (requirement.marker is not None and not requirement.marker.evaluate())):
            found.lines.append(line)
            continue
        try:
            satisfied = requirement.specifier.contains(have, prereleases=True)
        except InvalidVersion:
            found.lines.append(line)
            continue
        if not satisfied:
            raise OpsError(f"{path}:{number}: {line!r} asks for another {requirement.name} than"
                           f" the workers' {have}, which scrapyd and bloomcrawl run on: a"
                           " project's requirements cannot replace the workers' own packages")
        found.provided.append(f"{requirement.name} {have}")


# --- building and installing ----------------------------------------------------------


@dataclass
class Wheelhouse:
    """The wheels built from a requirements file: those of what the workers lack."""

    requirements: Path
    wheels: list[Path]
    #: requirements the workers' own distributions satisfy (``scrapy 2.19.0``)
    provided: list[str]

    @property
    def names(self) -> list[str]:
        """``pricefmt 1.0.0`` for every wheel to install."""
        return ["%s %s" % wheel_name(wheel) for wheel in self.wheels]


def build_wheelhouse(python: Sequence[str], requirements: Path, wheel_dir: Path,
                     workers: WorkerEnvironment) -> Wheelhouse:
    """``pip wheel`` (with ``python``, from the file's directory) what ``requirements`` needs.

    The workers' distributions are constraints; the wheels of those are built
    (a dependency may need them resolved) but left out of the result.
    """
    found = read_requirements(requirements, workers)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    if found.lines:
        with tempfile.TemporaryDirectory(prefix="bloomcrawl-requirements-") as tmp:
            lines, constraints = Path(tmp) / "requirements.txt", Path(tmp) / "constraints.txt"
            lines.write_text("\n".join(found.lines) + "\n")
            constraints.write_text(workers.constraints())
            _run([*python, "-I", "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                  "--wheel-dir", str(wheel_dir), "-r", str(lines), "-c", str(constraints)],
                 cwd=requirements.parent, timeout=PIP_TIMEOUT,
                 what=f"building the wheels of {requirements}")
    wheels = [wheel for wheel in sorted(wheel_dir.glob("*.whl"))
              if workers.version_of(wheel_name(wheel)[0]) is None]
    return Wheelhouse(requirements, wheels, found.provided)


def remove_distribution(target: Path, name: str) -> None:
    """Remove every version of distribution ``name`` from ``target``: the files its RECORD lists."""
    root = target.resolve()
    wanted = canonical_name(name)
    for info in sorted(root.glob("*.dist-info")):
        if canonical_name(info.name[:-len(".dist-info")].split("-")[0]) != wanted:
            continue
        parents: set[Path] = set()
        record = info / "RECORD"
        rows = list(csv.reader(record.read_text().splitlines())) if record.is_file() else []
        for row in rows:
            if not row:
                continue
            file = (root / row[0]).resolve()
            if root not in file.parents or info in file.parents:
                continue  # never outside the directory; the dist-info goes below
            try:
                file.unlink()
            except FileNotFoundError:
                pass
            except OSError:
                continue
            parents.add(file.parent)
        shutil.rmtree(info, ignore_errors=True)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent


def install_wheels(python: Sequence[str], wheels: Sequence[Path], target: Path) -> None:
    """Install ``wheels`` (no dependencies, no index) into ``target``, replacing older versions."""
    target.mkdir(parents=True, exist_ok=True)
    if not wheels:
        return
    for wheel in wheels:
        remove_distribution(target, wheel_name(wheel)[0])
    _run([*python, "-I", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "--no-index", "--no-deps", "--upgrade", "--target", str(target),
          *[str(wheel) for wheel in wheels]],
         timeout=PIP_TIMEOUT, what="installing %s into %s" % (
             ", ".join("%s %s" % wheel_name(w) for w in wheels), target))


# --- a worker container: the wheels as a tar archive on stdin ---------------------------


def pack_wheels(wheels: Sequence[Path]) -> bytes:
    """A tar archive of ``wheels``, each at its top level."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    return buffer.getvalue()


def unpack_wheels(stream: IO[bytes], directory: Path) -> list[Path]:
    """The ``.whl`` files at the top of the tar archive ``stream``; nothing else is written."""
    wheels = []
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = member.name
            if not member.isfile() or "/" in name or name.startswith(".") or not name.endswith(
                    ".whl"):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            with (directory / name).open("wb") as out:
                shutil.copyfileobj(source, out)
            wheels.append(directory / name)
    return sorted(wheels)


def install_command(python: Sequence[str], target: str) -> list[str]:
    """The command that installs the wheels of a tar archive on its stdin into ``target``."""
    return [*python, "-m", "bloomcrawl.ops.requirements", "install-wheels", "--target", target]


def send_wheels(command: Sequence[str], wheels: Sequence[Path], what: str) -> None:
    """Run :func:`install_command` (``command``, in a container say) with ``wheels`` on stdin."""
    _run(command, stdin=pack_wheels(wheels), timeout=PIP_TIMEOUT, what=what)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bloomcrawl.ops.requirements",
                                     description="What `bloomcrawl deploy` runs on a worker.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("install-wheels", help="install the wheels of a tar archive on stdin")
    p.add_argument("--target", type=Path, required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bloomcrawl-wheels-") as tmp:
        wheels = unpack_wheels(sys.stdin.buffer, Path(tmp))
        try:
            install_wheels([sys.executable], wheels, args.target)
        except OpsError as exc:
            warn(str(exc))
            return 1
    say("installed %s into %s" % (", ".join("%s %s" % wheel_name(w) for w in wheels) or "nothing",
                                  args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
