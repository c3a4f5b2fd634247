"""Record a real allocation trace from a PyTorch program with ``torch.profiler``."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING

from ._format import Trace, write
from ._load import load

if TYPE_CHECKING:
    from torch._C._profiler import _ProfilerEvent

__all__ = ["record_torch"]


def record_torch(
    fn: Callable[[], object],
    path: str | os.PathLike[str],
    *,
    name: str = "torch_trace",
    workload: dict[str, object] | None = None,
) -> Trace:
    """Run ``fn`` under ``torch.profiler`` and save its allocator calls as an accelrt trace.

    Parameters
    ----------
    fn : callable
        The PyTorch code to record (called once, with no arguments).
    path : str or path-like
        Where to write the gzip'd JSONL trace.
    name : str
        The trace's name in its header.
    workload : dict, optional
        A description of the workload for the header.

    Returns
    -------
    Trace
        The trace as read back from ``path``.

    Raises
    ------
    ImportError
        If PyTorch is not installed (``pip install 'accelrt[torch]'``).

    Notes
    -----
    Uses the profiler's memory events (``profile_memory=True``): each allocation and free of
    PyTorch's allocators with its address, size and the operator that made it, on the device
    the program uses (the CPU allocator in a CPU build). A free of memory allocated before
    recording began becomes a ``synthetic`` allocation at the start, so the trace is
    consistent. ``stream`` is 0.
    """
    try:
        import torch
        from torch._C._profiler import _EventType, _ExtraFields_Allocation
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError(
            "record_torch needs PyTorch: pip install 'accelrt[torch]' (torch==2.13.0)",
            name="torch",
        ) from exc

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    raw: list[tuple[int, int, int, int, str | None]] = []

    def walk(nodes: list[_ProfilerEvent]) -> None:
        for node in nodes:
            fields = node.extra_fields
            if node.tag == _EventType.Allocation and isinstance(fields, _ExtraFields_Allocation):
                op = node.parent.name if node.parent is not None else None
                raw.append(
                    (node.start_time_ns, len(raw), int(fields.ptr), int(fields.alloc_size), op)
                )
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    raw.sort()
    start = raw[0][0] if raw else 0
    live: dict[int, int] = {}
    synthetic: list[dict[str, object]] = []
    rows: list[dict[str, object]] = []
    for t, _, ptr, size, op in raw:
        if size > 0:
            live[ptr] = size
            rows.append(
                {
                    "action": "alloc",
                    "addr": ptr,
                    "size": size,
                    "stream": 0,
                    "t": t - start,
                    "op": op,
                }
            )
        elif size < 0:
            nbytes = live.pop(ptr, None)
            if nbytes is None:
                nbytes = -size
                synthetic.append(
                    {
                        "action": "alloc",
                        "addr": ptr,
                        "size": nbytes,
                        "stream": 0,
                        "t": 0,
                        "op": None,
                        "synthetic": 1,
                    }
                )
            rows.append(
                {
                    "action": "free",
                    "addr": ptr,
                    "size": nbytes,
                    "stream": 0,
                    "t": t - start,
                    "op": op,
                }
            )
    header: dict[str, object] = {
        "name": name,
        "workload": workload or {},
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "capture": {
            "method": "accelrt.trace.record_torch: torch.profiler(profile_memory=True) "
            "allocation events",
            "t_unit": "ns since the first event",
            "size_unit": "bytes as requested from the allocator",
        },
    }
    write(path, [*synthetic, *rows], header)
    return load(path)
