"""Warnings located at the user's line: :func:`warn_user`."""

from __future__ import annotations

import sys
import warnings
from types import FrameType

__all__ = ["warn_user"]

_PACKAGE = __name__.rpartition(".")[0]


def warn_user(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)``, located at the nearest caller outside accelrt.

    One warning is often reached by several paths (the compiled core or the Python one, a
    constructor or a setter, a free or a malloc that catches up on events), so no fixed
    ``stacklevel`` names the user's line on all of them: this counts accelrt's Python frames
    instead. Compiled frames are not Python frames, for this count as for ``warnings``. Where
    every frame is accelrt's (a thread it started), the warning names the outermost one.
    """
    frame: FrameType | None = sys._getframe(1)
    level = 2  # 1 would name this function's own line
    while frame is not None and frame.f_back is not None and _inside(frame):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def _inside(frame: FrameType) -> bool:
    """Whether ``frame`` runs accelrt's code."""
    name = str(frame.f_globals.get("__name__", ""))
    return name == _PACKAGE or name.startswith(_PACKAGE + ".")
