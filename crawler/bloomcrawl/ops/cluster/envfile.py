"""The cluster's ``.env``: ports and images set by hand, and random secrets.

docker-compose reads it; ``bloomcrawl up`` creates it (or adds what is
missing) with :func:`ensure_env_file`, and every other command reads the
scrapyd credentials and the Redis password from it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TextIO

from bloomcrawl.ops.console import say

#: files holding a secret (or naming where one is) are readable by their owner alone
PRIVATE_MODE = 0o600

ENV_HEADER = """\
# bloomcrawl cluster settings, written by `bloomcrawl up` (make up) with random
# secrets. Keep this file private; docker-compose reads it. See .env.example.
"""


def read_env_file(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name.strip()] = value
    return values


def open_private(path: Path, *, append: bool = False) -> TextIO:
    """Open ``path`` for writing, owner-only (:data:`PRIVATE_MODE`) before a byte is written.

    A new file is created with that mode (never world-readable, not even for a
    moment); an existing one is narrowed to it first.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)
        return os.fdopen(fd, "a" if append else "w")
    except BaseException:
        os.close(fd)
        raise


def new_secret() -> str:
    """URL-safe without escaping: it goes into redis:// URLs and basic auth."""
    return secrets.token_hex(16)


def ensure_env_file(path: Path) -> dict[str, str]:
    """Create ``path`` with random secrets when missing; add missing secrets otherwise."""
    values = read_env_file(path)
    wanted = {
        "COMPOSE_PROJECT_NAME": "bloomcrawl",
        "REDIS_PASSWORD": new_secret(),
        "SCRAPYD_USERNAME": "bloomcrawl",
        "SCRAPYD_PASSWORD": new_secret(),
        "GRAFANA_ADMIN_PASSWORD": new_secret(),
    }
    missing = {name: value for name, value in wanted.items() if not values.get(name)}
    if not missing:
        return values
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    with open_private(path, append=True) as f:
        if not existed:
            f.write(ENV_HEADER)
        for name, value in missing.items():
            f.write(f"{name}={value}\n")
    say("{} {} ({})".format("updated" if existed else "created", path, ", ".join(missing)))
    return read_env_file(path)


def ensure_role_passwords(path: Path, variables: list[str]) -> dict[str, str]:
    """Add a random secret for each of ``variables`` (the Redis roles' passwords) that
    ``path`` lacks; the file's values."""
    values = read_env_file(path)
    missing = [name for name in variables if not values.get(name)]
    if missing:
        with open_private(path, append=True) as f:
            for name in missing:
                f.write(f"{name}={new_secret()}\n")
        say("updated {} ({})".format(path, ", ".join(missing)))
    return read_env_file(path)
