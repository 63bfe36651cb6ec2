"""One setting's value, read and checked: the helpers :mod:`bloomcrawl.crawl.config` and
the pipeline read their settings with.

Each returns the default for a setting not set (None or ``""``) and raises a
:class:`~bloomcrawl.core.errors.SettingError` naming the setting and its value
for anything else it cannot use, before anything touches Redis.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from bloomcrawl.core.errors import SettingError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings


def get_int(settings: BaseSettings, name: str, default: int, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """An integer setting, optionally ``>= minimum`` and ``<= maximum``; 0 is a value, not
    "unset"."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
        if isinstance(raw, float) and raw != value:
            raise ValueError(raw)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SettingError("%s must be an integer, got %r" % (name, raw)) from exc
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        wanted = [">= %d" % minimum] if minimum is not None else []
        wanted += ["<= %d" % maximum] if maximum is not None else []
        raise SettingError("%s must be %s, got %r" % (name, " and ".join(wanted), raw))
    return value


def get_optional_int(settings: BaseSettings, name: str, minimum: int | None = None,
                     maximum: int | None = None) -> int | None:
    """:func:`get_int`, None when not set."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return None
    return get_int(settings, name, 0, minimum, maximum)


def get_float(
    settings: BaseSettings,
    name: str,
    default: float,
    low: float | None = None,
    high: float | None = None,
) -> float:
    """A finite float setting, optionally in the open interval (low, high).

    NaN and infinity are refused: no setting read with this means "no limit" by
    them (each has its own way to say so, such as 0), and either breaks the
    arithmetic that turns seconds into Redis's milliseconds.
    """
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SettingError("%s must be a number, got %r" % (name, raw)) from exc
    if not math.isfinite(value):
        raise SettingError("%s must be a finite number, got %r" % (name, raw))
    if (low is not None and value <= low) or (high is not None and value >= high):
        if high is None:
            raise SettingError("%s must be > %s, got %r" % (name, low, raw))
        raise SettingError("%s must be in (%s, %s), got %r" % (name, low, high, raw))
    return value


def get_bool(settings: BaseSettings, name: str, default: bool) -> bool:
    """A boolean setting, as Scrapy's ``getbool`` reads it: True/False, 1/0 or their
    strings ("true"/"false" too)."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    try:
        return settings.getbool(name, default)
    except (TypeError, ValueError) as exc:
        raise SettingError("%s must be true or false (or 1 or 0), got %r"
                           % (name, raw)) from exc


def get_dict(settings: BaseSettings, name: str) -> dict[Any, Any]:
    """A dict setting, or its JSON ({} when not set)."""
    try:
        return dict(settings.getdict(name))
    except (TypeError, ValueError) as exc:
        raise SettingError("%s must be a dict (or its JSON), got %r"
                           % (name, settings.get(name))) from exc


#: seconds per unit of a duration such as "7d", "12h", "30m" or "90s"
DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([dhms]?)\s*$")


def parse_duration(raw: Any) -> float:
    """Seconds from a number or a duration such as ``"7d"``, ``"12h"``, ``"30m"``,
    ``"90s"``; ``"never"`` (and 0) is 0. ValueError otherwise."""
    if isinstance(raw, bool):
        raise ValueError("a duration is seconds or a number with d, h, m or s")
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str) and raw.strip().lower() == "never":
        return 0.0
    else:
        match = _DURATION.match(raw) if isinstance(raw, str) else None
        if match is None:
            raise ValueError("expected seconds or a duration such as 7d, 12h, 30m or 90s")
        value = float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]
    if not math.isfinite(value) or value < 0:
        raise ValueError("a duration must be finite and >= 0")
    return value


def get_duration(settings: BaseSettings, name: str, default: float) -> float:
    """A duration setting (:func:`parse_duration`): seconds, or "7d", "12h", "30m", "90s"."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise SettingError("%s %r: %s" % (name, raw, exc)) from exc


def get_windows(settings: BaseSettings, name: str) -> tuple[tuple[str, float], ...]:
    """Named revisit windows: a dict (or its JSON) of name -> duration
    (:func:`parse_duration`; 0 or "never": never forgotten), sorted by name."""
    raw = settings.get(name)
    if raw is None or raw == "" or raw == {}:
        return ()
    try:
        windows = settings.getdict(name)
    except (ValueError, TypeError) as exc:
        raise SettingError("%s %r: expected a dict of window name to duration, such as"
                           " {\"listing\": \"1h\", \"article\": \"never\"}" % (name, raw)
                           ) from exc
    out = []
    for window, duration in windows.items():
        try:
            out.append((window, parse_duration(duration)))
        except ValueError as exc:
            raise SettingError("%s window %r: %r: %s" % (name, window, duration, exc)) from exc
    return tuple(sorted(out))
