"""Make the two-device, mid-run memory snapshot shipped in examples/traces/.

A data-parallel job on two devices runs the same training steps on each; its memory history is
switched on part-way through, after the model and the first step, as people usually do
(``torch.cuda.memory._record_memory_history()`` at step N), and dumped at the end. This script
plays the allocations of the example trace (examples/traces/transformer_train.jsonl.gz, a real
PyTorch training run) through accelrt's caching allocator on two simulated devices with the
default settings, switches history on a third of the way in, and writes the snapshot in
PyTorch's format:

    python examples/record_midrun_snapshot.py examples/traces/two_device_midrun.pickle

``accelrt replay`` then reports every device, the start state it had to model for settings
other than the recorded one, the lower bounds and (with ``--capacity``) an OOM verdict.
"""

from __future__ import annotations

import sys
from pathlib import Path

import accelrt as acc
from accelrt.trace import load

TRACE = Path(__file__).resolve().parent / "traces" / "transformer_train.jsonl.gz"
DEVICES = 2
START_FRACTION = 1 / 3


def main(path: str) -> None:
    """Play the example trace on every simulated device, history from a third in; dump it."""
    events = load(TRACE).events
    acc.backends.use("sim")
    start = int(len(events) * START_FRACTION)
    live: list[dict[int, acc.Buffer]] = [{} for _ in range(DEVICES)]
    for i, (action, addr, size, _stream) in enumerate(events):
        for device in range(DEVICES):
            if i == start:
                acc.record_memory_history(context=None, device=device)
            with acc.device_index(device):
                if action == "alloc" and size:
                    live[device][addr] = acc.empty(size)
                elif action == "free" and addr in live[device]:
                    live[device].pop(addr).free()
    acc.dump_snapshot(path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "two_device_midrun.pickle")
