"""Codex: its hooks (Claude-shaped payloads and answers) and the older ``notify`` program.

Hooks (``.codex/hooks.json``): ``SessionStart``, ``UserPromptSubmit``, ``PreToolUse``,
``PostToolUse`` and ``Stop`` carry ``session_id``, ``turn_id``, ``transcript_path``,
``cwd``, ``model`` and ``hook_event_name``; ``Stop`` adds ``stop_hook_active`` and
``last_assistant_message`` (its ``turn_id`` tells the same ``Stop`` reported twice from
another turn's that ends with the same words), and answers ``{"decision": "block", "reason": ...}`` to make
Codex continue with ``reason`` as its next input. ``SessionEnd`` (with ``reason``) says
the process is leaving the session: the hub session waits for a resume (exited).

``notify`` (``notify = ["backchannel", "hook", "codex"]`` in ``config.toml``): Codex runs
the program with one JSON argument, ``{"type": "agent-turn-complete", "thread-id",
"turn-id", "cwd", "input-messages", "last-assistant-message"}``, and ignores its output.
It reports the finished turn (opened first when needed, with the input messages as its
input); waiting messages cannot ride back on it and stay queued for the next hook or
``check_inbox``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.runtimes.claude_code import parse_event, render_event
from backchannel.runtimes.common import (
    HookEvent,
    HookInputError,
    HookKind,
    Runtime,
    opt_str,
    req_str,
)

NAME = "codex"
EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop", "SessionEnd")
_KINDS = {
    "SessionStart": HookKind.SESSION_START,
    "UserPromptSubmit": HookKind.PROMPT,
    "PreToolUse": HookKind.TOOL_CALL,
    "PostToolUse": HookKind.TOOL_RESULT,
    "Stop": HookKind.STOP,
    "SessionEnd": HookKind.SESSION_END,
}
NOTIFY_TYPE = "agent-turn-complete"


def _notify(obj: Mapping[str, Any]) -> HookEvent:
    kind = obj.get("type")
    if kind != NOTIFY_TYPE:
        raise HookInputError(f"codex notify type {kind!r} is not one backchannel maps")
    inputs = obj.get("input-messages")
    prompt = (
        "\n\n".join(m for m in inputs if isinstance(m, str)) if isinstance(inputs, list) else ""
    )
    return HookEvent(
        runtime=NAME,
        name=NOTIFY_TYPE,
        kind=HookKind.STOP,
        session_id=req_str(obj, "thread-id", "session-id"),
        text=opt_str(obj, "last-assistant-message") or "",
        answerable=False,
        extra={"input": prompt, "turn_id": obj.get("turn-id")},
        stop_id=opt_str(obj, "turn-id") or None,
    )


def parse(payload: Any) -> HookEvent:
    if isinstance(payload, Mapping) and "type" in payload and "hook_event_name" not in payload:
        return _notify(payload)
    return parse_event(NAME, payload, _KINDS)


RUNTIME = Runtime(NAME, parse, render_event, EVENTS)
