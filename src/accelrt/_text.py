"""Text from input files made safe to show on a terminal: :func:`printable`.

Trace names, stack frames and file names come from files a user may not have written. Shown
raw, an escape sequence among them would drive the terminal (``ESC ] 0 ; ... BEL`` sets the
window title, ``ESC [ 2 J`` clears the screen), and a bidirectional override would make the
line read differently from what it holds ("Trojan Source", CVE-2021-42574). Every text output
of the ``accelrt`` command passes such strings through :func:`printable` first; JSON output
needs nothing (``json.dumps`` escapes control characters and, with ``ensure_ascii``, the rest),
and the HTML page escapes as HTML.
"""

from __future__ import annotations

import re

__all__ = ["error_line", "one_line", "printable", "shown"]

_OTHERS = r"\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
"""DEL (U+007F), C1 (U+0080-U+009F), the bidirectional embeddings and overrides
(U+202A-U+202E) and isolates (U+2066-U+2069), and lone surrogates (U+D800-U+DFFF: JSON and
pickles can hold them, but no terminal or UTF-8 file can take them)."""
_UNSAFE = re.compile(rf"[\x00-\x1f{_OTHERS}]")
"""C0 (U+0000-U+001F) and the others."""
_UNSAFE_BUT_NEWLINE = re.compile(rf"[\x00-\x09\x0b-\x1f{_OTHERS}]")
"""The same but for the newline (U+000A)."""


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_newlines: bool = False) -> str:
    r"""Return ``text`` with the characters that act on a terminal shown as escapes.

    Parameters
    ----------
    text : str
        A string from an input file (a trace name, a frame, a file name), or a whole text
        built from such strings (``keep_newlines``).
    keep_newlines : bool
        Keep ``"\n"`` as it is: for a text of several lines whose line breaks are the
        program's own (a table). Default False: a newline inside a single field is escaped.

    Returns
    -------
    str
        ``text`` with every C0 control character (tab and newline included), DEL and C1
        control character written as ``\xNN`` and every bidirectional embedding, override or
        isolate (U+202A-U+202E, U+2066-U+2069) and lone surrogate (U+D800-U+DFFF) as
        ``\uNNNN``, the way ``git`` and ``ls``
        show them: ``"a\x1b[2Jb"`` becomes ``a\x1b[2Jb`` (a backslash, ``x1b``, then
        ``[2Jb``). Everything else is kept, backslashes included, so the escaped text is for
        reading, not for decoding back. ``text`` itself when nothing needs escaping (one
        regular-expression search, linear in its length).
    """
    pattern = _UNSAFE_BUT_NEWLINE if keep_newlines else _UNSAFE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def shown(value: object) -> str:
    """``repr(value)``, cut to 60 characters for messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


def error_line(exc: BaseException) -> str:
    """An exception's message on one line, or its type's name where the message is empty."""
    return one_line(str(exc)) or type(exc).__name__
