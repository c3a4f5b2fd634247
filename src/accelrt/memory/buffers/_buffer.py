"""``Buffer``: device memory from the caching allocator (pointer, size, device, stream).

Compiled twin: buffers/_native.pyx ``Buffer`` repeats ``_BufferFields`` (the fields and the
finaliser) and ``MemoryHandle.free``, and adopts ``_BufferAPI`` at import; change both
(docs/design.md, "Pairs").
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, SupportsIndex, TypeVar

from ..._compiled import load
from ..._device import Device
from .._atomic import PENDING, deliver, register
from ..device import _core

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from ..._stream import Stream
    from ..device._block import Block
    from ..device._core import CachingAllocator

__all__ = ["ArrayOwner", "Buffer", "ExportPin", "FreedWhenCollected", "MemoryHandle"]

#: buffers/_native.pyx (``Buffer`` compiled) where the allocator's compiled
#: core runs, else None
native = None if _core.native is None else load("accelrt.memory.buffers._native")[0]

_H = TypeVar("_H", bound="MemoryHandle")
_B = TypeVar("_B", covariant=True)
_A = TypeVar("_A", covariant=True)


_KDL_ONEAPI = 14
"""DLPack's device type of oneAPI (SYCL) USM memory: the ``xpu`` backend's."""


class _Owning(Protocol[_B, _A]):
    """A memory handle's fields that ``block`` and ``allocator`` read (Buffer, HostBuffer)."""

    @property
    def _block(self) -> _B | None: ...
    @property
    def _allocator(self) -> _A | None: ...
    @property
    def nbytes(self) -> int: ...
    def _no_block_error(self) -> ValueError: ...


_new_pin_lock = threading.Lock()  # two threads' first exports of one handle share one pin


