"""The README's Python example runs and prints what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(opencl: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = README.read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    exec(compile(code.group(1), str(README), "exec"), {})
    lines = capsys.readouterr().out.split()
    assert lines == ["opencl", "4194304"]
