"""Byte sizes: one parser for the API, the environment and the CLI, and one formatter.

``parse_bytes`` accepts ``int`` byte counts and strings such as ``"512MiB"``, ``"80GiB"``,
``"1.5GB"`` or ``"4096"``. ``format_bytes`` writes sizes the way PyTorch's allocator messages do
(``"20.00 MiB"``).
"""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | str, *, name: str = "size") -> int:
    """Parse a byte count.

    Parameters
    ----------
    value : int or str
        A non-negative ``int`` (bytes), or a string: a number followed by an optional unit,
        binary (``KiB``, ``MiB``, ``GiB``, ``TiB``; ``K``/``M``/``G``/``T`` mean the same) or
        decimal (``KB``, ``MB``, ``GB``, ``TB``). Units are case-insensitive.
    name : str
        What the value is, used in error messages (e.g. ``"capacity"``).

    Returns
    -------
    int
        The size in bytes (fractions of a byte are rounded down).

    Raises
    ------
    TypeError
        If ``value`` is neither ``int`` nor ``str`` (``bool`` is refused too).
    ValueError
        If ``value`` is negative, or a string that is not a number with a known unit.

    Examples
    --------
    >>> parse_bytes("512MiB")
    536870912
    >>> parse_bytes(4096)
    4096
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            f"{name} must be an int number of bytes or a string like '512MiB', "
            f"got {type(value).__name__} {value!r}"
        )
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 bytes, got {value}")
        return value
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"cannot parse {name} {value!r}: expected a number of bytes with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. '512MiB'"
        )
    number: str = match.group(1)
    multiplier = _UNITS[str(unit)]
    if "." in number:
        whole, _, frac = number.partition(".")
        scale = 10 ** len(frac)
        exact: int = (int(whole or "0") * scale + int(frac or "0")) * multiplier // scale
        return exact
    whole_bytes: int = int(number) * multiplier
    return whole_bytes


def format_bytes(nbytes: int) -> str:
    """Format a byte count as PyTorch's caching allocator does in its messages.

    Parameters
    ----------
    nbytes : int
        A size in bytes.

    Returns
    -------
    str
        ``"N bytes"`` up to 1024, then KiB up to 1 MiB, MiB up to 1 GiB, else GiB, with two
        decimals (mirrors ``format_size`` in c10/cuda/CUDACachingAllocator.cpp).

    Examples
    --------
    >>> format_bytes(20 * 1024**2)
    '20.00 MiB'
    """
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1024**2:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1024**3:
        return f"{nbytes / 1024**2:.2f} MiB"
    return f"{nbytes / 1024**3:.2f} GiB"
