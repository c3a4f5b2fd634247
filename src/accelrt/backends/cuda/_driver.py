"""The CUDA driver layer: loading ``cuda-bindings``, the result codes this backend tells apart,
:class:`CUDAError`, and the calls that check every result (``_DriverCalls``)."""

from __future__ import annotations

from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any, Protocol

from ..._errors import AcceleratorError, MessageAndFields
from ..._text import error_line
from .._base import BackendOutOfMemory

INSTALL_HINT = "pip install 'accelrt[cuda]'"

# CUresult codes this module tells apart (cuda.h).
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_NOT_READY = 600


class DriverLayer(Protocol):
    """``cuda.bindings.driver`` or an object with the same functions and types (a fake in
    tests): the backend reaches every driver function and type by name."""

    def __getattr__(self, name: str) -> Any: ...


def _load_driver() -> DriverLayer:
    from cuda.bindings import driver

    layer: DriverLayer = driver
    return layer


@dataclass(eq=False, repr=False)
class CUDAError(MessageAndFields, AcceleratorError):
    """A CUDA driver call failed.

    Parameters
    ----------
    message : str
        The full explanation: the call, the device, the driver's error name and description.
    function : str
        The driver function that failed, e.g. ``"cuMemcpyHtoDAsync"``.
    result : int
        The ``CUresult`` code, e.g. 700.
    error_name : str
        The driver's name of the code, e.g. ``"CUDA_ERROR_ILLEGAL_ADDRESS"``.

    Notes
    -----
    Mirrors ``torch.AcceleratorError`` raised for ``cudaError_t`` failures; pickles.
    """

    message: InitVar[str]
    _: KW_ONLY
    function: str
    result: int
    error_name: str


class _DriverCalls:
    """The driver layer (given, or ``cuda.bindings.driver`` loaded on first use) and its calls:
    every result but ``CUDA_SUCCESS`` becomes a :class:`CUDAError` naming the call and device,
    or ``BackendOutOfMemory`` where memory ran out."""

    _driver: DriverLayer | None

    @property
    def driver(self) -> DriverLayer:
        """The driver layer (``cuda.bindings.driver`` unless another was given).

        Raises
        ------
        ImportError
            If ``cuda-bindings`` is not installed (the message says how to install it).
        """
        if self._driver is None:
            try:
                self._driver = _load_driver()
            except ImportError as exc:
                raise ImportError(
                    f"the CUDA backend needs cuda-bindings: {INSTALL_HINT} ({error_line(exc)})",
                    name="cuda",
                ) from exc
        return self._driver

    def _error_name(self, code: int) -> tuple[str, str]:
        """The driver's name and description of ``code`` (fallbacks when it has none)."""
        drv = self.driver
        name = description = ""
        try:
            result = drv.cuGetErrorName(drv.CUresult(code))
            if int(result[0]) == CUDA_SUCCESS and result[1]:
                name = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
            result = drv.cuGetErrorString(drv.CUresult(code))
            if int(result[0]) == CUDA_SUCCESS and result[1]:
                raw = result[1]
                description = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:  # an unknown code, a driver that cannot be loaded
            pass
        return name or f"CUresult {code}", description

    def _error(self, function: str, code: int, index: int | None) -> CUDAError:
        name, description = self._error_name(code)
        where = f" on cuda:{index}" if index is not None else ""
        detail = f" ({description})" if description else ""
        return CUDAError(
            f"CUDA {function} failed{where}: {name}{detail}",
            function=function,
            result=code,
            error_name=name,
        )

    def _call(self, function: str, index: int | None, *args: object) -> Any:
        """Call driver ``function``; return its outputs (None, one value or a tuple: driver
        handles and numbers, untyped as ``cuda-bindings`` is).

        Raises ``CUDAError`` for any result but ``CUDA_SUCCESS``.
        """
        result = getattr(self.driver, function)(*args)
        code = int(result[0])
        if code != CUDA_SUCCESS:
            raise self._error(function, code, index)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else tuple(result[1:])

    def _call_allocating(self, function: str, index: int, nbytes: int, *args: object) -> Any:
        """Call driver ``function``, which obtains ``nbytes`` (memory, address space); return
        its output (an address or a handle, untyped as ``cuda-bindings`` is).

        Raises ``BackendOutOfMemory`` for ``CUDA_ERROR_OUT_OF_MEMORY`` (the allocator frees
        cached blocks and retries), ``CUDAError`` for any other result but ``CUDA_SUCCESS``.
        """
        result = getattr(self.driver, function)(*args)
        code = int(result[0])
        if code != CUDA_SUCCESS:
            self._oom_or_raise(function, index, code, nbytes)
        return result[1]

    def _oom_or_raise(self, function: str, index: int, code: int, nbytes: int) -> None:
        """Raise ``BackendOutOfMemory`` for an out-of-memory result, else ``CUDAError``."""
        if code == CUDA_ERROR_OUT_OF_MEMORY:
            raise BackendOutOfMemory(
                f"cuda:{index}: {function} of {nbytes} bytes failed: CUDA_ERROR_OUT_OF_MEMORY"
            )
        raise self._error(function, code, index)
