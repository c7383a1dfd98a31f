"""Text from messages made safe to print on an operator's terminal.

Anything a member wrote (a message's text, summary, a timer's note, a name in an error)
may hold terminal control sequences: ``ESC ] 0 ; title BEL`` retitles the window,
``ESC [ 2 J`` clears the screen, a bidi override reorders what follows. The CLI prints
such text only through :func:`printable` (plain ``print``) or :func:`markup_safe` (rich
consoles, which would also read ``[red]`` in a text as markup).

Every C0 control (but newline and tab where the text may span lines), DEL, every C1
control and the Unicode bidi controls are shown escaped, as ``\\x1b`` or ``\\u202e``:
visible, and inert. An escape sequence loses its ESC and so prints as plain characters.
"""

from __future__ import annotations

import re

from rich.markup import escape

__all__ = ["markup_safe", "printable"]

_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROLS_ONE_LINE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI}]")
_CONTROLS_MULTILINE = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI}]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object, *, multiline: bool = False) -> str:
    """``value`` as text with every control character shown escaped. With ``multiline``
    newlines and tabs stay as they are (a message's text); without, they are escaped
    too (a name, a summary, one field of a one-line record). ``\\r`` is always escaped:
    it would let a line overwrite what was printed before it."""
    text = value if isinstance(value, str) else str(value)
    pattern = _CONTROLS_MULTILINE if multiline else _CONTROLS_ONE_LINE
    return pattern.sub(_escaped, text)


def markup_safe(value: object, *, multiline: bool = False) -> str:
    """:func:`printable`, and rich markup escaped, for ``Console.print``."""
    return escape(printable(value, multiline=multiline))
