"""The README's Python examples run and print what their comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def examples() -> list[str]:
    """The README's Python code blocks, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def run_example(code: str) -> list[str]:
    """Run a README code block; return what the comments of its prints say they print."""
    exec(compile(code, str(README), "exec"), {})
    return re.findall(r"print\(.*# (.*)$", code, re.M)  # what each print's comment says


def test_readme_example_runs(opencl: str, capsys: pytest.CaptureFixture[str]) -> None:
    run_example(examples()[0])
    lines = capsys.readouterr().out.split()
    assert lines == ["opencl", "4194304"]


def test_readme_memory_history_pools_and_host_memory(
    opencl: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # it writes run.pickle
    said = run_example(examples()[1])
    assert capsys.readouterr().out.splitlines() == said
    assert (tmp_path / "run.pickle").stat().st_size > 0
