"""CUDA device memory: ``cuMemAlloc``/``cuMemFree`` and virtual memory for expandable
segments (address ranges reserved, pages of the allocation granularity mapped and unmapped)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._devices import _Devices, _forget_address, _Reservation

if TYPE_CHECKING:
    from cuda.bindings.driver import CUmemAllocationProp, CUmemGenericAllocationHandle


class _DeviceMemory(_Devices):
    """Device memory and virtual memory (``vm_*``) of the ``cuda`` backend."""

    def malloc(self, index: int, nbytes: int) -> int:
        """``cuMemAlloc``: ``nbytes`` of device memory, 256-byte aligned.

        Raises
        ------
        BackendOutOfMemory
            On ``CUDA_ERROR_OUT_OF_MEMORY`` (the allocator frees cached blocks and retries).
        CUDAError
            On any other driver error.
        """
        state = self._dev(index)
        if self._captures:
            ptr = self._malloc_while_capturing(index, nbytes)
        else:
            ptr = int(self._call_allocating("cuMemAlloc", index, nbytes, nbytes))
        state.allocations.add(ptr)
        return ptr

    def _malloc_while_capturing(self, index: int, nbytes: int) -> int:
        """``cuMemAlloc`` with this thread's capture mode relaxed around it: a capture in global
        or thread-local mode refuses ``cuMemAlloc`` (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``),
        yet a graph's pool grows during capture; the graph records nothing for it and replays
        allocate nothing (PyTorch's ``cudaMallocMaybeCapturing``)."""
        relaxed = self.driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        previous = self._call("cuThreadExchangeStreamCaptureMode", index, relaxed)
        try:
            return int(self._call_allocating("cuMemAlloc", index, nbytes, nbytes))
        finally:
            self._call("cuThreadExchangeStreamCaptureMode", index, previous)

    def free(self, index: int, ptr: int) -> None:
        """``cuMemFree`` (which waits for the device's queued work, as the Protocol asks).

        Raises
        ------
        ValueError
            If ``ptr`` is not an address ``malloc`` returned.
        CUDAError
            If the driver fails (the memory then counts as freed).
        """
        _forget_address(self._dev(index).allocations, index, ptr, "malloc")
        self._call("cuMemFree", index, self.driver.CUdeviceptr(ptr))

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """``cuMemGetInfo``: ``(free bytes, total bytes)`` of the device, all processes counted.

        Retains the device's primary context (as ``torch.cuda.mem_get_info`` initialises it).
        """
        free, total = self._call("cuMemGetInfo", index)
        return int(free), int(total)

    def _allocation_prop(self, index: int) -> CUmemAllocationProp:
        drv = self.driver
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self._devices()[index]
        return prop

    def vm_granularity(self, index: int) -> int:
        """The device's minimum allocation granularity in bytes (2 MiB on current GPUs).

        ``cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM)`` for pinned device
        memory; ``vm_map`` maps and ``vm_unmap`` unmaps whole pages of this size.
        """
        granularity = self._granularity.get(index)
        if granularity is None:
            self._device(index)  # cuInit first, where NVML counted the devices
            option = self.driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            granularity = int(
                self._call(
                    "cuMemGetAllocationGranularity", index, self._allocation_prop(index), option
                )
            )
            self._granularity[index] = granularity
        return granularity

    def _check_pages(self, index: int, what: str, nbytes: int) -> int:
        granularity = self.vm_granularity(index)
        if nbytes <= 0 or nbytes % granularity:
            raise ValueError(
                f"cuda:{index}: {what} {nbytes} bytes: not a positive multiple of the device's "
                f"{granularity}-byte allocation granularity"
            )
        return granularity

    def vm_reserve(self, index: int, nbytes: int) -> int:
        """``cuMemAddressReserve``: ``nbytes`` of address space, no memory behind it.

        Raises
        ------
        ValueError
            If ``nbytes`` is not a positive multiple of ``vm_granularity``.
        BackendOutOfMemory
            If the driver has no address space left (``CUDA_ERROR_OUT_OF_MEMORY``).
        CUDAError
            On any other driver error.
        """
        granularity = self._check_pages(index, "reserve", nbytes)
        state = self._dev(index)
        start = self.driver.CUdeviceptr(0)  # no preferred address
        address = int(
            self._call_allocating(
                "cuMemAddressReserve", index, nbytes, nbytes, granularity, start, 0
            )
        )
        with self._lock:
            state.reservations[address] = _Reservation(nbytes)
        return address

    def vm_release(self, index: int, address: int) -> None:
        """``cuMemAddressFree`` of a range from ``vm_reserve``.

        Raises
        ------
        ValueError
            If ``address`` is not a reserved range or a page of it is still mapped.
        CUDAError
            If the driver fails.
        """
        state = self._dev(index)
        with self._lock:
            reservation = state.reservations.get(address)
            if reservation is None or reservation.handles:
                raise ValueError(
                    f"cuda:{index}: {address:#x} is not a reserved range with every page unmapped"
                )
            del state.reservations[address]
        self._call("cuMemAddressFree", index, self.driver.CUdeviceptr(address), reservation.size)

    def _pages(self, index: int, address: int, nbytes: int) -> tuple[_Reservation, list[int]]:
        """The reservation holding ``[address, address + nbytes)`` and the page addresses."""
        granularity = self._check_pages(index, "map or unmap", nbytes)
        state = self._dev(index)
        for base, reservation in state.reservations.items():
            if base <= address and address + nbytes <= base + reservation.size:
                if (address - base) % granularity:
                    break
                return reservation, list(range(address, address + nbytes, granularity))
        raise ValueError(
            f"cuda:{index}: [{address:#x}, {address + nbytes:#x}) is not a page-aligned range "
            "inside one reserved range"
        )

    def vm_map(self, index: int, address: int, nbytes: int) -> None:
        """Back ``[address, address + nbytes)`` of a reserved range with device memory.

        One ``cuMemCreate`` handle per granularity page, ``cuMemMap`` of each, then one
        ``cuMemSetAccess`` (read-write for the device) over the range: PyTorch's
        ``ExpandableSegment::map``. Either every page is mapped or, on failure, none.

        Raises
        ------
        ValueError
            If the range is not whole pages inside one reserved range, or a page is mapped.
        BackendOutOfMemory
            If ``cuMemCreate`` runs out of device memory (nothing stays mapped or allocated).
        CUDAError
            On any other driver error (nothing stays mapped or allocated).
        """
        drv = self.driver
        granularity = self.vm_granularity(index)
        with self._lock:
            reservation, pages = self._pages(index, address, nbytes)
            if any(page in reservation.handles for page in pages):
                raise ValueError(f"cuda:{index}: a page of [{address:#x}, +{nbytes}) is mapped")
            prop = self._allocation_prop(index)
            created: list[CUmemGenericAllocationHandle] = []
            mapped: list[int] = []
            try:
                for _ in pages:
                    created.append(
                        self._call_allocating("cuMemCreate", index, nbytes, granularity, prop, 0)
                    )
                for page, handle in zip(pages, created, strict=True):
                    self._call("cuMemMap", index, drv.CUdeviceptr(page), granularity, 0, handle, 0)
                    mapped.append(page)
                access = drv.CUmemAccessDesc()
                access.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
                access.location.id = self._devices()[index]
                access.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                self._call("cuMemSetAccess", index, drv.CUdeviceptr(address), nbytes, [access], 1)
            except BaseException:
                for page in mapped:  # undo, ignoring secondary failures
                    drv.cuMemUnmap(drv.CUdeviceptr(page), granularity)
                for handle in created:
                    drv.cuMemRelease(handle)
                raise
            reservation.handles.update(zip(pages, created, strict=True))

    def vm_unmap(self, index: int, address: int, nbytes: int) -> None:
        """Return the memory behind ``[address, address + nbytes)``; the range stays reserved.

        Waits for the device (``cuCtxSynchronize``: queued work may still use the pages, as
        PyTorch synchronises the segment's stream), then ``cuMemUnmap`` and ``cuMemRelease``
        each page.

        Raises
        ------
        ValueError
            If the range is not whole pages inside one reserved range, or a page is not mapped.
        CUDAError
            If the driver fails.
        """
        drv = self.driver
        granularity = self.vm_granularity(index)
        with self._lock:
            reservation, pages = self._pages(index, address, nbytes)
            if not all(page in reservation.handles for page in pages):
                raise ValueError(f"cuda:{index}: a page of [{address:#x}, +{nbytes}) is not mapped")
        self._call("cuCtxSynchronize", index)  # outside the lock: other threads copy meanwhile
        with self._lock:
            for page in pages:
                handle = reservation.handles.pop(page)
                self._call("cuMemUnmap", index, drv.CUdeviceptr(page), granularity)
                self._call("cuMemRelease", index, handle)

    def host_view(self, index: int, ptr: int, nbytes: int) -> memoryview | None:
        """None: device memory is not host-accessible (``Buffer.numpy()`` copies instead)."""
        return None
