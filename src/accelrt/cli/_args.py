"""What the commands share about their arguments: the option types (argparse turns their
``ArgumentTypeError`` into ``argument --x: message``), the settings to replay under
(``--config``, else the environment, else a recording's or the defaults), the checks of input
and output files, and the options and help texts several commands take."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import InputError
from .._text import printable, shown
from .._units import parse_bytes

if TYPE_CHECKING:
    from ..memory._config import Setting
    from ..view._categories import CategoryRule


class SubParsers(Protocol):
    """What a command's ``_add_*_parser`` uses of ``parser.add_subparsers()`` (an
    ``argparse._SubParsersAction`` of the ``accelrt`` parser's class)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


MAX_DEVICE_INDEX = 1023
"""The largest device index the command accepts (``--device TYPE:N``, ``--device-index``).

The simulated backend creates every device up to the one asked for, so an unbounded index
would make ``--device sim:99999999`` build a hundred million devices."""


_DEVICE_RE = re.compile(r"([a-z_][a-z0-9_]*)(?::([0-9]+))?", re.ASCII)


_INDEX_RE = re.compile(r"[0-9]+", re.ASCII)


def _device_arg(text: str) -> str:
    value = text.strip()
    if not value:
        raise argparse.ArgumentTypeError(
            "the device is empty; give 'sim', 'sim:N' or a backend's device such as 'opencl:0'"
        )
    match = _DEVICE_RE.fullmatch(value)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"invalid device {shown(text)}: expected TYPE or TYPE:INDEX in ASCII, such as "
            "'sim', 'sim:1' or 'opencl:0'"
        )
    index = match.group(2)
    if index is not None and (len(index) > 6 or int(index) > MAX_DEVICE_INDEX):
        raise argparse.ArgumentTypeError(
            f"device index {shown(index)} of {match.group(1)!r} is too large: indices run from "
            f"0 to at most {MAX_DEVICE_INDEX} (e.g. '{match.group(1)}:0')"
        )
    return value


def _index_arg(text: str) -> int:
    value = text.strip()
    if value.startswith("-") and _INDEX_RE.fullmatch(value[1:]):
        raise argparse.ArgumentTypeError(f"the device index must be >= 0, got {shown(text)}")
    if not _INDEX_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"the device index must be a whole number in ASCII digits, such as 0, got {shown(text)}"
        )
    if len(value) > 6 or int(value) > MAX_DEVICE_INDEX:
        raise argparse.ArgumentTypeError(
            f"the device index {shown(text)} is too large: at most {MAX_DEVICE_INDEX}"
        )
    return int(value)


def _capacity_arg(text: str) -> int:
    try:
        return parse_bytes(text, name="sim capacity")
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parsed_setting(text: str, source: str) -> Setting:
    """A setting string (accelrt's syntax, ``defaults``, or a real PYTORCH_CUDA_ALLOC_CONF string
    verbatim: keys the allocator's policy does not depend on are set aside) read once."""
    from ..memory._config import AllocatorConfig, Setting

    config, ignored = AllocatorConfig.parse_torch(text)
    return Setting(config, source, tuple(ignored))


