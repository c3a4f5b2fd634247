"""Make ``streams_midrun.pickle``: a small recording the differential tests replay on a fresh clone.

The shared real traces live outside the repository, so without them the compiled core and the
Python reference would be compared only on generated sequences. This recording covers what the
real ones do, in 20 KiB: three streams with ``record_stream`` across them (frees that complete
after they were requested, one requested before the recording began and one still pending at
its end), requests from a few bytes to 90 MiB, an ``empty_cache`` inside the recorded window,
and history switched on mid-run under the defaults (so every other setting replays a modelled
start). It is made on ``sim`` through the public API with a fixed seed:

    python tests/data/make_streams_midrun.py tests/data/streams_midrun.pickle
"""

from __future__ import annotations

import random
import sys

import accelrt as acc

MiB = 1 << 20
STEPS = 6
RECORD_FROM = 2
SIZES = (200, 4096, 300_000, MiB + 1, 3 * MiB, 12 * MiB + 512, 30 * MiB, 90 * MiB)


def main(path: str) -> None:
    """Run the training-like loop on ``sim``, history from step ``RECORD_FROM``; dump it."""
    rng = random.Random(21)
    acc.backends.use("sim")
    side = [acc.Stream(), acc.Stream()]
    weights = [acc.empty(rng.choice(SIZES) + rng.randint(0, 999)) for _ in range(10)]
    for step in range(STEPS):
        if step == RECORD_FROM:
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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "streams_midrun.pickle")
