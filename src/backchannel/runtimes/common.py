"""What every runtime's hooks share: the normalized hook event, the answer a receiver
decides on, payload field helpers and message formatting (transcripts: :mod:`.transcripts`).

A runtime module (:mod:`.claude_code`, :mod:`.codex`, :mod:`.gemini`) only translates:
``parse(payload) -> HookEvent`` and ``render(event, outcome) -> dict`` (its own hook
output JSON). What an event does to the hub lives in :mod:`.receiver`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from backchannel.core import framing
from backchannel.errors import Forbidden, HookInputError
from backchannel.runtimes.liveness import RUNTIME_FIELD
from backchannel.runtimes.seen import HAD_FIELD, KEEP
from backchannel.types import Member

__all__ = [
    "PROBLEM_HEADER",
    "HookEvent",
    "HookInputError",
    "HookKind",
    "Outcome",
    "Runtime",
    "check_expected",
    "compact",
    "format_messages",
    "had_ids",
    "opt_bool",
    "opt_str",
    "req_str",
    "runtime_of",
]

#: Response header of ``POST /v1/hooks/{runtime}`` that says why a call had no effect.
PROBLEM_HEADER = "Backchannel-Hook-Problem"
#: Longest text recorded for one tool call or tool result (the rest is cut, marked).
TOOL_TEXT_LIMIT = 8_000


class HookKind(StrEnum):
    SESSION_START = "session_start"
    PROMPT = "prompt"  # the user's input opens a turn
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    STOP = "stop"  # the turn's closing text
    SUBAGENT_STOP = "subagent_stop"
    SESSION_END = "session_end"


@dataclass(frozen=True, slots=True)
class HookEvent:
    """One runtime hook call, normalized."""

    runtime: str
    name: str  # the runtime's own event name: "Stop", "AfterAgent", "agent-turn-complete"...
    kind: HookKind
    session_id: str
    text: str = ""  # the prompt, the closing text, or a tool call / result summary
    tool: str | None = None
    tool_id: str | None = None
    stop_hook_active: bool = False
    answerable: bool = True  # False when the runtime ignores the answer (Codex notify)
    detail: str = ""  # SessionStart source, SessionEnd reason
    transcript_path: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: messages the session shows it already has (Claude Code channel pushes), by id
    seen: tuple[str, ...] = ()
    #: the command hook's record of the ids hook answers showed this session
    #: (:mod:`.seen`); ``None`` when the call keeps no record (an HTTP hook)
    had: tuple[str, ...] | None = None
    #: what names the turn's end a stop reports, where the runtime gives it (Codex's
    #: ``turn_id``, its ``notify``'s ``turn-id``, the ``timestamp`` of Gemini's
    #: ``AfterAgent`` call, the uuid of Claude Code's last assistant message, which the
    #: command hook reads from its transcript): the same stop reported again carries
    #: the same id, another turn's stop another one. ``None`` where there is none (a
    #: Claude Code ``Stop`` posted by a plain HTTP hook).
    stop_id: str | None = None
    #: the runtime's id of the prompt the turn ran on (Claude Code's ``prompt_id``, the
    #: same for every event until the next prompt, absent before a process's first):
    #: two stops of different prompts are two turns. ``None`` where there is none.
    prompt_id: str | None = None
    #: the runtime process the command hook ran under
    #: (:func:`~backchannel.runtimes.liveness.runtime_key`), where it says
    runtime_key: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the receiver decided to put in front of the agent (nothing by default)."""

    context: str | None = None  # additional context for this turn (prompt / session start)
    continue_with: str | None = None  # stop-type hooks: keep going with this input


@dataclass(frozen=True, slots=True)
class Runtime:
    """A runtime's translation of hook payloads and answers."""

    name: str
    parse: Callable[[Any], HookEvent]
    render: Callable[[HookEvent, Outcome], dict[str, Any]]
    events: tuple[str, ...]  # the hook events ``attach`` registers


def check_expected(member: Member, expect: str | None) -> None:
    """Refuse a token of another member than ``TEAM/MEMBER`` (``attach`` writes it)."""
    if expect and expect != f"{member.team}/{member.name}":
        raise Forbidden(
            f"the token belongs to {member.team}/{member.name}, but this agent is attached "
            f"as {expect}; export that member's token as BACKCHANNEL_TOKEN"
        )


# -- payload fields -------------------------------------------------------------------


def _obj(payload: Any) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise HookInputError(f"hook payload must be a JSON object, not {type(payload).__name__}")
    return payload


def req_str(payload: Mapping[str, Any], *keys: str) -> str:
    """The first of ``keys`` present as a non-empty string."""
    for key in keys:
        value = payload.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if value is not None and not isinstance(value, str):
            raise HookInputError(f"field {key!r} must be a string, not {type(value).__name__}")
    raise HookInputError(f"missing field {keys[0]!r} (an older runtime version?)")


def opt_str(payload: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = payload.get(key)
        if isinstance(value, str):
            return value
    return None


def opt_bool(payload: Mapping[str, Any], key: str) -> bool:
    value = payload.get(key)
    return value is True or (isinstance(value, str) and value.lower() == "true")


def had_ids(payload: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The command hook's record of what the session was shown (:mod:`.seen`), if sent."""
    listed = payload.get(HAD_FIELD)
    if not isinstance(listed, list):
        return None
    return tuple(i for i in listed if isinstance(i, str))[-KEEP:]


def runtime_of(payload: Mapping[str, Any]) -> str | None:
    """The runtime process the command hook says it ran under, if it says
    (:mod:`.liveness`)."""
    key = payload.get(RUNTIME_FIELD)
    return key if isinstance(key, str) and 0 < len(key) <= 200 else None


def event_name(payload: Any, *keys: str) -> tuple[Mapping[str, Any], str]:
    obj = _obj(payload)
    return obj, req_str(obj, *keys)


def compact(value: Any, limit: int = TOOL_TEXT_LIMIT) -> str:
    """``value`` as short text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
        except (TypeError, ValueError):
            text = repr(value)
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit]}… [{cut} more characters cut]"
    return text


def tool_call_text(tool: str, tool_input: Any) -> str:
    return f"{tool} {compact(tool_input)}" if tool_input not in (None, {}, "") else tool


# -- what the agent reads ----------------------------------------------------------------


def format_message(sender: str, kind: str, text: str) -> str:
    """One message as the agent reads it: a header line the hub writes (``[From name]``,
    ``[backchannel]`` for the hub's notices, ``[timer]``...), then the text, escaped so
    that none of its lines reads as another header (:mod:`backchannel.core.framing`)."""
    return framing.frame(framing.header(sender, kind), text)


def format_messages(items: Iterable[tuple[str, str, str]], *, heading: str) -> str:
    """``(sender, kind, text)`` triples as one block of input, under ``heading`` (which
    must not begin with ``[``), separated by blank lines."""
    body = "\n\n".join(format_message(s, k, t) for s, k, t in items)
    return f"{heading}\n\n{body}"
