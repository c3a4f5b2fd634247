"""The settings a sweep tries: its ``configs``, then every combination of its ``grid``."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from .._errors import InputError
from .._text import shown
from ..memory._config import AllocatorConfig, Setting


def _setting(
    value: Setting | AllocatorConfig | str | Mapping[str, object] | None, where: str, source: str
) -> Setting:
    """A setting to try, from a :class:`Setting` (as it is) or what ``AllocatorConfig.coerce``
    takes (with ``source``); errors name ``where`` it was given."""
    if isinstance(value, Setting):
        if value.config is None:
            raise ValueError(
                f"a {where} without a config ({value!r}) would be each recording's own: "
                "pass recorded=True instead"
            )
        return value
    try:
        return Setting(AllocatorConfig.coerce(value), source)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (in {where} {shown(value)})") from None


def _split_values(text: str) -> list[str]:
    """Split ``V1,V2,...`` at the commas outside brackets (``[256:1,>:4]`` is one value)."""
    values, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i])
            start = i + 1
    values.append(text[start:])
    return [v.strip() for v in values]


def parse_grid(spec: str) -> tuple[str, list[str]]:
    """Parse one ``--grid KEY=V1,V2,...`` option.

    Parameters
    ----------
    spec : str
        E.g. ``"max_split_size_mb=128,256"`` or ``"roundup_power2_divisions=[256:1,>:4],8"``
        (commas inside brackets belong to the value).

    Returns
    -------
    (str, list of str)
        The key and its values.

    Raises
    ------
    ValueError
        If there is no ``=``, no key, or an empty value. Keys and values are checked later,
        as settings, by :func:`sweep`.
    """
    key, sep, rest = spec.partition("=")
    key = key.strip()
    if not sep or not key or not rest.strip():
        raise InputError(
            f"a grid is KEY=V1,V2,..., such as max_split_size_mb=128,256; got {shown(spec)}"
        )
    values = _split_values(rest)
    if any(not v for v in values):
        raise InputError(f"grid {shown(spec)} has an empty value; separate values with one comma")
    return key, values


def _candidates(
    configs: Sequence[Setting | AllocatorConfig | str | Mapping[str, object] | None],
    grid: Sequence[tuple[str, Sequence[object]]],
) -> list[Setting]:
    """The settings to try: every config, then every combination of the grid; no duplicates."""
    out: list[Setting] = []
    seen: set[AllocatorConfig | None] = set()

    def add(setting: Setting) -> None:
        if setting.config not in seen:
            seen.add(setting.config)
            out.append(setting)

    for value in configs:
        add(_setting(value, "setting", "configs"))
    checked: list[tuple[str, list[object]]] = []
    for key, values in grid:
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"a grid key must be a setting's name, got {shown(key)}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(
                f"grid {key!r}: give a list of values, such as [128, 256], got {shown(values)}"
            )
        checked.append((key.strip(), list(values)))
        if not checked[-1][1]:
            raise ValueError(f"grid {key!r} has no values; give at least one")
    axes = [[(key, _grid_value(v)) for v in values] for key, values in checked]
    for combination in itertools.product(*axes) if axes else ():
        text = ",".join(f"{k}:{v}" for k, v in combination)
        add(_setting(text, "grid setting", "grid"))
    if not out:
        out.append(Setting(AllocatorConfig(), "defaults"))
    return out


def _grid_value(value: object) -> str:
    return str(value).strip() if not isinstance(value, str) else value.strip()
