"""How a sweep's messages show values and errors: short and on one line."""

from __future__ import annotations

from typing import Any


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())