def _category_arg(text: str) -> CategoryRule:
    """A ``--category NAME=REGEX``: the user's kind of memory (view/_categories.py)."""
    from ..view._categories import CategoryRule

    try:
        return CategoryRule.parse(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_category_option(parser: argparse.ArgumentParser) -> None:
    """``--category NAME=REGEX``, repeatable, on the commands that show kinds of memory."""
    parser.add_argument(
        "--category",
        action="append",
        default=[],
        type=_category_arg,
        metavar="NAME=REGEX",
        help="a kind of memory of your own: allocations whose op or a stack frame matches "
        "REGEX (tried before the inferred kinds, in order; repeatable)",
    )


def _config_arg(text: str) -> Setting:
    """A ``--config``, the same in every command; see :func:`_parsed_setting`."""
    try:
        return _parsed_setting(text, "--config")
    except InputError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (in {shown(text)})") from None


def _env_setting() -> Setting | None:
    """The setting of the first of ``ENV_VARS`` set and not empty (ACCELRT_ALLOC_CONF, then
    PyTorch's PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF, in PyTorch's order), else None.

    Raises
    ------
    InputError
        For a variable set to a bad setting; the message names the variable.
    """
    from ..memory._config import ENV_VARS

    for var in ENV_VARS:
        text = os.environ.get(var, "")
        if text.strip():
            try:
                return _parsed_setting(text, f"environment {var}")
            except InputError as exc:
                raise InputError(f"{var}: {exc} (in {shown(text)}); fix or unset it") from None
    return None


def _settings(given: Sequence[Setting] | None, *, recording: bool) -> list[Setting]:
    """The settings to replay under: ``--config`` (each one given), else the environment
    (:func:`_env_setting`), else a recording's own settings (``recording``) or the defaults."""
    from ..memory._config import RECORDED, AllocatorConfig, Setting

    if given:
        return list(given)
    default = Setting(None, RECORDED) if recording else Setting(AllocatorConfig(), "defaults")
    return [_env_setting() or default]


def _note_ignored(settings: Sequence[Setting]) -> None:
    """Say on stderr, once per setting, which PyTorch keys it set aside (not modelled)."""
    for setting in dict.fromkeys(settings):
        if setting.ignored:
            keys = printable(", ".join(setting.ignored))  # from the environment, as given
            print(
                f"accelrt: ignored in {setting.source}: {keys} (the device allocator's policy "
                "does not depend on them)",
                file=sys.stderr,
            )


def _output_arg(option: str) -> Callable[[str], str]:
    """A type for an option naming a file to write: refuse what cannot be written, up front."""

    def check(path: str) -> str:
        if not path.strip():
            raise argparse.ArgumentTypeError(f"{option} needs a file name, got {shown(path)}")
        if os.path.isdir(path):
            raise argparse.ArgumentTypeError(
                f"{path} is a directory; give a file name, e.g. {os.path.join(path, 'memory')}"
            )
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise argparse.ArgumentTypeError(
                f"cannot write {path}: the folder {folder} does not exist; create it first"
            )
        if not os.access(folder, os.W_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)
        ):
            raise argparse.ArgumentTypeError(
                f"cannot write {path}: permission denied; choose a writable location"
            )
        return path

    return check


def _input_file(path: str, what: str) -> None:
    """Refuse a path that is not a readable regular file, naming it and what was expected."""
    if not path.strip():
        raise InputError(f"no file given (an empty name); give {what}")
    if os.path.isdir(path):
        raise InputError(f"{path} is a directory; give {what}")
    if not os.path.exists(path):
        raise InputError(f"{path}: No such file or directory; give {what}")
    if not os.path.isfile(path):
        raise InputError(f"{path} is not a regular file (a pipe or a device); save it to a file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied; make it readable")


def _not_the_input(output: str | None, source: str) -> None:
    if output and os.path.exists(output) and os.path.samefile(output, source):
        raise InputError(f"{output} is the input file; writing it would destroy it")


def _check_png(path: str | None) -> None:
    """Refuse ``--png`` up front when matplotlib is missing or cannot write that format."""
    if not path:
        return
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise InputError(f"--png {path} needs matplotlib: pip install 'accelrt[view]'")
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise InputError(
                f"--png {path}: cannot write a {suffix!r} file; use a name ending in .png "
                f"(or one of {', '.join(sorted(formats))})"
            )


def _grid_arg(text: str) -> tuple[str, list[str]]:
    from .._sweep import parse_grid

    try:
        return parse_grid(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _workers_arg(text: str) -> int:
    value = text.strip()
    if not _INDEX_RE.fullmatch(value) or len(value) > 6 or int(value) < 1:
        raise argparse.ArgumentTypeError(
            f"the number of workers must be a whole number >= 1, got {shown(text)}"
        )
    return int(value)


_DEVICE_INDEX_HELP = (
    "snapshots: only the recorded device N, of device_traces[N] (default: every recorded device)"
)
"""The help of ``--device-index``, the same in ``replay``, ``sweep`` and every ``snapshot``
command."""


def _add_start_option(parser: argparse.ArgumentParser) -> None:
    """``--start``: how a recording that began mid-run starts under another setting."""
    from .._start_state import STARTS

    parser.add_argument(
        "--start",
        choices=STARTS,
        default="modelled",
        help="for a recording that began mid-run, replayed with another setting than the "
        "recorded one: rebuild its start state under that setting (modelled, the default) or "
        "keep the recorded segments and blocks (recorded); docs/snapshot-replay.md",
    )


def _show_progress(args: argparse.Namespace) -> bool:
    """Whether a command shows progress bars: on a terminal (stderr), unless told not to."""
    return not getattr(args, "json", False) and not args.no_progress and sys.stderr.isatty()
