"""Memory by kind and by phase, and folded stacks of live bytes.

Users ask which *kind* of memory is live at the peak: parameters, gradients, optimizer state,
activations or temporary workspace, in each phase of a step. A recording does not say it, so
each allocation's category is inferred from what the recording carries, in this order (the
first that decides wins):

1. The user's rules, ``NAME=REGEX`` (``--category``): the first rule whose regular expression
   is found in the allocation's op name or in one of its stack frames names its category.
2. Where it was allocated (its *site*): the phase whose event range holds its alloc event
   (``Trace.phases``, from the ``phases`` table of an accelrt trace header: ``step0/fwd``,
   ``step0/bwd``...), else its
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
from ..trace._phases import Phase
from ._model import Categories

if TYPE_CHECKING:
    from ._model import View

__all__ = [
    "BUILT_IN",
    "add_categories",
    "CategoryRule",
    "categorize",
    "category_bytes",
    "folded_stacks",
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
        Event ranges of the recording (``Trace.phases``). Where there are none, runs of
        consecutive allocations with the same site (from ops and frames) stand in for them.
    rules : sequence of CategoryRule
        The user's rules, tried first, in order.

    Returns
    -------
    Categories

    Notes
    -----
    Rules and sites are decided once per distinct (op, stack) pair and lifetimes with numpy,
    so the cost grows with the distinct pairs, not with the allocations.
    """
    names = tuple(dict.fromkeys([r.name for r in rules] + list(BUILT_IN)))
    index = {name: n for n, name in enumerate(names)}
    n_alloc = len(view.size)
    pair = view.op.astype(np.int64) * (len(view.stacks) + 1) + (view.stack + 1)
    pairs, which = np.unique(pair, return_inverse=True)
    by_rule = np.full(len(pairs), -1, dtype=np.int64)
    site = np.full(len(pairs), _OTHER, dtype=np.int64)
    for n, key in enumerate(pairs.tolist()):
        op_id, stack_id = divmod(key, len(view.stacks) + 1)
        op = view.ops[op_id] if op_id >= 0 else None
        frames = _frames(view, stack_id - 1)
        name = _by_rule(rules, op, frames)
        by_rule[n] = -1 if name is None else index[name]
        if not phases:  # sites stand in for phases only where a trace has none
            site[n] = _site_from(op, frames)
    if phases:
        phase_at = np.full(view.events, -1, dtype=np.int64)
        for n, phase in enumerate(phases):
            phase_at[max(0, phase.first) : phase.end] = n
        kinds = np.array([_phase_kind(p.name) for p in phases] + [_OTHER], dtype=np.int64)
    else:
        phase_at, kinds = _site_runs(view, site[which])
    of = np.full(n_alloc, index["unknown"], dtype=np.int64)
    if len(kinds) > 1:  # some phase or site is known: lifetimes can be read against it
        made = view.start > 0  # blocks live before the recording began stay unknown
        alloc_phase = np.full(n_alloc, -1, dtype=np.int64)
        alloc_phase[made] = phase_at[view.start[made] - 1]
        freed = made & (view.end <= view.events)
        free_phase = np.full(n_alloc, -2, dtype=np.int64)
        free_phase[freed] = phase_at[view.end[freed] - 1]
        long_lived = np.array(
            [index[_LONG_LIVED.get(k, "unknown")] for k in range(_OTHER + 1)], dtype=np.int64
        )
        of[made] = long_lived[kinds[alloc_phase[made]]]  # -1 (no phase): kinds[-1], other
        of[freed & (free_phase == alloc_phase)] = index["temporary"]
    ruled = by_rule[which]
    of[ruled >= 0] = ruled[ruled >= 0]
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


def _site_runs(view: View, site_of_alloc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Phases from the allocations themselves: per event, the index of the run of events
    since the last change of allocation site (an allocation whose site is undecided, and
    every other event, continues the run; -1 before the first decided site), and each run's
    site, with ``_OTHER`` last (for -1)."""
    from ._model import EVENT_ALLOC

    events = view.events
    site = np.full(events, _OTHER, dtype=np.int64)
    allocs = (view.event_kind == EVENT_ALLOC) & (view.event_alloc >= 0)
    site[allocs] = site_of_alloc[view.event_alloc[allocs]]
    decided = np.flatnonzero(site != _OTHER)
    if not len(decided):
        return np.full(events, -1, dtype=np.int64), np.array([_OTHER], dtype=np.int64)
    change = decided[np.r_[True, site[decided][1:] != site[decided][:-1]]]
    runs = np.searchsorted(change, np.arange(events), side="right") - 1
    kinds = np.r_[site[change], _OTHER].astype(np.int64)
    return runs.astype(np.int64), kinds


def add_categories(view: View, rules: Sequence[CategoryRule] = ()) -> Categories:
    """Infer the categories of a view's allocations (:func:`categorize`, with the view's
    phases) and keep them on it (``view.categories``), where the page,
    ``snapshot summary`` and ``snapshot diff`` show them.

    Returns
    -------
    Categories
        What was kept.
    """
    view.categories = categorize(view, view.phases, rules)
    return view.categories


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
    live = _live_at(view, state)
    which = categories.of[live]
    nbytes = np.bincount(which, weights=view.size[live], minlength=len(categories.names))
    counts = np.bincount(which, minlength=len(categories.names))
    return {name: (int(nbytes[n]), int(counts[n])) for n, name in enumerate(categories.names)}


def _live_at(view: View, state: int) -> np.ndarray:
    if not 0 <= state <= view.events:
        raise ValueError(f"state {state} is out of range [0, {view.events}]")
    return view.live_at(state)


def folded_stacks(view: View, state: int) -> str:
    """The live bytes at ``state`` as folded stacks, the text flame-graph tools read
    (Brendan Gregg's ``flamegraph.pl``, speedscope, inferno): one line per distinct stack,
    ``root;...;innermost BYTES``, largest first.

    Frames are the Python frames, outermost first (the kept C++ frames where a stack has no
    Python frame); an allocation without a stack is ``(no stack)``, under its op where it has
    one. Semicolons and line breaks inside frame text are replaced by ``,`` and a space, since
    they separate frames and lines.

    Raises
    ------
    ValueError
        If ``state`` is out of range.
    """
    live = _live_at(view, state)
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
