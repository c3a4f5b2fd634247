"""The allocator's policy in one place: rounding, pools, segment and page sizes, the split rule.

The caching allocator and the rewind of PyTorch recordings (``accelrt.trace``) both use these
functions, so the two can never disagree about what PyTorch's CUDACachingAllocator would have
done. docs/allocator.md sections 2, 4 and 7 describe each rule.

Compiled twin (in part): device/_native.pyx repeats ``K_MIN_BLOCK_SIZE``, ``K_SMALL_SIZE``,
``MAX_REQUEST_BYTES`` and ``UNLIMITED``, ``round_size`` (``HitPath.round_size``) and
``should_split`` (in ``HitPath.alloc_found_block``) and ``page_floor`` (``HitPath.note_floor``):
change both (docs/design.md, "Pairs").
"""

from __future__ import annotations

from ._config import AllocatorConfig

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "MAX_REQUEST_BYTES",
    "UNLIMITED",
    "expandable_address_space",
    "page_floor",
    "page_size",
    "round_size",
    "segment_size",
    "should_split",
]

K_MIN_BLOCK_SIZE = 512  # every block is a multiple of this
K_SMALL_SIZE = 1 << 20  # requests up to this go to the small pool
K_SMALL_BUFFER = 2 << 20  # segment size of the small pool; page size of its expandable segments
K_LARGE_BUFFER = 20 << 20  # segment size below K_MIN_LARGE_ALLOC; large expandable page size
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20  # larger segments are rounded to this
MAX_REQUEST_BYTES = 1 << 60
UNLIMITED = 1 << 64
"""The ``max_split_size`` in force when none is set."""


def round_size(nbytes: int, config: AllocatorConfig) -> int:
    """Round a request as PyTorch does (docs/allocator.md section 2).

    Parameters
    ----------
    nbytes : int
        The requested size in bytes (>= 0).
    config : AllocatorConfig
        Supplies ``roundup_power2_divisions``.

    Returns
    -------
    int
        512 for requests below 512; else the next multiple of 512, or with d > 1 power-of-two
        divisions for the request's interval (and ``nbytes > 512 * d``) the next of d equal steps
        between the surrounding powers of two.
    """
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = config.roundup_divisions_for(nbytes) if config.rounds_to_divisions else 0
    if divisions > 1 and nbytes > K_MIN_BLOCK_SIZE * divisions:
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor // divisions
        if step == 0:
            return floor << 1
        rounded = nbytes & ~(step - 1)
        return nbytes if rounded == nbytes else rounded + step
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def segment_size(rounded: int, large_segment: int = K_LARGE_BUFFER) -> int:
    """Return the size of a new ordinary segment for a rounded request (section 2):
    ``large_segment`` bytes (``large_segment_size_mb``, 20 MiB by default) for a request
    above 1 MiB and below 10 MiB."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return large_segment
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


def page_size(is_small: bool, large_segment: int = K_LARGE_BUFFER) -> int:
    """Return the page size of an expandable segment of the small or large pool (section 7):
    2 MiB, or ``large_segment`` bytes (``large_segment_size_mb``) for the large pool."""
    return K_SMALL_BUFFER if is_small else large_segment


def expandable_address_space(total_bytes: int, page_bytes: int) -> int:
    """Return the address space one expandable segment reserves: 1.125 x the device, in pages."""
    wanted = total_bytes + total_bytes // 8
    return -(-wanted // page_bytes) * page_bytes


def should_split(
    block_size: int, rounded: int, is_small: bool, max_split_size: int, expandable: bool
) -> bool:
    """Return True if a block of ``block_size`` given to a ``rounded`` request is split (section 4).

    Parameters
    ----------
    block_size, rounded : int
        The block's bytes and the rounded request's bytes (``block_size >= rounded``).
    is_small : bool
        Whether the block is in a small pool.
    max_split_size : int
        The setting in bytes (``UNLIMITED`` when unset).
    expandable : bool
        Whether expandable segments are in use: then any remainder of 512 bytes or more is
        split off, for every block (PyTorch tests the setting, not the block).
    """
    remaining = block_size - rounded
    if is_small or expandable:
        return remaining >= K_MIN_BLOCK_SIZE
    return rounded < max_split_size and remaining > K_SMALL_SIZE


def page_floor(large_bytes: int, small_bytes: int, large_page: int) -> int:
    """Return the least memory expandable segments can map for these live bytes (section 16).

    Parameters
    ----------
    large_bytes, small_bytes : int
        Bytes of allocated blocks in large and in small pools.
    large_page : int
        The large pool's expandable page (``large_segment_size_mb``, 20 MiB by default).

    Returns
    -------
    int
        ``large_bytes`` in whole ``large_page`` pages plus ``small_bytes`` in whole 2 MiB
        pages: expandable segments map no less, so ``policy:accelrt`` may reserve up to its
        high-water mark without ever going above them.
    """
    return (
        -(-large_bytes // large_page) * large_page
        + -(-small_bytes // K_SMALL_BUFFER) * K_SMALL_BUFFER
    )
