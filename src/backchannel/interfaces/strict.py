"""The JSON every interface accepts off the wire, whatever carries it.

Strict JSON: no lone UTF-16 surrogates, no ``NaN`` or ``Infinity``, no invalid UTF-8,
nested at most :data:`MAX_DEPTH` deep, floats finite (integers are bounded where a model
takes them). The HTTP API (:mod:`.wire`) refuses a body that breaks a rule with 422, and
the MCP server on stdio answers such a line with a JSON-RPC error (:mod:`.mcp`), so
nothing the hub stores can later fail to encode or to load. This module imports only
pydantic-core, so the MCP server loads it without the web framework.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

import pydantic_core

__all__ = [
    "MAX_DEPTH",
    "REFUSED",
    "json_problem",
    "parse_error",
    "parse_json",
    "parse_runtime_json",
]

#: Deepest nesting of arrays and objects in a request body.
MAX_DEPTH = 64
#: Marks a parse error that is a refusal of valid JSON (too deep, too large a number).
REFUSED = "refused: "


def parse_json(raw: bytes) -> Any:
    """``raw`` as a JSON value, or :class:`json.JSONDecodeError` naming the problem
    (which FastAPI and :func:`~backchannel.interfaces.http.create_app` answer with 422)."""
    try:
        value = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        # jiter's own error names the line and column; keep it
        raise json.JSONDecodeError(parse_error(raw, str(exc)), _text(raw), 0) from None
    problem = json_problem(value)
    if problem is not None:
        raise json.JSONDecodeError(REFUSED + problem, _text(raw), 0)
    return value


def parse_error(raw: bytes, why: str) -> str:
    """The parser's error ``why`` for ``raw``, in the words of these rules: a lone
    surrogate, which the parser reports in the words of its escape reader ("unexpected end
    of hex escape"), and ``NaN`` or ``Infinity`` (which Python's ``json.dumps`` writes by
    default, and the parser reports as "expected value"), are named, with the way out; any
    other error is the parser's own."""
    non_finite = _non_finite(raw, why)
    if non_finite is not None:
        return non_finite
    lone = _lone_surrogate(raw) if "hex escape" in why else None
    if lone is None:
        return why
    where = why[why.rfind(" at line ") :] if " at line " in why else ""
    return (
        f"a lone UTF-16 surrogate {lone}{where} (half of a pair, as a text cut inside an "
        "emoji leaves it); send the pair whole, the character itself as UTF-8, or U+FFFD "
        "in place of the lost half"
    )


_WHERE = re.compile(r" at line (\d+) column (\d+)$")
_NON_FINITE = re.compile(rb"-?(?:NaN|Infinity)")


def _non_finite(raw: bytes, why: str) -> str | None:
    """``NaN``, ``Infinity`` or ``-Infinity`` where the parser stopped (its line and
    column count bytes), named with its place and the way out; None for anything else."""
    where = _WHERE.search(why)
    if where is None:
        return None
    line, column = int(where[1]), int(where[2])
    start = 0
    for _ in range(line - 1):
        start = raw.find(b"\n", start) + 1
        if start == 0:
            return None
    pos = start + column - 1
    if pos > start and raw[pos - 1 : pos] == b"-":
        pos -= 1  # the parser stops after a minus sign, at the word it cannot read
    literal = _NON_FINITE.match(raw, pos)
    if literal is None:
        return None
    return (
        f"{literal[0].decode()} at line {line} column {pos - start + 1} is not a JSON number "
        "(JSON has no NaN or Infinity); send a finite number, a string or null"
    )


def json_problem(value: Any) -> str | None:
    """Why a parsed JSON value is refused (nested too deep, a float too large to be
    finite), or None. Iterative, so no input can exhaust the stack."""
    # the parser makes exact dicts, lists and floats: ``type(...) is`` is enough, and
    # only containers are stacked (most values of a body are strings)
    if type(value) is float:
        return None if math.isfinite(value) else _TOO_LARGE
    if type(value) is not dict and type(value) is not list:
        return None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"JSON nested deeper than {MAX_DEPTH} levels; flatten the data"
        children: Iterable[Any] = item.values() if type(item) is dict else item
        for child in children:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif kind is float and not math.isfinite(child):
                return _TOO_LARGE
    return None


_TOO_LARGE = "a number is too large for a float; send a smaller one or a string"


def _text(raw: bytes) -> str:
    return raw[:200].decode("utf-8", "replace")


#: A ``\\uD800``-``\\uDFFF`` escape in JSON text: half of a UTF-16 surrogate pair.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE = re.compile("[\ud800-\udfff]")


#: An escaped backslash, a surrogate pair, or a lone surrogate escape, in the order met.
_ESCAPES = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}(?:\\u[dD][c-fC-F][0-9a-fA-F]{2})?"
    rb"|\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _lone_surrogate(raw: bytes) -> str | None:
    """The first ``\\uD800``-``\\uDFFF`` escape in ``raw`` that is not half of a pair
    (as written, e.g. ``\\ud83d``), or None."""
    for m in _ESCAPES.finditer(raw):
        if len(m.group()) == 6:
            return m.group().decode("ascii")
    return None


def parse_runtime_json(raw: bytes) -> Any:
    """A runtime's own JSON (a hook call), as :func:`parse_json` reads it, except that
    a lone surrogate escape reads as U+FFFD instead of refusing the whole call. A
    runtime's JavaScript that cuts a text inside an emoji pair writes the lone half that
    way (``JSON.stringify`` does); refusing the call would lose what it carries (a
    ``Stop`` hook's closing text: the turn would never end). Every other rule holds."""
    try:
        return parse_json(raw)
    except ValueError as exc:
        if _SURROGATE_ESCAPE.search(raw) is None:
            raise
        problem = exc
    try:
        loose = json.loads(raw)  # Python's reader keeps lone surrogates
        text = json.dumps(loose, ensure_ascii=False, allow_nan=True)
    except (ValueError, RecursionError):
        raise problem from None
    return parse_json(_LONE.sub("\ufffd", text).encode("utf-8"))