class ArrayOwner:
    """Exposes memory to numpy while keeping the owning buffer alive (Buffer, HostBuffer)."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, interface: dict[str, object], owner: object) -> None:
        self.__array_interface__ = interface
        self.owner = owner


class MemoryHandle:
    """What :class:`Buffer` and ``HostBuffer`` share: use as a context manager, ``len``, the
    DLPack export of ``numpy()``, and the rule that memory outlives ``free()`` while an export
    of it lives (:class:`ExportPin`)."""

    __slots__ = ()
    nbytes: int

    if TYPE_CHECKING:  # a field of each handle (Buffer's two cores, HostBuffer)
        _pin: ExportPin | weakref.ref[ExportPin] | None

        def _host_memory(self) -> memoryview: ...

    @property
    def block(self: _Owning[_B, _A]) -> _B:
        """The allocator's block behind the memory.

        Raises
        ------
        ValueError
            If the memory was freed, or the handle is empty.
        """
        block = self._block
        if block is None:
            raise self._no_block_error()
        return block

    @property
    def allocator(self: _Owning[_B, _A]) -> _A:
        """The caching allocator that owns the memory.

        Raises
        ------
        ValueError
            If the handle is empty (0 bytes: it has no allocator).
        """
        allocator = self._allocator
        if allocator is None:
            raise ValueError(f"{self!r} is empty and has no allocator")
        return allocator

    @property
    def freed(self: _Owning[object, object]) -> bool:
        """True once the memory has been given back."""
        return self._block is None and self.nbytes > 0

    def free(self) -> None:
        """Give the memory back to its caching allocator, or to the exports that still view
        it. Freeing twice does nothing.

        Notes
        -----
        The block is reused once the work of every stream that used it (``copy_``,
        ``record_stream``) has completed. While an export of the memory lives (``numpy()``,
        DLPack, a host buffer's buffer protocol), the handle reads as freed at once but the
        block goes back only when the last export is gone (a ``Buffer``'s Notes say more).
        Thread-safe.
        """
        handle: Any = self  # a Buffer or HostBuffer: both have _block, _allocator and _pin
        try:  # atomic: the block is freed (or deferred) exactly when the handle lets go of it
            block, handle._block = handle._block, None
            if (
                block is not None
                and handle._allocator is not None
                and (handle._pin is None or not self._defer_free(block))
            ):
                handle._allocator.free(block)
        finally:
            if PENDING.flag:
                deliver()

    def numpy(self) -> npt.NDArray[np.uint8]:
        """Return a zero-copy ``uint8`` numpy view of the memory.

        Returns
        -------
        numpy.ndarray
            1-D, ``nbytes`` long, writable. It keeps the buffer alive, and the memory too: a
            ``free()`` while it (or a slice or view of it) lives marks the buffer freed, and
            the block returns to the allocator when the last of them is gone.

        Raises
        ------
        ValueError
            If the buffer was freed.
        TypeError
            For a ``Buffer`` whose device's memory is not host-accessible (use
            ``accelrt.copy_``).

        Notes
        -----
        Does not synchronize: synchronize the stream of the device work or copy that may still
        be writing the memory (``buffer.stream.synchronize()``) before reading it, or reading
        it before writing it.
        """
        if self.nbytes == 0:
            import numpy as np

            return np.empty(0, dtype=np.uint8)
        return self._exported_array(self._host_memory())

    def __dlpack__(self, *, stream: object = None, **kwargs: Any) -> object:
        """Export the memory as a DLPack capsule (``uint8``, 1-D) for zero-copy consumers.

        The capsule is numpy's, of a ``numpy()`` view: it keeps the memory as that view does
        (a ``free()`` before the consumer is done takes effect when the consumer is).

        Raises
        ------
        TypeError, ValueError
            As ``numpy()``: memory that is not host-accessible, or freed.
        """
        return self.numpy().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """Return ``(kDLCPU, 0)``: the memory is exported as CPU memory."""
        return (1, 0)

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.free()

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        """Refuse ``copy.copy``, ``copy.deepcopy`` and ``pickle``: two handles owning one block
        would free it twice, the second time perhaps after another buffer got the memory.

        Raises
        ------
        TypeError
            Always; ``accelrt.copy_`` copies the bytes into a buffer of their own.
        """
        raise TypeError(
            f"an accelrt.{type(self).__name__} owns its memory and cannot be copied or "
            "pickled; copy its bytes into memory of their own with accelrt.copy_ (to a new "
            "buffer, or to a numpy array)"
        )

    def __len__(self) -> int:
        return self.nbytes

    def _live_pin(self) -> ExportPin | None:
        """The pin of this handle's live exports, or None when there is none."""
        held = self._pin
        if held is None or isinstance(held, ExportPin):  # kept for the handle's lifetime
            return held
        return held()  # a weak reference: None once the last export died

    def _export_pin(self) -> ExportPin:
        """The pin a new export holds: the live one, else a new one the handle refers to
        weakly (so that it dies with the last export)."""
        pin = self._live_pin()
        if pin is None:
            with _new_pin_lock:
                pin = self._live_pin()
                if pin is None:
                    pin = ExportPin()
                    handle: Any = self  # (mypy: _pin is in the subclasses' __slots__)
                    handle._pin = weakref.ref(pin)
        return pin

    def _defer_free(self, block: object) -> bool:
        """``free()``'s path for a handle that made exports (``_pin`` set): give ``block``,
        which the handle has already let go of, to the live pin and return True (the pin's
        finaliser frees it); return False if no export is left (free it now)."""
        handle: Any = self
        try:  # atomic: the block is in the pin exactly when this returns True
            pin = self._live_pin()
            if pin is None:
                return False
            pin._allocator = handle._allocator
            pin._block = block
            return True
        finally:
            if PENDING.flag:
                deliver()

    def _exported_array(self, view: memoryview) -> npt.NDArray[np.uint8]:
        """A ``uint8`` numpy array over ``view`` (a writable buffer of the memory) that holds
        this handle and its export pin: the memory outlives ``free()`` while the array (or a
        slice of it, or a DLPack capsule of it) lives."""
        import numpy as np

        array = np.frombuffer(view, dtype=np.uint8)
        owner = (self, self._export_pin(), array)
        return np.asarray(ArrayOwner(array.__array_interface__, owner))


register(MemoryHandle.free)
register(MemoryHandle._defer_free)


class FreedWhenCollected:
    """The Python finaliser of memory handles (``HostBuffer``, and ``Buffer`` where the
    compiled core does not run; the compiled ``Buffer`` has its own): garbage collection
    gives the block back, without re-entering an allocator."""

    __slots__ = ()

    def __del__(self) -> None:
        # A finaliser may run anywhere, even inside an allocator call on this thread (the
        # garbage collector runs when objects are made): free_soon never re-enters one.
        handle: Any = self  # a Buffer or HostBuffer: both have _block and _allocator
        try:  # no imports in __del__: it may run at interpreter exit
            block, handle._block = handle._block, None
            if block is not None and handle._allocator is not None:
                handle._allocator.free_soon(block)
        except Exception:  # __del__ never raises
            pass
        finally:  # atomic (a KeyboardInterrupt here would be dropped with the free undone)
            if PENDING.flag:
                deliver()


register(FreedWhenCollected.__del__)


class ExportPin(FreedWhenCollected):
    """What every export of a memory handle's memory holds, besides the handle itself.

    The exports are ``numpy()`` views (their slices and views keep them through ``base``, and
    numpy's DLPack capsules through the array), the CUDA DLPack capsule, and a host buffer's
    buffer-protocol view. A handle makes one pin for all its live exports and refers to it
    weakly, so the pin dies with the last of them. When ``free()`` runs while the pin lives,
    the handle reads as freed at once, but its block goes to the pin instead of the allocator:
    it stays allocated (and counted in ``memory_allocated()``) until the last export dies,
    and then the pin's finaliser frees it through the allocator's ``free_soon``, which is safe
    anywhere, even inside an allocator call (PyTorch keeps a storage alive while a tensor
    views it). After ``__cuda_array_interface__`` was read, whose consumers hold the
    ``Buffer`` itself, the buffer holds its pin strongly instead: the block is then freed when
    the buffer is collected.
    """

    __slots__ = ("__weakref__", "_allocator", "_block")

    def __init__(self) -> None:
        self._allocator: Any = None  # set with _block, by MemoryHandle._defer_free
        self._block: Any = None


class _BufferFields(FreedWhenCollected):
    """The fields and finaliser of :class:`Buffer` in Python, where the compiled core does not
    run (its ``free`` is ``MemoryHandle``'s; elsewhere ``Buffer`` is memory/buffers/_native.pyx's
    compiled type, this class's twin, given the Python-level part, ``_BufferAPI``)."""

    __slots__ = ("__weakref__", "_allocator", "_block", "_pin", "_stream", "nbytes", "ptr")

    def __init__(
        self,
        allocator: CachingAllocator | None,
        block: Block | None,
        nbytes: int,
        stream: Stream,
    ) -> None:
        self._allocator = allocator
        self._block = block
        self._pin: ExportPin | weakref.ref[ExportPin] | None = None  # set by the first export
        self._stream = stream
        self.nbytes = nbytes
        self.ptr = block.address if block is not None else 0


# Buffer's Python-level part, written once for both cores: the Python Buffer below derives
# from it; the compiled one adopts it (memory/buffers/_native.pyx ``adopt``). Its docstring
# is Buffer's.
class _BufferAPI(MemoryHandle):
    """A block of device memory handed out by ``accelrt.empty``.

    Attributes
    ----------
    ptr : int
        The device address (0 for an empty buffer).
    nbytes : int
        The size the caller asked for, in bytes (the block may be larger; see
        ``memory_stats()['allocated_bytes.all.current']``).
    device : Device
        The device the memory is on.
    stream : Stream
        The stream the memory was allocated on; it can be reused on that stream as soon as it
        is freed.

    Notes
    -----
    ``free()``, leaving a ``with`` block, or garbage collection returns the memory to the
    caching allocator (not to the device). If another stream used the memory, call
    ``accelrt.record_stream(buffer, stream)`` first, as with ``torch.Tensor.record_stream``.
    Not thread-safe to free from two threads at once.

    The memory outlives ``free()`` while an export views it, as a PyTorch storage outlives
    ``del`` of its tensor while another tensor views it. ``free()`` makes the buffer read as
    freed at once (``freed`` is True; ``block``, ``numpy()``, DLPack, ``copy_`` and
    ``record_stream`` raise ``ValueError``; a second ``free()`` does nothing), but while a
    ``numpy()`` view, a slice or view of one, or a DLPack capsule lives, the block stays
    allocated (counted in ``memory_allocated()``, handed to no other buffer) and returns to
    the allocator when the last of them is gone, wherever that happens. Once
    ``__cuda_array_interface__`` was read, whose consumers keep the buffer object itself, the
    block returns when the buffer is garbage-collected (the program and every consumer have
    dropped it).
    """

    __slots__ = ()
    if TYPE_CHECKING:  # the fields, from _BufferFields or the compiled type
        _allocator: CachingAllocator | None
        _block: Block | None
        _stream: Stream
        ptr: int

    @property
    def device(self) -> Device:
        """The device the memory is on."""
        return self._stream.device

    @property
    def stream(self) -> Stream:
        """The stream the memory was allocated on."""
        return self._stream

    def _no_block_error(self) -> ValueError:
        return ValueError(f"{self!r} holds no memory (freed or empty)")

    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        """The CUDA Array Interface (version 3) of the memory, on ``cuda`` buffers only.

        A 1-D ``uint8`` array: ``shape`` ``(nbytes,)``, ``typestr`` ``"|u1"``, ``data``
        ``(ptr, False)`` (writable), ``strides`` None (C-contiguous), ``version`` 3, and
        ``stream`` the buffer's native ``CUstream`` (1, the legacy default stream, when the
        buffer is on the default stream), on which consumers (CuPy, Numba, PyTorch) wait
        before using the memory.

        Raises
        ------
        AttributeError
            If the buffer is not CUDA memory, so that ``hasattr`` is False there.
        ValueError
            If the buffer was freed.

        Notes
        -----
        Consumers keep the object whose interface they read (CuPy, Numba and PyTorch do), so
        once the interface was read the block outlives ``free()`` until the buffer is
        garbage-collected: ``free()`` marks the buffer freed, and the block returns to the
        allocator when the program and every consumer have dropped the buffer. A consumer
        that keeps only the pointer must be done before the buffer is dropped. If the consumer
        uses the memory on another stream, ``accelrt.record_stream`` it before freeing, as
        for any buffer.
        """
        stream = self._interface_stream("cuda", "__cuda_array_interface__")
        return {**self._pinned_array_interface(version=3), "stream": stream._handle or 1}

    @property
    def __sycl_usm_array_interface__(self) -> dict[str, object]:
        """The SYCL USM Array Interface (version 1) of the memory, on ``xpu`` buffers only.

        A 1-D ``uint8`` array as dpctl and dpnp read it: ``shape`` ``(nbytes,)``, ``typestr``
        ``"|u1"``, ``data`` ``(ptr, False)`` (writable), ``strides`` None (C-contiguous),
        ``version`` 1, and ``syclobj`` the ``dpctl.SyclQueue`` of the buffer's stream (whose
        context the memory belongs to), so that ``dpctl.memory.as_usm_memory(buf)`` or
        ``dpnp.asarray(buf)`` shares the memory without a copy.

        Raises
        ------
        AttributeError
            If the buffer is not XPU memory, so that ``hasattr`` is False there.
        ValueError
            If the buffer was freed, or its stream was destroyed.

        Notes
        -----
        As ``__cuda_array_interface__``: once read, the block outlives ``free()`` until the
        buffer is garbage-collected (consumers such as dpctl keep the buffer object). Work the
        consumer submits to another queue must be ordered after the buffer's stream (the
        interface carries no stream); ``accelrt.record_stream`` it before freeing.
        """
        stream = self._interface_stream("xpu", "__sycl_usm_array_interface__")
        queue = stream._backend.queue(stream._index, stream._handle)  # type: ignore[attr-defined]
        return {**self._pinned_array_interface(version=1), "syclobj": queue}

    def _interface_stream(self, backend: str, interface: str) -> Stream:
        """The buffer's stream, if its memory is ``backend``'s; else ``AttributeError`` naming
        ``interface`` (so that ``hasattr(buf, interface)`` is False there)."""
        stream = self._stream
        if stream._backend.name != backend:
            raise AttributeError(
                f"memory of {stream.device} is not {backend.upper()} memory (no {interface})"
            )
        return stream

    def _pinned_array_interface(self, version: int) -> dict[str, object]:
        """The fields the CUDA and SYCL USM array interfaces share: the memory as a writable,
        C-contiguous 1-D ``uint8`` array. Pins the block to the buffer first (it outlives
        ``free()`` until the buffer is collected); ``ValueError`` if the buffer was freed."""
        if self.nbytes:
            self.block  # noqa: B018 (raises ValueError if freed)
            handle: Any = self  # _pin is a field of each core's Buffer
            handle._pin = self._export_pin()  # held by the buffer: its consumers hold it
        return {
            "shape": (self.nbytes,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "strides": None,
            "version": version,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        """Return the DLPack device: what the backend's optional ``dlpack_device(index)`` says
        (``(kDLCUDA = 2, CUDA ordinal)`` on ``cuda``, ``(kDLOneAPI = 14, dpctl device id)`` on
        ``xpu``), else ``(kDLCPU = 1, 0)`` (host-accessible memory exported as CPU memory)."""
        stream = self._stream
        dlpack_device = getattr(stream._backend, "dlpack_device", None)
        if dlpack_device is None:
            return (1, 0)
        kind, device_id = dlpack_device(stream._index)
        return int(kind), int(device_id)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
        **kwargs: Any,
    ) -> object:
        """Export the memory as a DLPack capsule (``uint8``, 1-D) for zero-copy consumers.

        Parameters
        ----------
        stream : int, dpctl.SyclQueue or None
            CUDA memory: the consumer's stream, as the DLPack protocol defines it: None or 1
            the legacy default stream, 2 the per-thread default stream, another positive int a
            native ``CUstream``, -1 no synchronisation. Unless -1 or the buffer's own stream,
            an event recorded on the buffer's stream is made a dependency of the consumer's
            stream (no host blocking). oneAPI (``xpu``) memory: the consumer's queue; unless
            -1, the buffer's stream is synchronized first (the host waits). Other devices:
            ignored.
        max_version : tuple of (int, int), optional
            The highest DLPack version the consumer understands; (1, 0) or later gives a
            versioned capsule (``"dltensor_versioned"``), None a legacy ``"dltensor"`` one.
        dl_device : tuple of (int, int), optional
            The device the consumer wants the data on; only ``__dlpack_device__()`` is served,
            and on ``xpu`` also ``(kDLCPU, 0)`` where the memory is host-accessible (as
            ``numpy()``).
        copy : bool, optional
            True asks for a copy, which accelrt does not make; None and False never copy.

        Returns
        -------
        PyCapsule
            It keeps the buffer alive until the consumer deletes the tensor, and the memory
            too: a ``free()`` before then marks the buffer freed, and the block returns to the
            allocator when the tensor is deleted (or the unconsumed capsule destroyed).

        Raises
        ------
        BufferError
            CUDA and oneAPI memory: if ``dl_device`` is another device, or ``copy`` is True.
        ValueError
            If the buffer was freed; CUDA memory: if ``stream`` is 0 or below -1 (0 is
            ambiguous and disallowed by the protocol).
        TypeError
            CUDA memory: if ``stream`` is not an int or None. Other memory: if it is not
            host-accessible (as ``numpy()``).

        Notes
        -----
        Other memory is exported through ``numpy()`` as CPU memory, and ``dl_device`` and
        ``copy`` are numpy's to serve. Mirrors ``torch.Tensor.__dlpack__``; the stream rules
        are the Python array API's.
        """
        device = self.__dlpack_device__()
        if device[0] == _KDL_ONEAPI and dl_device is not None and tuple(dl_device) == (1, 0):
            device = (1, 0)  # the consumer asks for the host view (host-accessible USM)
        if device[0] not in (2, _KDL_ONEAPI):  # numpy's export (it serves dl_device and copy)
            for key, value in (("max_version", max_version), ("dl_device", dl_device)):
                if value is not None:
                    kwargs[key] = value
            if copy is not None:
                kwargs["copy"] = copy
            return MemoryHandle.__dlpack__(self, stream=stream, **kwargs)
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(
                f"{self!r} is on DLPack device {device}, not {tuple(dl_device)}; accelrt does "
                "not copy on export (use accelrt.copy_)"
            )
        if copy:
            raise BufferError("accelrt does not copy on export: pass copy=None or False")
        oneapi = device[0] == _KDL_ONEAPI
        if not oneapi:  # CUDA: the protocol's stream numbers
            if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)):
                raise TypeError(f"DLPack stream must be an int or None, got {stream!r}")
            if stream == 0 or (stream is not None and stream < -1):
                raise ValueError(
                    f"DLPack stream {stream} is not allowed: pass 1 for the legacy default "
                    "stream, 2 for the per-thread one, a CUstream, or -1 for no synchronisation"
                )
        if self.nbytes:
            self.block  # noqa: B018 (raises ValueError if freed)
        own = self._stream
        if oneapi:  # the consumer's queue gets the memory once the buffer's stream is idle
            if stream != -1:
                own.synchronize()
        else:
            consumer = 1 if stream is None else stream
            if consumer != -1 and consumer != (own._handle or 1):
                backend, index = own._backend, own._index
                event = backend.event_create(index, False)
                try:
                    backend.event_record(event, index, own._handle)
                    backend.stream_wait_event(index, consumer, event)
                finally:
                    backend.event_destroy(event)
        from . import _dlpack

        versioned = max_version is not None and tuple(max_version) >= _dlpack.DLPACK_VERSION
        owner = (self, self._export_pin())
        return _dlpack.to_capsule(self.ptr, self.nbytes, device[0], device[1], owner, versioned)

    def _host_memory(self) -> memoryview:
        """``numpy()``'s writable buffer of the memory (the backend's host view of it); a
        ``ValueError`` if it was freed, a ``TypeError`` if it is not host-accessible."""
        block = self.block
        device = self.device
        view = self.allocator.backend.host_view(device.index or 0, block.address, self.nbytes)
        if view is None:
            raise TypeError(
                f"memory of {device} is not host-accessible; copy it with accelrt.copy_(host, buf)"
            )
        return view

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        return f"Buffer(ptr={self.ptr:#x}, nbytes={self.nbytes}, device={self.device!s}{state})"


if TYPE_CHECKING or native is None:

    class Buffer(_BufferFields, _BufferAPI):
        __doc__ = _BufferAPI.__doc__
        __slots__ = ()

else:  # the compiled type, given the Python-level part above (memory/buffers/_native.pyx)
    Buffer = native.Buffer
    native.adopt(Buffer, _BufferAPI)
