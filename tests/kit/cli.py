"""The ``bloomcrawl`` command for the tests: in-process, or as a process where that matters.

:func:`run_cli` calls :func:`bloomcrawl.ops.cli.main` with ``argv`` in this
interpreter, under the environment given (os.environ is that environment
for the call, and restored after), and captures what it writes; an
exception escaping ``main`` becomes what the interpreter would print for it,
a traceback on stderr and exit 1, so a test's "no traceback" check holds
either way. :func:`run_cli_process` runs ``python -m bloomcrawl.ops.cli``,
for what only a process shows (its exit status through ``sys.exit``, its
own interpreter).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kit import ROOT

#: seconds a command run as a process may take
PROCESS_TIMEOUT_S = 180.0


@dataclass
class CliRun:
    """What one ``bloomcrawl`` command did."""

    argv: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def assert_ok(self) -> CliRun:
        """Exit 0 (else the failure shows the command and its output); returns itself."""
        assert self.code == 0, "bloomcrawl %s: exit %d\n%s" % (
            " ".join(self.argv), self.code, self.output)
        return self

    def assert_failed_with(self, line: str) -> None:
        """Exit 1, ``line`` on stderr, and nothing that looks like a traceback anywhere."""
        assert self.code == 1, (self.code, self.output)
        assert "Traceback" not in self.output and 'File "' not in self.output, self.output
        assert line in self.stderr.splitlines(), (line, self.stderr)


def cli_environment(tmp_path: Path) -> dict[str, str]:
    """For the ``bloomcrawl`` command: no recorded cluster, no .env, nothing of ours in
    the environment; a command acts on what its arguments say alone."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SCRAPYD_", "REDIS_", "BLOOMCRAWL_"))}
    env.update(BLOOMCRAWL_ROOT=str(ROOT), BLOOMCRAWL_STATE_DIR=str(tmp_path / "run"),
               BLOOMCRAWL_ENV_FILE=str(tmp_path / "no.env"), HOME=str(tmp_path / "home"))
    env.pop("PYTHONPATH", None)
    return env


@contextlib.contextmanager
def environment(env: Mapping[str, str] | None) -> Iterator[None]:
    """os.environ is exactly ``env`` inside the block (unchanged when None)."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_cli(*argv: str, env: Mapping[str, str] | None = None) -> CliRun:
    """``bloomcrawl ARGV`` in-process, under ``env`` (None: this process's environment)."""
    from bloomcrawl.ops.cli import main

    out, err = io.StringIO(), io.StringIO()
    with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: a usage error, --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except Exception:  # what the interpreter would print, and its exit status
            err.write(traceback.format_exc())
            code = 1
    return CliRun(argv, code, out.getvalue(), err.getvalue())


def run_cli_process(*argv: str, env: Mapping[str, str] | None = None,
                    timeout: float = PROCESS_TIMEOUT_S) -> CliRun:
    """``python -m bloomcrawl.ops.cli ARGV`` in the checkout, as an operator runs it."""
    done = subprocess.run([sys.executable, "-m", "bloomcrawl.ops.cli", *argv], cwd=ROOT,
                          env=None if env is None else dict(env), text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return CliRun(argv, done.returncode, done.stdout, done.stderr)
