"""The ``accelrt`` command's entry: the argument parser (each command adds its own) and
:func:`main`, the one place that turns exceptions into exit statuses and one-line errors."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from .._errors import AcceleratorError, InputError
from .._gc import collector_paused
from .._text import one_line, printable
from ._info import _add_info_parser
from ._replay import _add_replay_parser
from ._snapshot import _add_snapshot_parser
from ._sweep import _add_sweep_parser

EXIT_USAGE = 2
"""The exit status of an error in the input (and of argparse's usage errors)."""
EXIT_BUG = 70
"""The exit status of a bug in accelrt: ``EX_SOFTWARE`` ("internal software error") of BSD's
sysexits.h, distinct from the input errors' 2 and ``sweep``'s 1."""
EXIT_INTERRUPTED = 130
"""The exit status after Ctrl-C: 128 + SIGINT, as shells report it."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``prog: error: ...``), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT_USAGE, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n"
        )


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``accelrt`` command."""
    parser = _Parser(
        prog="accelrt",
        description="accelrt: a device-agnostic accelerator runtime with a caching allocator.",
        epilog="Exit status: 0 done; 1 a sweep's trace failed; 2 an error in the input (one line "
        f"on stderr; ACCELRT_DEBUG=1 adds the traceback); {EXIT_BUG} a bug in accelrt (the "
        f"traceback: please report it); {EXIT_INTERRUPTED} interrupted.",
    )
    from .._version import __version__

    parser.add_argument("--version", action="version", version=f"accelrt {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{info,replay,snapshot,sweep}"
    )
    _add_info_parser(sub)
    _add_replay_parser(sub)
    _add_snapshot_parser(sub)
    _add_sweep_parser(sub)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    sub = getattr(args, "snapshot_command", None)
    return f"{args.command} {sub}" if sub else str(args.command)


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so that exiting does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return


def _print_traceback(exc: BaseException) -> None:
    """Print the traceback of ``exc`` on stderr, its input-derived text escaped (printable)."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    sys.stderr.write(printable(text, keep_newlines=True))


def _input_error_text(exc: Exception) -> str:
    """The one line an input error prints after ``error:`` (an ``OSError`` as ``FILE: why``)."""
    message = str(exc)
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        message = f"{exc.filename}: {exc.strerror}"
    return printable(one_line(message))


def _is_input_problem(exc: Exception) -> bool:
    """Whether ``exc`` is about the user's input or environment (one ``error:`` line, status
    2) rather than a bug in accelrt: an :class:`~accelrt._errors.InputError`, an ``OSError``
    (a file, a connection), an ``AcceleratorError`` (a device failed or ran out of memory),
    or an ``ImportError`` of a package that is not installed (not one of accelrt's modules).
    """
    if isinstance(exc, (InputError, OSError, AcceleratorError)):
        return True
    return isinstance(exc, ImportError) and (exc.name or "accelrt").partition(".")[0] != "accelrt"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``accelrt`` command; return its exit status.

    An error in the input, raised on purpose where it is found (an
    :class:`~accelrt._errors.InputError`: a malformed trace or snapshot, a bad option or
    setting; an ``OSError``: a file that cannot be read or written, a scheduler that cannot be
    reached; an ``AcceleratorError``: a device that failed, ``OutOfMemoryError`` included),
    prints one line to stderr, ``accelrt CMD: error: MESSAGE``, and returns 2 (with
    ``ACCELRT_DEBUG=1`` set, its traceback first). Every other exception is a bug in accelrt:
    its traceback, then a line asking for a report with the version, and 70 (``EX_SOFTWARE``).
    Ctrl-C (``KeyboardInterrupt``) prints one line and returns 130. Everything printed is
    escaped by :func:`accelrt._text.printable` (keeping the traceback's line breaks).
    """
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help (0), or a usage error already printed (2)
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        command = _command_name(args)
        try:
            # a snapshot (these commands read them) decodes to a container per entry, none in
            # a cycle: each collection of the cyclic collector would walk them all (accelrt._gc)
            heavy = args.command in ("snapshot", "replay")
            paused = collector_paused() if heavy else contextlib.nullcontext()
            with paused:
                result: int = args.func(args)
        except BrokenPipeError:  # the reader of our output went away (e.g. `| head`)
            _quiet_stdout()
            return 1
        except Exception as exc:
            if _is_input_problem(exc):
                if os.environ.get("ACCELRT_DEBUG"):
                    _print_traceback(exc)
                print(f"accelrt {command}: error: {_input_error_text(exc)}", file=sys.stderr)
                return EXIT_USAGE
            # a bug, or input that no check foresaw (a bug in the check)
            from .._version import __version__

            _print_traceback(exc)
            print(
                f"accelrt {command}: internal error: this is a bug in accelrt {__version__}, not "
                "a problem with your input; please report it with the command you ran and the "
                "traceback above",
                file=sys.stderr,
            )
            return EXIT_BUG
        return result
    except KeyboardInterrupt:
        print("accelrt: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
