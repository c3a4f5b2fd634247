"""The ``accelrt`` command: ``info``, ``replay``, ``snapshot summary|segments|view|diff``,
``sweep``.

Exit statuses (:func:`main`): 0 done; 1 ``sweep`` with a trace that failed (its rows say why),
or the reader of the output went away (a broken pipe); 2 an error in the input (a missing or
malformed file, a bad option or setting: an :class:`~accelrt._errors.InputError`, an
``OSError``, or a device that failed, ``AcceleratorError``): one line on stderr; 70
(``EX_SOFTWARE`` of sysexits.h) a bug in accelrt: the traceback and a line asking for a report;
130 an interrupt (Ctrl-C): one line. ``ACCELRT_DEBUG=1`` adds the traceback to an input error.

Text from input files (trace names, stack frames, file names) is shown through
:func:`accelrt._text.printable` (control characters and bidirectional overrides escaped) and
printed without rich's markup or highlighting.

The setting a command replays under is ``--config`` (the same syntax everywhere, ``defaults``
included), else the environment (``ACCELRT_ALLOC_CONF``, else PyTorch's ``PYTORCH_ALLOC_CONF``,
else ``PYTORCH_CUDA_ALLOC_CONF``: the first set), else a snapshot's recorded settings or, for a
JSONL trace, the defaults; every output says which (``Setting.source``). A snapshot is read for
every recorded device with allocation history (a section each and a total), unless
``--device-index`` names one.

The package holds one module per command (``_info``, ``_replay`` with its tables in
``_replay_tables``, ``_snapshot``, ``_sweep``), the argument types and checks they share
(``_args``), what the replay and snapshot commands share (``_runs``: reading snapshots, replays
with a progress bar; ``_output``: the console, pictures and files written) and ``_main``: the
parser and the one error-handling wrapper, :func:`main`. Building the parser imports nothing
heavy: each command imports what it needs when it runs.
"""

from __future__ import annotations

from ._args import MAX_DEVICE_INDEX as MAX_DEVICE_INDEX
from ._main import EXIT_BUG as EXIT_BUG
from ._main import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from ._main import EXIT_USAGE as EXIT_USAGE
from ._main import build_parser as build_parser
from ._main import main as main

__all__ = ["main"]
