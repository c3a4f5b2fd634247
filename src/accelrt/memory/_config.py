"""Allocator configuration: ``ACCELRT_ALLOC_CONF`` and ``set_allocator_settings``.

Same syntax as ``PYTORCH_ALLOC_CONF`` (docs/allocator.md section 11): ``key:value,key:[a:b,c:d]``,
booleans ``True``/``False``; ``defaults`` (what :meth:`AllocatorConfig.describe` writes for
them) names the defaults. Unknown keys and bad values raise ``InputError`` (a ``ValueError``)
naming the key and the allowed range.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import InputError
from .._text import shown as _shown

__all__ = ["ENV_VAR", "ENV_VARS", "RECORDED", "AllocatorConfig", "Setting"]

ENV_VAR = "ACCELRT_ALLOC_CONF"
ENV_VARS = (ENV_VAR, "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""Where the ``accelrt`` commands look for a setting when ``--config`` gives none: the first one
set (and not empty) wins. PyTorch's two come in the order PyTorch reads them,
``PYTORCH_CUDA_ALLOC_CONF`` being the deprecated name (c10/core/AllocatorConfig.cpp,
``AcceleratorAllocatorConfig::instance``)."""
RECORDED = "recorded"
"""The label and source of a PyTorch snapshot's own recorded allocator settings."""
MiB = 1024 * 1024
NUM_ROUNDUP_SLOTS = 16
MAX_MB = 1 << 40
"""The largest MiB value a ``*_mb`` setting takes: 2**40 MiB (1 EiB), far beyond any device,
and below the 2**62 bytes up to which :meth:`AllocatorConfig.from_torch_settings` reads sizes."""
MAX_DIVISIONS = 1 << 16
"""The largest ``roundup_power2_divisions`` value."""
_DIGITS_RE = re.compile(r"[0-9]{1,30}", re.ASCII)
_DECIMAL_RE = re.compile(
    r"(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,3})?", re.ASCII
)
UNMODELLED_TORCH_KEYS = (
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_cached_size_mb",
    "pinned_max_round_threshold_mb",
    "pin_memory_expandable_segments",
    "graph_capture_record_stream_reuse",
    "pinned_free_catch_all",
    "release_lock_on_hipmalloc",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
)
"""Keys PyTorch's ``PYTORCH_CUDA_ALLOC_CONF`` takes that the device allocator's policy does not
depend on (the allocator backend, host-allocator and graph-capture knobs, the lock, and the
address space reserved up front for expandable segments, which changes no placement)."""
_KEYS = (
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "large_segment_size_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "per_process_memory_fraction",
    "release_lock_on_malloc",
    "throw_on_cudamalloc_oom",
    "policy",
)
POLICIES = ("pytorch", "accelrt")
"""The allocation policies the key ``policy`` names: ``pytorch`` (the default, PyTorch-exact)
and ``accelrt`` (docs/allocator.md section 16; backends with virtual memory only)."""


