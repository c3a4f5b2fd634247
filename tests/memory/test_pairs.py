"""What the compiled hit path repeats of memory/_policy.py (docs/design.md, "Pairs") agrees.

The compiled file declares its own C copies of the policy's constants (``cdef`` values that
Python cannot read): these tests read them from the source next to the built module and hold
them to the Python values, so that a change on one side only fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from accelrt.memory import _config, _policy
from accelrt.memory.device import _core

PYX = Path(_core.__file__).with_name("_native.pyx")
#: the compiled name -> the Python value it repeats
REPEATED = {
    "K_MIN_BLOCK_SIZE": _policy.K_MIN_BLOCK_SIZE,
    "K_SMALL_SIZE": _policy.K_SMALL_SIZE,
    "K_SMALL_BUFFER": _policy.K_SMALL_BUFFER,
    "K_MAX_REQUEST_BYTES": _policy.MAX_REQUEST_BYTES,
    "UNLIMITED": _policy.UNLIMITED,
    "NUM_ROUNDUP_SLOTS": _config.NUM_ROUNDUP_SLOTS,
}


def _compiled_value(text: str, name: str) -> int:
    found = re.search(rf"^\s*(?:cdef \w+ )?{name} = ([0-9 <]+?)\s*(?:#.*)?$", text, re.MULTILINE)
    assert found is not None, f"{name} is not declared in {PYX.name}"
    value = 0
    for i, part in enumerate(found.group(1).split("<<")):
        value = int(part) if i == 0 else value << int(part)
    return value


@pytest.mark.skipif(not PYX.exists(), reason="the compiled core's source is not installed")
@pytest.mark.parametrize("name", sorted(REPEATED))
def test_the_compiled_core_repeats_the_policys_constants(name: str) -> None:
    assert _compiled_value(PYX.read_text(), name) == REPEATED[name]
