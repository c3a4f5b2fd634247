"""Memory by kind and by phase, and folded stacks of live bytes.

Users ask which *kind* of memory is live at the peak: parameters, gradients, optimizer state,
activations or temporary workspace, in each phase of a step. A recording does not say it, so
each allocation's category is inferred from what the recording carries, in this order (the
first that decides wins):

1. The user's rules, ``NAME=REGEX`` (``--category``): the first rule whose regular expression
   is found in the allocation's op name or in one of its stack frames names its category.
2. Where it was allocated (its *site*): the phase whose event range holds its alloc event
   (the ``phases`` table of an accelrt trace header: ``step0/fwd``, ``step0/bwd``...), else its
   op (``autograd::engine::evaluate_function: ...`` is backward, ``Optimizer.step#...`` and
   ``Optimizer.zero_grad#...`` the optimizer) or its Python frames (``torch/optim/``,
   ``backward`` or ``torch/autograd/``, ``forward``, ``__init__``/``load_state_dict``).
3. How long it lives: an allocation freed in the phase that allocated it is ``temporary``
   wherever it came from; one that outlives its phase is, by site, ``parameters`` (setup),
   ``activations`` (forward: saved for backward), ``gradients`` (backward) or ``optimizer
   state``. Without phases, an allocation counts as outliving its site when it is never freed
   or freed at another site.

Allocations that nothing decides are ``unknown``; so are blocks that were live before a
recording began and stay live to its end, since nothing recorded says what made them. The
same idea as PyTorch's profiler memory timeline (which also reads the autograd graph) and
HTA's memory breakdown; the rules here use only what a snapshot or trace holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .._errors import InputError

if TYPE_CHECKING:
    from ._model import View

__all__ = [
    "BUILT_IN",
    "Categories",
    "CategoryRule",
    "Phase",
    "categorize",
    "category_bytes",
    "folded_stacks",
    "phases_of",
]

#: The inferred categories, in the order tables show them.
BUILT_IN = ("parameters", "gradients", "optimizer state", "activations", "temporary", "unknown")

_SETUP, _FORWARD, _BACKWARD, _OPTIMIZER, _OTHER = range(5)
_LONG_LIVED = {
    _SETUP: "parameters",
    _FORWARD: "activations",
    _BACKWARD: "gradients",
    _OPTIMIZER: "optimizer state",
}
_PHASE_WORDS = (
    (_BACKWARD, re.compile(r"bwd|backward|grad", re.I)),
    (_FORWARD, re.compile(r"fwd|forward", re.I)),
    (_OPTIMIZER, re.compile(r"opt|step|update", re.I)),
    (_SETUP, re.compile(r"init|setup|load|build|model", re.I)),
)
_OP_SITES = (
    (_BACKWARD, re.compile(r"^autograd::|Backward\d*$|_backward")),
    (_OPTIMIZER, re.compile(r"^Optimizer\.")),
)
_FRAME_SITES = (
    (_OPTIMIZER, re.compile(r"torch/optim/|\boptimizer\b.*\bstep\b|\bstep\s", re.I)),
    (_BACKWARD, re.compile(r"torch/autograd/|\bbackward\b")),
    (_FORWARD, re.compile(r"\bforward\b|_call_impl\b")),
    (_SETUP, re.compile(r"\b(__init__|load_state_dict|reset_parameters|_apply)\b")),
)


@dataclass(frozen=True)
class CategoryRule:
    """A user's category: allocations whose op or a stack frame matches ``pattern``.

    Attributes
    ----------
    name : str
        The category's name as tables show it.
    pattern : re.Pattern of str
        Searched (``re.search``) in the op name and in each frame line
        (``"function  file:line"``).
    """

    name: str
    pattern: re.Pattern[str]

    @classmethod
    def parse(cls, text: str) -> CategoryRule:
        """Read ``"NAME=REGEX"`` (the ``--category`` option).

        Raises
        ------
        InputError
            If there is no ``=``, the name is empty or the regular expression does not
            compile; the message names the value and shows the expected form.
        """
        name, sep, pattern = text.partition("=")
        name = name.strip()
        if not sep or not name or not pattern:
            raise InputError(
                f"category rule {text!r} is not NAME=REGEX; write e.g. "
                "--category 'kv cache=past_key_values|kv_cache'"
            )
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise InputError(
                f"category rule {text!r}: {pattern!r} is not a regular expression ({exc})"
            ) from None
        return cls(name, compiled)


@dataclass(frozen=True)
class Phase:
    """A named stretch of a recording: events ``first`` up to, not including, ``end``."""

    name: str
    first: int
    end: int


@dataclass(frozen=True)
class Categories:
    """Each allocation's category.

    Attributes
    ----------
    names : tuple of str
        The categories: the user's rules' names first (in rule order), then :data:`BUILT_IN`
        (a user name equal to a built-in one is that category).
    of : numpy.ndarray of int64
        Per allocation of the view: an index into ``names``.
    """

    names: tuple[str, ...]
    of: np.ndarray


def phases_of(header: object, events: int) -> list[Phase]:
    """The phases of an accelrt trace header (``"phases": [{"phase", "first", "end"}]``),
    clipped to ``events``; entries that are not well formed are left out, so a damaged header
    gives fewer phases rather than an error."""
    if not isinstance(header, dict) or not isinstance(header.get("phases"), list):
        return []
    out = []
    for entry in header["phases"]:
        if not isinstance(entry, dict):
            continue
        name, first, end = entry.get("phase"), entry.get("first"), entry.get("end")
        if not isinstance(name, str) or type(first) is not int or type(end) is not int:
            continue
        first, end = max(0, first), min(events, end)
        if first < end:
            out.append(Phase(name, first, end))
    return sorted(out, key=lambda p: p.first)


def _phase_kind(name: str) -> int:
    last = name.rsplit("/", 1)[-1]
    for kind, words in _PHASE_WORDS:
        if words.search(last):
            return kind
    return _OTHER


def _site_from(op: str | None, frames: Sequence[str]) -> int:
    if op:
        for kind, pattern in _OP_SITES:
            if pattern.search(op):
                return kind
    for kind, pattern in _FRAME_SITES:
        if any(pattern.search(frame) for frame in frames):
            return kind
    return _OTHER


def categorize(
    view: View, phases: Sequence[Phase] = (), rules: Sequence[CategoryRule] = ()
) -> Categories:
    """Infer each allocation's category (see the module notes for the rules and their order).

    Parameters
    ----------
    view : View
        The allocations (their alloc and free states, ops and stacks).
    phases : sequence of Phase
        Event ranges of the recording (:func:`phases_of`). Where there are none, runs of
        consecutive allocations with the same site (from ops and frames) stand in for them.
    rules : sequence of CategoryRule
        The user's rules, tried first, in order.

    Returns
    -------
    Categories
    """
    names = tuple(dict.fromkeys([r.name for r in rules] + list(BUILT_IN)))
    index = {name: n for n, name in enumerate(names)}
    frames = [_frames(view, int(s)) for s in view.stack.tolist()]
    ops = [view.ops[o] if o >= 0 else None for o in view.op.tolist()]
    if phases:
        phase_at = np.full(view.events, -1, dtype=np.int64)
        for n, phase in enumerate(phases):
            phase_at[phase.first : phase.end] = n
        kinds = [_phase_kind(p.name) for p in phases]
    else:
        phase_at, kinds = _site_runs(view, ops, frames)
    known = bool(kinds)  # some phase or site is known: lifetimes can be read against it
    never_freed = view.events + 1
    of = np.empty(len(view.size), dtype=np.int64)
    for n, (start, end) in enumerate(zip(view.start.tolist(), view.end.tolist(), strict=True)):
        name = _by_rule(rules, ops[n], frames[n])
        if name is None:
            if start == 0 or not known:  # nothing says what made it
                name = "unknown"
            else:
                alloc_phase = int(phase_at[start - 1])
                site = kinds[alloc_phase] if alloc_phase >= 0 else _OTHER
                if end != never_freed and int(phase_at[end - 1]) == alloc_phase:
                    name = "temporary"
                else:
                    name = _LONG_LIVED.get(site, "unknown")
        of[n] = index[name]
    return Categories(names, of)


def _frames(view: View, stack_id: int) -> tuple[str, ...]:
    if stack_id < 0:
        return ()
    stack = view.stacks[stack_id]
    return (*stack.python, *stack.native)


def _by_rule(rules: Sequence[CategoryRule], op: str | None, frames: tuple[str, ...]) -> str | None:
    for rule in rules:
        if (op is not None and rule.pattern.search(op)) or any(
            rule.pattern.search(f) for f in frames
        ):
            return rule.name
    return None


def _site_runs(
    view: View, ops: list[str | None], frames: list[tuple[str, ...]]
) -> tuple[np.ndarray, list[int]]:
    """Phases from the allocations themselves: per event, the index of the run of events
    since the last change of allocation site (an allocation whose site is undecided, and
    every other event, continues the run), and each run's site."""
    from ._model import EVENT_ALLOC

    phase_at = np.full(view.events, -1, dtype=np.int64)
    kinds: list[int] = []
    site_of: dict[tuple[str | None, tuple[str, ...]], int] = {}
    run = -1
    for event, (kind, alloc) in enumerate(
        zip(view.event_kind.tolist(), view.event_alloc.tolist(), strict=True)
    ):
        if kind == EVENT_ALLOC and alloc >= 0:
            key = (ops[alloc], frames[alloc])
            site = site_of.get(key)
            if site is None:
                site = site_of[key] = _site_from(*key)
            if site != _OTHER and (run < 0 or kinds[run] != site):
                kinds.append(site)
                run += 1
        phase_at[event] = run
    return phase_at, kinds


