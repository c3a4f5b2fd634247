"""CUDA pinned host memory: ``cuMemHostAlloc`` (portable, page-locked) and ``cuMemFreeHost``."""

from __future__ import annotations

from ._devices import _Devices, _forget_address


class _HostMemory(_Devices):
    """Pinned host memory of the ``cuda`` backend (``host_alloc``, ``host_free``)."""

    def host_memory_pinned(self, index: int) -> bool:
        """True: ``host_alloc`` memory is page-locked by the driver (``cuMemHostAlloc``)."""
        return True

    def host_alloc(self, index: int, nbytes: int) -> int:
        """``cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE)``: page-locked host memory.

        Parameters
        ----------
        index : int
            The device whose primary context allocates it; portable memory is pinned for
            every context, so copies with any device run asynchronously.
        nbytes : int
            Bytes, >= 1.

        Returns
        -------
        int
            The host address, valid until ``host_free``.

        Raises
        ------
        BackendOutOfMemory
            On ``CUDA_ERROR_OUT_OF_MEMORY`` (the host cannot lock that much memory).
        CUDAError
            On any other driver error.

        Notes
        -----
        Mirrors ``cudaHostAlloc`` in PyTorch's ``CachingHostAllocator``.
        """
        portable = int(self.driver.CU_MEMHOSTALLOC_PORTABLE)
        ptr = int(self._call_allocating("cuMemHostAlloc", index, nbytes, nbytes, portable))
        with self._lock:
            self._host.add(ptr)
        return ptr

    def host_free(self, index: int, ptr: int) -> None:
        """``cuMemFreeHost`` of memory from :meth:`host_alloc`; raises ``ValueError`` if
        ``ptr`` is not an address ``host_alloc`` returned, ``CUDAError`` if the driver fails."""
        with self._lock:
            _forget_address(self._host, index, ptr, "host_alloc")
        self._call("cuMemFreeHost", index, ptr)
