"""Every PyTorch name docs/conformance.md covers is in accelrt, or the document says why not.

The lists are PyTorch 2.14.1's (``torch.accelerator.__all__``, ``torch.accelerator.memory.__all__``
and the methods of ``torch.Stream``, ``torch.Event``, ``torch.cuda.MemPool`` and
``torch.accelerator.Graph``), plus what issue 25 reports for 2.15; PyTorch is not imported.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import accelrt as acc

CONFORMANCE = (Path(__file__).resolve().parents[2] / "docs" / "conformance.md").read_text()

TORCH_ACCELERATOR = (
    "Graph", "current_accelerator", "current_device_idx", "current_device_index",
    "get_device_capability", "current_stream", "device_count", "device_index", "empty_cache",
    "empty_host_cache", "get_memory_info", "is_available", "max_memory_allocated",
    "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats", "set_device_idx",
    "set_device_index", "set_stream", "synchronize",
    "is_graph_available",  # 2.15, as issue 25 reports it
)  # fmt: skip
TORCH_ACCELERATOR_MEMORY = (
    "empty_cache", "empty_host_cache", "get_memory_info", "max_memory_allocated",
    "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
    "reset_accumulated_memory_stats", "reset_peak_memory_stats",
)  # fmt: skip
METHODS = {
    acc.Stream: (
        "stream_id", "device_index", "device_type", "device", "native_handle", "query",
        "synchronize", "is_capturing", "wait_event", "wait_stream", "record_event",
    ),
    acc.Event: (
        "device", "event_id", "record", "wait", "query", "elapsed_time", "synchronize",
        "ipc_handle", "from_ipc_handle",
    ),
    acc.memory.MemPool: ("id", "allocator", "use_count", "snapshot"),
    acc.Graph: (
        "capture_begin", "capture_end", "instantiate", "replay", "reset", "pool",
        "enable_debug_mode", "debug_dump", "__enter__", "__exit__",
    ),
}  # fmt: skip
NOT_PROVIDED = {  # name: how docs/conformance.md names it where it says why
    "current_device_idx": "`current_device_idx`, `set_device_idx` | not provided",
    "set_device_idx": "`current_device_idx`, `set_device_idx` | not provided",
    "ipc_handle": "`ipc_handle()`, `Event.from_ipc_handle()` | not yet",
    "from_ipc_handle": "`ipc_handle()`, `Event.from_ipc_handle()` | not yet",
}


@pytest.mark.parametrize(
    ("module", "names"),
    [(acc, TORCH_ACCELERATOR), (acc.memory, TORCH_ACCELERATOR_MEMORY)],
    ids=["torch.accelerator", "torch.accelerator.memory"],
)
def test_every_torch_accelerator_name_is_present_or_explained(
    module: object, names: tuple[str, ...]
) -> None:
    for name in names:
        if name in NOT_PROVIDED:
            assert not hasattr(module, name) and NOT_PROVIDED[name] in CONFORMANCE, name
        else:
            assert hasattr(module, name), name
            assert f"`{name}`" in CONFORMANCE, f"docs/conformance.md does not list {name}"


@pytest.mark.parametrize("cls", list(METHODS), ids=lambda cls: cls.__name__)
def test_every_listed_method_is_present_or_explained(cls: type) -> None:
    for name in METHODS[cls]:
        if name in NOT_PROVIDED:
            assert not hasattr(cls, name) and NOT_PROVIDED[name] in CONFORMANCE, name
        else:
            assert hasattr(cls, name), f"{cls.__name__}.{name}"


def test_the_mem_pool_and_history_arguments_are_pytorchs() -> None:
    pool = inspect.signature(acc.memory.MemPool)
    assert list(pool.parameters) == ["allocator", "use_on_oom", "no_split"]
    history = inspect.signature(acc.record_memory_history).parameters
    for name in (
        "enabled", "context", "stacks", "max_entries", "device", "clear_history",
        "compile_context", "global_record_annotations", "skip_actions",
    ):  # fmt: skip
        assert name in history, name
    assert list(inspect.signature(acc.memory_snapshot).parameters) == [
        "mempool_id", "include_traces",
    ]  # fmt: skip