def category_bytes(view: View, categories: Categories, state: int) -> dict[str, tuple[int, int]]:
    """Live requested bytes and allocation counts per category at ``state``.

    Parameters
    ----------
    view : View
    categories : Categories
        From :func:`categorize` on the same view.
    state : int
        A state in ``[0, view.events]``.

    Returns
    -------
    dict of str to (int, int)
        Every category name (in ``categories.names`` order) to its (bytes, count); zero
        where nothing of it is live.

    Raises
    ------
    ValueError
        If ``state`` is out of range.
    """
    if not 0 <= state <= view.events:
        raise ValueError(f"state {state} is out of range [0, {view.events}]")
    live = view.live_at(state)
    which = categories.of[live]
    nbytes = np.bincount(which, weights=view.size[live], minlength=len(categories.names))
    counts = np.bincount(which, minlength=len(categories.names))
    return {name: (int(nbytes[n]), int(counts[n])) for n, name in enumerate(categories.names)}


def folded_stacks(view: View, state: int) -> str:
    """The live bytes at ``state`` as folded stacks, the text flame-graph tools read
    (Brendan Gregg's ``flamegraph.pl``, speedscope, inferno): one line per distinct stack,
    ``root;...;innermost BYTES``, largest first.

    Frames are the Python frames, outermost first (the kept C++ frames where a stack has no
    Python frame); an allocation without a stack is ``(no stack)``, under its op where it has
    one. Semicolons and line
    breaks inside frame text are replaced by ``,`` and a space, since they separate frames
    and lines.

    Raises
    ------
    ValueError
        If ``state`` is out of range.
    """
    if not 0 <= state <= view.events:
        raise ValueError(f"state {state} is out of range [0, {view.events}]")
    live = view.live_at(state)
    sums: dict[str, int] = {}
    for stack_id, op_id, nbytes in zip(
        view.stack[live].tolist(), view.op[live].tolist(), view.size[live].tolist(), strict=True
    ):
        if stack_id >= 0:
            stack = view.stacks[stack_id]
            frames = list(reversed(stack.python or stack.native)) or ["(no stack)"]
        else:
            frames = ["(no stack)"]
            if op_id >= 0:
                frames.append(view.ops[op_id])
        key = ";".join(_folded_frame(f) for f in frames)
        sums[key] = sums.get(key, 0) + nbytes
    lines = sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))
    return "".join(f"{key} {nbytes}\n" for key, nbytes in lines)


def _folded_frame(frame: str) -> str:
    return frame.replace(";", ",").replace("\n", " ").replace("\r", " ").strip() or "?"