@dataclass(frozen=True)
class AllocatorConfig:
    """Settings of the caching allocator; immutable.

    Attributes
    ----------
    max_split_size : int or None
        Bytes; blocks this large or larger are never split, and requests below it never take
        them. None (the default) means unlimited. Key ``max_split_size_mb`` (MiB, >= 20).
    max_non_split_rounding : int
        Bytes; an oversize request may take a cached block at most this much larger. Default
        20 MiB. Key ``max_non_split_rounding_mb`` (MiB, >= 20).
    large_segment_size : int
        Bytes; the segment a request above 1 MiB and below 10 MiB gets, and the page size of
        the large pool's expandable segments. Default 20 MiB. Key ``large_segment_size_mb``
        (MiB, >= 2; PyTorch 2.13's ``AcceleratorAllocatorConfig``).
    roundup_power2_divisions : tuple of int
        16 slots (sizes below 2 MiB, then one per power of two up to >= 32 GiB); a value d > 1
        rounds requests up to the next of d steps between powers of two. Key
        ``roundup_power2_divisions``: ``4`` (every slot) or ``[256:1,512:2,>:4]``.
    garbage_collection_threshold : float
        0 (off) or 0 < x < 1: with a memory fraction set, free old cached blocks once reserved
        memory exceeds x times the allowed memory.
    expandable_segments : bool
        Grow one segment per stream and pool by mapping pages (needs a backend with virtual
        memory).
    per_process_memory_fraction : float or None
        0 < x <= 1: cap reserved memory at x times the device's total memory.
    release_lock_on_malloc : bool
        Accepted for compatibility with PyTorch; the Python allocator always holds its lock.
    throw_on_cudamalloc_oom : bool
        With a memory fraction set: a request that would take reserved memory past the
        fraction raises ``OutOfMemoryError`` at once, without releasing the cache and retrying,
        and counts in ``memory_stats()["num_oom_rejections"]`` (and ``num_ooms``). Mirrors
        PyTorch 2.14's key of that name (docs/allocator.md section 13).
    policy : str
        ``"pytorch"`` (the default): PyTorch's policy, exactly. ``"accelrt"``: accelrt's own
        (docs/allocator.md section 16): one address range per pool and size class shared by
        every stream, 2 MiB pages, idle pages moved to where they are needed once reserved
        memory would pass a budget. Needs virtual memory (``sim``, CUDA); ignores
        ``max_split_size_mb``, ``max_non_split_rounding_mb``, ``garbage_collection_threshold``
        and ``expandable_segments``. PyTorch has no such key. Key ``policy``.

    Notes
    -----
    Build one with :meth:`parse` (string), :meth:`coerce` (string, mapping or config) or
    :meth:`from_env`. Mirrors ``PYTORCH_ALLOC_CONF`` / c10's ``CUDAAllocatorConfig``.
    """

    max_split_size: int | None = None
    max_non_split_rounding: int = 20 * MiB
    large_segment_size: int = 20 * MiB
    roundup_power2_divisions: tuple[int, ...] = (0,) * NUM_ROUNDUP_SLOTS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    per_process_memory_fraction: float | None = None
    release_lock_on_malloc: bool = False
    throw_on_cudamalloc_oom: bool = False
    policy: str = "pytorch"

    @classmethod
    def parse(cls, text: str, base: AllocatorConfig | None = None) -> AllocatorConfig:
        """Parse a config string; keys not named keep their value from ``base``.

        Parameters
        ----------
        text : str
            E.g. ``"max_split_size_mb:128,roundup_power2_divisions:[256:1,>:4]"``; empty or
            ``"defaults"``: nothing changed.
        base : AllocatorConfig, optional
            The settings to start from (the defaults when None).

        Returns
        -------
        AllocatorConfig

        Raises
        ------
        TypeError
            If ``text`` is not a string.
        ValueError
            For an unknown key, a malformed item or an out-of-range value; the message names
            the key, the value seen and what is allowed.
        """
        if not isinstance(text, str):
            raise TypeError(f"allocator settings must be a string, got {text!r}")
        updates: dict[str, Any] = {}
        for key, value in _tokenize(text):
            updates[key] = value
        return cls.coerce(updates, base=base)

    @classmethod
    def parse_torch(cls, text: str) -> tuple[AllocatorConfig, list[str]]:
        """Parse a real ``PYTORCH_CUDA_ALLOC_CONF`` string, setting aside what is not modelled.

        Returns
        -------
        (AllocatorConfig, list of str)
            The settings, and the ``key:value`` items left out because the device allocator
            does not depend on them (``UNMODELLED_TORCH_KEYS``: ``backend``, ``pinned_*``...).

        Raises
        ------
        TypeError, ValueError
            As :meth:`parse`, for everything else.
        """
        if not isinstance(text, str):
            raise TypeError(f"allocator settings must be a string, got {text!r}")
        kept: dict[str, Any] = {}
        ignored: list[str] = []
        for key, value in _tokenize(text):
            if key in UNMODELLED_TORCH_KEYS:
                ignored.append(f"{key}:{value}")
            else:
                kept[key] = value
        return cls.coerce(kept), ignored

    @classmethod
    def coerce(
        cls,
        value: AllocatorConfig | str | Mapping[str, Any] | None,
        base: AllocatorConfig | None = None,
    ) -> AllocatorConfig:
        """Return a config from a config, a string, or a mapping of the string form's keys.

        Raises
        ------
        TypeError
            If ``value`` is of another type, or a mapping's value is of the wrong type for its
            key (``int`` or ``str`` for the ``*_mb`` keys, a number or ``str`` for the
            fractions, ``bool`` or ``str`` for the switches); the message names the key.
        ValueError
            As :meth:`parse` (strings are read the same way whether given alone or in a
            mapping).
        """
        config = base if base is not None else cls()
        if value is None:
            return config
        if isinstance(value, AllocatorConfig):
            return value
        if isinstance(value, str):
            return cls.parse(value, base=config)
        if not isinstance(value, Mapping):
            raise TypeError(
                f"allocator config must be an AllocatorConfig, a string or a mapping, "
                f"got {type(value).__name__}"
            )
        changes: dict[str, Any] = {}
        for key, raw in value.items():
            changes.update(_convert(key, raw))
        return dataclasses.replace(config, **changes)

    @classmethod
    def from_env(cls) -> AllocatorConfig:
        """Parse ``ACCELRT_ALLOC_CONF`` (defaults when unset).

        Raises
        ------
        ValueError
            If the variable is set to an invalid string; the message names the variable.
        """
        text = os.environ.get(ENV_VAR, "")
        try:
            return cls.parse(text)
        except ValueError as exc:
            raise InputError(f"{ENV_VAR}={text!r}: {exc}") from None

    @classmethod
    def from_torch_settings(cls, recorded: Mapping[str, Any] | None) -> AllocatorConfig:
        """Translate a PyTorch snapshot's ``allocator_settings`` into a config.

        Parameters
        ----------
        recorded : mapping or None
            The snapshot's ``allocator_settings`` dict (``max_split_size`` in bytes, -1 for
            unlimited; ``garbage_collection_threshold``; ``expandable_segments``;
            ``roundup_power2_divisions`` as ``{"<MiB>": divisions}``; accelrt's ``policy``).
            None or empty: the
            defaults (a snapshot without settings ran on them).

        Returns
        -------
        AllocatorConfig
            Keys accelrt does not model (pinned memory, graph capture) are ignored; values of
            the wrong type are treated as unset.

        Raises
        ------
        ValueError
            If a recorded value is out of the range PyTorch allows (a damaged snapshot).
        """
        if not recorded:
            return cls()
        items: dict[str, str] = {}  # what the string form would say, key by key
        max_split = recorded.get("max_split_size", -1)
        if isinstance(max_split, int) and 0 < max_split < (1 << 62):
            items["max_split_size_mb"] = str(max_split // MiB)
        threshold = recorded.get("garbage_collection_threshold", 0.0)
        if isinstance(threshold, (int, float)) and threshold > 0:
            items["garbage_collection_threshold"] = str(threshold)
        for key in ("expandable_segments", "throw_on_cudamalloc_oom"):
            if recorded.get(key) is True:
                items[key] = "True"
        if recorded.get("policy") in POLICIES:  # accelrt's own key (PyTorch has none)
            items["policy"] = recorded["policy"]
        divisions = recorded.get("roundup_power2_divisions")
        if isinstance(divisions, Mapping) and any(divisions.values()):
            ordered = sorted(_recorded_division(k, v) for k, v in divisions.items())
            items["roundup_power2_divisions"] = "[" + ",".join(f"{k}:{v}" for k, v in ordered) + "]"
        try:
            return cls.coerce(items)
        except ValueError as exc:
            raise InputError(f"{exc} (a recorded setting: the snapshot is damaged)") from None

    def to_torch_settings(self) -> dict[str, Any]:
        """Return the settings as a snapshot's ``allocator_settings``, with PyTorch's keys.

        What PyTorch's snapshot readers expect; :meth:`from_torch_settings` reads it back
        (``per_process_memory_fraction``, which PyTorch does not record, is not kept).
        """
        return {
            "ACCELRT_ALLOC_CONF": self.describe(),
            "max_split_size": self.max_split_size if self.max_split_size is not None else -1,
            "garbage_collection_threshold": self.garbage_collection_threshold,
            "expandable_segments": self.expandable_segments,
            "release_lock_on_malloc": self.release_lock_on_malloc,
            "throw_on_cudamalloc_oom": self.throw_on_cudamalloc_oom,
            "policy": self.policy,
            "roundup_power2_divisions": {
                str(1 << i): d for i, d in enumerate(self.roundup_power2_divisions)
            },
        }

    @property
    def accelrt_only(self) -> bool:
        """Whether only accelrt can use these settings: they name ``policy:accelrt``, which
        PyTorch's allocator does not have (docs/allocator.md section 16)."""
        return self.policy != "pytorch"

    @functools.cached_property
    def rounds_to_divisions(self) -> bool:
        """Whether any ``roundup_power2_divisions`` slot is set (else plain 512-byte rounding)."""
        return any(d > 1 for d in self.roundup_power2_divisions)

    @staticmethod
    def slot_for(size: int) -> int:
        """Return the ``roundup_power2_divisions`` slot of a request of ``size`` bytes."""
        return min(max(size.bit_length() - 1 - 20, 0), NUM_ROUNDUP_SLOTS - 1)

    def roundup_divisions_for(self, size: int) -> int:
        """Return the power-of-two divisions that apply to a request of ``size`` bytes."""
        return self.roundup_power2_divisions[self.slot_for(size)]

    def _items(self) -> list[tuple[str, str]]:
        """The ``(key, value)`` items that differ from the defaults, in the string form's
        order: what :meth:`describe` and :attr:`short_label` write."""
        items = []
        default = AllocatorConfig()
        if self.max_split_size is not None:
            items.append(("max_split_size_mb", str(self.max_split_size // MiB)))
        if self.max_non_split_rounding != default.max_non_split_rounding:
            items.append(("max_non_split_rounding_mb", str(self.max_non_split_rounding // MiB)))
        if self.large_segment_size != default.large_segment_size:
            items.append(("large_segment_size_mb", str(self.large_segment_size // MiB)))
        if self.roundup_power2_divisions != default.roundup_power2_divisions:
            slots = ",".join(f"{1 << i}:{d}" for i, d in enumerate(self.roundup_power2_divisions))
            items.append(("roundup_power2_divisions", f"[{slots}]"))
        if self.garbage_collection_threshold:
            items.append(("garbage_collection_threshold", str(self.garbage_collection_threshold)))
        if self.expandable_segments:
            items.append(("expandable_segments", "True"))
        if self.per_process_memory_fraction is not None:
            items.append(("per_process_memory_fraction", str(self.per_process_memory_fraction)))
        if self.release_lock_on_malloc:
            items.append(("release_lock_on_malloc", "True"))
        if self.throw_on_cudamalloc_oom:
            items.append(("throw_on_cudamalloc_oom", "True"))
        if self.policy != default.policy:
            items.append(("policy", self.policy))
        return items

    def describe(self) -> str:
        """Return the settings that differ from the defaults as a config string."""
        return ",".join(f"{key}:{value}" for key, value in self._items()) or "defaults"

    @property
    def short_label(self) -> str:
        """The settings in the short form of a table's column head (``accelrt replay``).

        The items of :meth:`describe` joined by ``", "``: ``expandable_segments:True`` as
        ``expandable``, ``release_lock_on_malloc:True`` as ``release_lock``,
        ``max_split_size_mb:N`` as ``max_split:N`` (likewise ``non_split_rounding``, ``gc``,
        ``fraction``), and ``roundup_power2_divisions`` as runs of equal divisions per
        power-of-two size in MiB, e.g. ``roundup:[..256:1,512:2,1024:4,2048..:8]``, or
        ``roundup:4`` when all are equal. Other items longer than 28 characters are cut with
        ``...``. ``defaults`` for the defaults.
        """
        shown = []
        for key, value in self._items():
            if key == "expandable_segments":
                shown.append("expandable")
            elif key == "release_lock_on_malloc":
                shown.append("release_lock")
            elif key == "roundup_power2_divisions":
                shown.append(f"roundup:{_short_divisions(self.roundup_power2_divisions)}")
            elif key in _SHORT_KEYS:
                shown.append(f"{_SHORT_KEYS[key]}:{value}")
            else:
                item = f"{key}:{value}"
                shown.append(item if len(item) <= _SHORT_ITEM else item[: _SHORT_ITEM - 3] + "...")
        return ", ".join(shown) or "defaults"


_SHORT_KEYS = {
    "max_split_size_mb": "max_split",
    "max_non_split_rounding_mb": "non_split_rounding",
    "garbage_collection_threshold": "gc",
    "per_process_memory_fraction": "fraction",
}
"""The keys :attr:`AllocatorConfig.short_label` names shorter."""
_SHORT_ITEM = 28
"""A setting item longer than this is cut in a short label (its full text is listed below)."""


def _short_divisions(slots: tuple[int, ...]) -> str:
    """Divisions per slot (size ``1 << i`` MiB) as runs of equal divisions:
    ``[..256:1,512:2,1024:4,2048..:8]``, or ``4`` when every slot has the same."""
    runs: list[list[int]] = []  # [first size, last size, divisions]
    for i, divisions in enumerate(slots):
        if runs and runs[-1][2] == divisions:
            runs[-1][1] = 1 << i
        else:
            runs.append([1 << i, 1 << i, divisions])
    if len(runs) == 1:
        return str(runs[0][2])
    shown = []
    for n, (lo, hi, divisions) in enumerate(runs):
        if lo == hi:
            shown.append(f"{lo}:{divisions}")
        elif n == 0:
            shown.append(f"..{hi}:{divisions}")
        elif n == len(runs) - 1:
            shown.append(f"{lo}..:{divisions}")
        else:
            shown.append(f"{lo}..{hi}:{divisions}")
    return "[" + ",".join(shown) + "]"


@dataclass(frozen=True)
class Setting:
    """Allocator settings and where they came from, as the ``accelrt`` commands report them.

    Attributes
    ----------
    config : AllocatorConfig or None
        The settings; None for a recording's own (each snapshot's ``allocator_settings``).
    source : str
        Where they came from: ``"--config"``, ``"environment ACCELRT_ALLOC_CONF"`` (or
        ``PYTORCH_ALLOC_CONF``, ``PYTORCH_CUDA_ALLOC_CONF``: :data:`ENV_VARS`),
        ``"recorded"``, ``"defaults"`` (nothing asked for, on a trace without a recording),
        or, in a sweep, ``"grid"`` and ``"configs"`` (given to :func:`accelrt.sweep`).
    ignored : tuple of str
        ``key:value`` items of a real ``PYTORCH_CUDA_ALLOC_CONF`` string set aside because the
        device allocator does not depend on them (:meth:`AllocatorConfig.parse_torch`).
    """

    config: AllocatorConfig | None
    source: str
    ignored: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``"recorded"``, or the settings as :meth:`AllocatorConfig.describe` writes them."""
        return RECORDED if self.config is None else self.config.describe()

    @property
    def short_label(self) -> str:
        """``"recorded"``, or :attr:`AllocatorConfig.short_label`: a table's column head."""
        return RECORDED if self.config is None else self.config.short_label


def setting_text(label: str, source: str) -> str:
    """A setting's label and, where that says more, its source: ``defaults (from --config)``,
    ``recorded``, ``max_split_size_mb:64 (from environment ACCELRT_ALLOC_CONF)``."""
    return label if source in ("", label) else f"{label} (from {source})"


def _recorded_division(key: object, value: object) -> tuple[int, int]:
    """One ``{"<MiB>": divisions}`` entry of recorded settings, as two ints."""
    size_mb, divisions = _ascii_int(key), _ascii_int(value)
    if size_mb is None or divisions is None:
        raise InputError(
            f"roundup_power2_divisions entry {_shown(key)}: {_shown(value)} is not a pair of "
            "whole numbers (MiB: divisions) (a recorded setting: the snapshot is damaged)"
        )
    return size_mb, divisions


def _tokenize(text: str) -> list[tuple[str, str]]:
    """Split ``key:value,key:[a:b]`` into (key, value) pairs; brackets keep their commas.

    ``defaults`` alone (:meth:`AllocatorConfig.describe` of the defaults) has no pairs.
    """
    if text.strip() == "defaults":
        return []
    items: list[tuple[str, str]] = []
    depth = 0
    current = ""
    for char in text + ",":
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise InputError(f"unbalanced ']' in allocator settings {text!r}")
        if char == "," and depth == 0:
            item = current.strip()
            current = ""
            if not item:
                continue
            key, sep, value = item.partition(":")
            if not sep or not key.strip() or not value.strip():
                raise InputError(
                    f"malformed allocator setting {item!r} in {text!r}: expected 'key:value'"
                )
            items.append((key.strip(), value.strip()))
        else:
            current += char
    if depth != 0:
        raise InputError(f"unbalanced '[' in allocator settings {text!r}")
    return items


def _convert(key: str, raw: object) -> dict[str, Any]:
    """Validate one setting and return the dataclass fields it sets."""
    if key == "max_split_size_mb":
        return {"max_split_size": _int_at_least(key, raw, 20) * MiB}
    if key == "max_non_split_rounding_mb":
        return {"max_non_split_rounding": _int_at_least(key, raw, 20) * MiB}
    if key == "large_segment_size_mb":
        return {"large_segment_size": _int_at_least(key, raw, 2) * MiB}
    if key == "roundup_power2_divisions":
        return {"roundup_power2_divisions": _divisions(raw)}
    if key == "garbage_collection_threshold":
        value = _float(key, raw)
        if not 0.0 < value < 1.0:
            raise InputError(f"{key} must be a number with 0 < x < 1, got {raw!r}")
        return {"garbage_collection_threshold": value}
    if key == "per_process_memory_fraction":
        value = _float(key, raw)
        if not 0.0 < value <= 1.0:
            raise InputError(f"{key} must be a number with 0 < x <= 1, got {raw!r}")
        return {"per_process_memory_fraction": value}
    if key in ("expandable_segments", "release_lock_on_malloc", "throw_on_cudamalloc_oom"):
        return {key: _bool(key, raw)}
    if key == "policy":
        _check_type(key, raw, (str,), "a string")
        if raw not in POLICIES:
            raise InputError(f"policy must be one of {', '.join(POLICIES)}, got {raw!r}")
        return {"policy": raw}
    raise InputError(f"unknown allocator setting {key!r}; known settings: {', '.join(_KEYS)}")


def _ascii_int(raw: object) -> int | None:
    """``raw`` as an int if it is an int (not bool) or a string of ASCII digits, else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and _DIGITS_RE.fullmatch(raw.strip()):
        return int(raw.strip())
    return None


def _check_type(key: str, raw: object, types: tuple[type, ...], what: str) -> None:
    """Refuse a value of another type than ``types`` (from a mapping; bool is refused too)."""
    if isinstance(raw, bool) or not isinstance(raw, types):
        raise TypeError(f"{key} must be {what}, got {type(raw).__name__} {_shown(raw)}")


def _int_at_least(key: str, raw: object, minimum: int) -> int:
    _check_type(key, raw, (int, str), f"an integer >= {minimum} (MiB)")
    value = _ascii_int(raw)
    allowed = f"allowed: ASCII digits, {minimum} to {MAX_MB} (2**40)"
    if value is None or value < minimum:
        raise InputError(
            f"{key} must be an integer >= {minimum} (MiB), got {_shown(raw)}; {allowed}"
        )
    if value > MAX_MB:
        raise InputError(f"{key} must be at most {MAX_MB} (MiB), got {_shown(raw)}; {allowed}")
    return value


def _float(key: str, raw: object) -> float:
    _check_type(key, raw, (int, float, str), "a number")
    value = math.nan
    if isinstance(raw, str):
        if _DECIMAL_RE.fullmatch(raw.strip()):
            value = float(raw.strip())
    elif isinstance(raw, (int, float)):  # (what _check_type leaves)
        try:
            value = float(raw)
        except OverflowError:  # an int beyond float range
            value = math.inf
    if not math.isfinite(value):
        raise InputError(
            f"{key} must be a number, got {_shown(raw)}; allowed: an ASCII decimal number "
            "such as 0.5 (not nan or inf)"
        )
    return value


def _bool(key: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if raw in ("True", "true", "1"):
        return True
    if raw in ("False", "false", "0"):
        return False
    raise InputError(f"{key} must be True or False, got {raw!r}")


def _division_value(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise TypeError(
            "roundup_power2_divisions values must be integers, got "
            f"{type(raw).__name__} {_shown(raw)}"
        )
    value = _ascii_int(raw)
    if value is None or value < 0 or value > MAX_DIVISIONS or (value & (value - 1)) != 0:
        shown = _shown(raw if isinstance(raw, str) else str(raw))
        raise InputError(
            f"roundup_power2_divisions values must be 0 or a power of two, got {shown}; "
            f"allowed: 0, 1, 2, 4, ... up to {MAX_DIVISIONS} (2**16), in ASCII digits"
        )
    return value


def _divisions(raw: object) -> tuple[int, ...]:
    if isinstance(raw, (list, tuple)):
        if len(raw) != NUM_ROUNDUP_SLOTS:
            raise InputError(
                f"roundup_power2_divisions as a sequence needs {NUM_ROUNDUP_SLOTS} values, "
                f"got {len(raw)}"
            )
        return tuple(_division_value(v) for v in raw)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return (_division_value(raw),) * NUM_ROUNDUP_SLOTS
    if not isinstance(raw, str):
        raise TypeError(
            "roundup_power2_divisions must be a string such as '4' or '[256:1,>:4]', an int, "
            f"or {NUM_ROUNDUP_SLOTS} ints, got {type(raw).__name__} {_shown(raw)}"
        )
    text = raw.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return (_division_value(text),) * NUM_ROUNDUP_SLOTS
    slots = [0] * NUM_ROUNDUP_SLOTS
    first = True
    last_index = 0
    for entry in filter(None, (e.strip() for e in text[1:-1].split(","))):
        interval, sep, value_text = entry.partition(":")
        if not sep:
            raise InputError(
                f"roundup_power2_divisions entry {entry!r} must be 'MiB:divisions' or '>:divisions'"
            )
        value = _division_value(value_text)
        interval = interval.strip()
        if interval == ">":
            for i in range(last_index + 1, NUM_ROUNDUP_SLOTS):
                slots[i] = value
            continue
        size_mb = _ascii_int(interval) or 0
        if size_mb <= 0 or size_mb > MAX_MB or (size_mb & (size_mb - 1)) != 0:
            raise InputError(
                f"roundup_power2_divisions interval {_shown(interval)} must be a power of two in "
                f"MiB; allowed: 1, 2, 4, ... up to {MAX_MB} (2**40), in ASCII digits"
            )
        index = min(size_mb.bit_length() - 1, NUM_ROUNDUP_SLOTS - 1)
        if first:
            for i in range(index):
                slots[i] = value
            first = False
        slots[index] = value
        last_index = index
    return tuple(slots)
