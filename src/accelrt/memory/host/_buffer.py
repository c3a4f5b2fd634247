"""``HostBuffer``: host memory from the host (pinned) caching allocator."""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING

from ..._device import Device
from ..._readonly import read_only
from ..._stream import Stream
from ..buffers._buffer import ExportPin, FreedWhenCollected, MemoryHandle

if TYPE_CHECKING:
    from ._allocator import HostBlock, HostCachingAllocator

__all__ = ["HostBuffer"]


class HostBuffer(MemoryHandle, FreedWhenCollected):
    """Host memory handed out by ``accelrt.empty_host`` (pinned where the backend can pin).

    Attributes
    ----------
    nbytes : int
        The size the caller asked for, in bytes (the block is this rounded up to a power of
        two; see ``accelrt.host_memory_stats()``).

    Notes
    -----
    ``ptr``, ``device`` and ``pinned`` are properties. ``free()``, leaving a ``with`` block, or
    garbage collection returns the memory to the host caching allocator (not to the system);
    freeing twice does nothing. Every other use of a freed buffer (``ptr``, ``numpy()``,
    DLPack, the buffer protocol, ``accelrt.copy_``, ``accelrt.record_stream``) raises
    ``ValueError``. The memory outlives ``free()`` while an export views it (a ``numpy()``
    view, a slice or view of one, a DLPack capsule, a buffer-protocol view): the buffer reads
    as freed at once, but its block stays allocated (counted in ``host_memory_stats()``,
    handed to no other buffer) and returns to the allocator when the last export is gone,
    wherever that happens, as a PyTorch storage outlives its tensor while another views it.

    ``accelrt.copy_`` between a HostBuffer and a device ``Buffer`` is asynchronous on its
    stream and records the stream on the buffer, so the memory is not reused before the copy
    has run. Synchronize that stream before reading a device-to-host destination or writing
    a host-to-device source again. The buffer protocol (``memoryview(host)``) needs Python
    3.12 or later; ``numpy()`` works everywhere. Mirrors a pinned ``torch.uint8`` CPU tensor.

    Examples
    --------
    >>> import numpy as np, accelrt as acc
    >>> host = acc.empty_host(16)
    >>> host.numpy()[:] = np.arange(16, dtype=np.uint8)
    >>> with acc.empty(16) as dev:
    ...     _ = acc.copy_(dev, host)
    ...     out = acc.copy_(acc.empty_host(16), dev)
    ...     acc.synchronize()
    >>> int(out.numpy()[15])
    15
    >>> host.free()
    """

    __slots__ = (
        "__weakref__", "_address", "_allocator", "_block", "_device", "_pin", "_pinned", "_view",
        "nbytes",
    )  # fmt: skip

    def __init__(
        self,
        allocator: HostCachingAllocator | None,
        block: HostBlock | None,
        nbytes: int,
        device: Device,
        pinned: bool,
    ) -> None:
        self._allocator = allocator
        self._block = block
        self._address = block.address if block is not None else 0
        self._device = device
        self._pinned = pinned
        self._view: memoryview | None = None  # made on first use by _memoryview
        self._pin: ExportPin | weakref.ref[ExportPin] | None = None  # set by the first export
        self.nbytes = nbytes

    @property
    def ptr(self) -> int:
        """The host address of the memory (0 for an empty buffer).

        Raises
        ------
        ValueError
            If the buffer was freed.
        """
        if self._block is None and self.nbytes:
            raise self._freed_error()
        return self._address

    device: read_only[Device] = read_only(
        "_device", "The device the memory is for (whose backend allocated and pinned it)."
    )
    pinned: read_only[bool] = read_only(
        "_pinned",
        "True if the memory is the driver's pinned host memory, False if ordinary memory.",
    )

    def _no_block_error(self) -> ValueError:
        if self.nbytes:
            return self._freed_error()
        return ValueError(f"{self!r} is empty and has no block")

    def _freed_error(self) -> ValueError:
        return ValueError(
            f"{self!r} was freed: its memory went back to the host allocator; allocate "
            "another with accelrt.empty_host()"
        )

    def record_stream(self, stream: Stream) -> None:
        """Mark the memory as used on ``stream``: it is not reused before that work ends.

        ``accelrt.copy_`` does this by itself; call it for other work that reads or writes
        the memory on a stream. No-op for an empty buffer.

        Raises
        ------
        TypeError
            If ``stream`` is not a Stream.
        ValueError
            If the buffer was freed, or the stream belongs to another backend.
        """
        if not isinstance(stream, Stream):
            raise TypeError(f"record_stream() takes a Stream, got {type(stream).__name__}")
        if self.nbytes == 0:
            return
        block = self.block
        if stream._backend.name != self._device.type:
            raise ValueError(
                f"stream {stream!r} is not a {self._device.type!r} stream: the host buffer "
                f"belongs to {self._device}'s backend"
            )
        self.allocator.record_stream(block, stream._index, stream._handle)

    def _memoryview(self) -> memoryview:
        """A writable, 1-D ``uint8`` view of the memory, for accelrt's own use (copies): it
        keeps neither the buffer nor the memory alive, so it is no export.

        Made once (a ctypes array and two views cost about 0.4 us; copies ask on every call).

        Raises
        ------
        ValueError
            If the buffer was freed.
        """
        if self._block is None:
            if self.nbytes:
                raise self._freed_error()
            return memoryview(bytearray(0))
        view = self._view
        if view is None:
            array = (ctypes.c_char * self.nbytes).from_address(self._address)
            view = self._view = memoryview(array).cast("B")
        return view

    def _host_memory(self) -> memoryview:
        """``numpy()``'s writable buffer of the memory; a ``ValueError`` if it was freed."""
        return self._memoryview()

    def __buffer__(self, flags: int) -> memoryview:
        """The buffer protocol (PEP 688, Python 3.12+): a writable 1-D ``uint8`` view.

        The view is one of ``numpy()``'s and keeps the buffer and its memory as that does (a
        ``free()`` while it lives takes effect when it is released).

        Raises
        ------
        ValueError
            If the buffer was freed.
        """
        return self.numpy().data

    def __repr__(self) -> str:
        state = ", freed" if self.freed else ""
        return (
            f"HostBuffer(ptr={self._address:#x}, nbytes={self.nbytes}, device={self._device!s}, "
            f"pinned={self._pinned}{state})"
        )
