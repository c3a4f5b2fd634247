"""Make the small recordings the differential and replay tests use on a fresh clone.

The shared real traces live outside the repository, so without them the compiled core and the
Python reference would be compared only on generated sequences. These recordings cover what the
real ones do, in about 20 KiB each: three streams with ``record_stream`` across them (frees that
complete after they were requested, one requested before the recording began and one still
pending at its end), requests from a few bytes to 90 MiB, an ``empty_cache`` inside the
recorded window, and history switched on mid-run (so every other setting replays a modelled
start). ``streams_midrun.pickle`` is recorded under the defaults; ``streams_expandable.pickle``
under expandable segments, where the ``empty_cache`` releases whole address ranges that other
(stream, pool) pairs reserve again. Both are made on ``sim`` through the public API with a fixed
seed:

    python tests/data/make_streams_midrun.py tests/data
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import accelrt as acc

MiB = 1 << 20
STEPS = 6
RECORD_FROM = 2
SIZES = (200, 4096, 300_000, MiB + 1, 3 * MiB, 12 * MiB + 512, 30 * MiB, 90 * MiB)
RECORDINGS = {"streams_midrun.pickle": "", "streams_expandable.pickle": "expandable_segments:True"}


def record(path: Path, settings: str) -> list[Any]:
    """Run the training-like loop on a fresh ``sim`` under ``settings``, history from step
    ``RECORD_FROM``; dump it to ``path``. Returns the segments (``memory_snapshot()``'s)
    when history began: the start state a replay must rewind to."""
    rng = random.Random(21)
    acc.backends.use("sim")
    acc.set_allocator_settings(settings)
    side = [acc.Stream(), acc.Stream()]
    weights = [acc.empty(rng.choice(SIZES) + rng.randint(0, 999)) for _ in range(10)]
    for step in range(STEPS):
        if step == RECORD_FROM:
            start = acc.memory_snapshot()["segments"]
            acc.record_memory_history(context=None)
        if step == STEPS - 2:
            acc.empty_cache()
        acts = []
        for _ in range(30):
            stream = rng.choice([None, *side])
            buf = acc.empty(rng.choice(SIZES) + rng.randint(0, 4095), stream=stream)
            if rng.random() < 0.3:
                acc.record_stream(buf, rng.choice(side))
            acts.append(buf)
        if step == RECORD_FROM - 1:  # its free is requested now and completes once recording
            acc.record_stream(acts[0], side[0])
        while acts:
            acts.pop(rng.randrange(len(acts))).free()
    pending = acc.empty(3 * MiB)  # freed after the last malloc: pending in the snapshot
    acc.record_stream(pending, side[1])
    pending.free()
    assert weights  # live to the end
    acc.dump_snapshot(path)
    return start


if __name__ == "__main__":
    import subprocess

    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for name, settings in RECORDINGS.items():  # a fresh process each: a fresh device
        code = "import sys; sys.path.insert(0, sys.argv[1]); import make_streams_midrun as m; "
        code += "m.record(m.Path(sys.argv[2]), sys.argv[3])"
        here = str(Path(__file__).parent)
        subprocess.run([sys.executable, "-c", code, here, str(folder / name), settings], check=True)
