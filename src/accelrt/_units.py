"""Byte sizes: one parser for the API, the environment and the CLI, and one formatter.

``parse_bytes`` accepts ``int`` byte counts and strings such as ``"512MiB"``, ``"80GiB"``,
``"1.5GB"`` or ``"4096"``. ``format_bytes`` writes sizes the way PyTorch's allocator messages do
(``"20.00 MiB"``).
"""

from __future__ import annotations

import numbers
import re

from ._errors import InputError

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
    "p": 1024**5,
    "pib": 1024**5,
    "pb": 1000**5,
    "e": 1024**6,
    "eib": 1024**6,
    "eb": 1000**6,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
MAX_BYTES = 1 << 63
"""Sizes must be below this (8 EiB): every byte count fits a signed 64-bit integer."""
_MAX_FRACTION_DIGITS = 50  # 2**-40 (a byte of a TiB) needs 40; more is noise


def parse_bytes(value: int | str, *, name: str = "size") -> int:
    """Parse a byte count.

    Parameters
    ----------
    value : int or str
        A non-negative ``int`` (bytes), or a string: a number followed by an optional unit,
        binary (``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB``, ``EiB``; ``K``/``M``/``G``/``T``/
        ``P``/``E`` mean the same) or decimal (``KB``, ``MB``, ``GB``, ``TB``, ``PB``, ``EB``).
        Units are case-insensitive.
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
    InputError
        (a ``ValueError``) If ``value`` is negative or not below 2**63 bytes, or a string that
        is not an ASCII decimal number with a known unit (``nan``, ``inf``, exponents and
        non-ASCII digits are refused).

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
            raise InputError(f"{name} must be >= 0 bytes, got {value}")
        if value >= MAX_BYTES:
            raise InputError(f"{name} must be less than 2**63 bytes (8 EiB), got {value}")
        return value
    match = _SIZE_RE.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        shown = value if len(value) <= 60 else value[:57] + "..."
        if value.strip().startswith("-"):
            raise InputError(f"{name} must be >= 0 bytes, got {shown!r}")
        raise InputError(
            f"cannot parse {name} {shown!r}: expected a number of bytes with an optional unit "
            "(B, KiB, MiB, GiB, TiB, PiB, EiB, KB, MB, GB, TB, PB, EB), e.g. '512MiB'"
        )
    number: str = match.group(1)
    multiplier = _UNITS[str(unit)]
    whole, _, frac = number.partition(".")
    whole = whole.lstrip("0")
    # bound the digits before int(): 2**63 has 19, and Python refuses to convert 4300+
    if len(whole) > 20 or len(frac) > _MAX_FRACTION_DIGITS:
        shown = value.strip() if len(value.strip()) <= 40 else value.strip()[:37] + "..."
        raise InputError(
            f"{name} {shown!r} has too many digits: a size must be less than 2**63 bytes "
            f"(8 EiB), with at most {_MAX_FRACTION_DIGITS} decimals"
        )
    scale = 10 ** len(frac)
    nbytes: int = (int(whole or "0") * scale + int(frac or "0")) * multiplier // scale
    if nbytes >= MAX_BYTES:
        raise InputError(
            f"{name} {value.strip()!r} is {nbytes} bytes; a size must be less than 2**63 "
            "bytes (8 EiB)"
        )
    return nbytes


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

    Raises
    ------
    TypeError
        If ``nbytes`` is not a number (a string such as ``"5"`` is parsed by
        :func:`parse_bytes`, not formatted).

    Examples
    --------
    >>> format_bytes(20 * 1024**2)
    '20.00 MiB'
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
        raise TypeError(
            f"format_bytes() takes a number of bytes, got {type(nbytes).__name__} "
            f"{nbytes!r:.60}; parse a size string with parse_bytes()"
        )
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1024**2:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1024**3:
        return f"{nbytes / 1024**2:.2f} MiB"
    return f"{nbytes / 1024**3:.2f} GiB"
