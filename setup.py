"""Builds accelrt's compiled modules with Cython: the allocator's hit path
(src/accelrt/memory/device/_native.pyx), the public fast path over it (Buffer:
src/accelrt/memory/buffers/_native.pyx; empty and copy_: src/accelrt/memory/calls/_native.pyx)
and the streams' per-call methods
(src/accelrt/_stream_ops.py, plain Python compiled as it is in Cython's pure-Python mode, typed
by _stream_ops.pxd).

Everything else about the package is in pyproject.toml. The extensions are optional: when one
cannot be built (no C/C++ compiler), installation goes on and accelrt runs its Python twin,
with the same behaviour (docs/design.md, "Two cores").
"""

from __future__ import annotations

import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns instead of failing when the compiled core cannot be built."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler: the pure-Python core runs
            print(f"accelrt: compiled core not built ({exc}); using Python", file=sys.stderr)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"accelrt: {ext.name} not built ({exc}); using Python", file=sys.stderr)


extensions = [
    Extension(
        "accelrt.memory.device._native",
        ["src/accelrt/memory/device/_native.pyx"],
        language="c++",
        extra_compile_args=["-O3", "-std=c++17"],
    ),
    Extension(
        "accelrt.memory.buffers._native",
        ["src/accelrt/memory/buffers/_native.pyx"],
        extra_compile_args=["-O3"],
    ),
    Extension(
        "accelrt.memory.calls._native",
        ["src/accelrt/memory/calls/_native.pyx"],
        extra_compile_args=["-O3"],
    ),
    Extension(
        "accelrt._stream_ops",
        ["src/accelrt/_stream_ops.py"],
        extra_compile_args=["-O3"],
    ),
]

setup(
    ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}),
    cmdclass={"build_ext": OptionalBuildExt},
)
