"""Gemini CLI hooks: payloads in, hook output JSON out.

Every payload carries ``session_id``, ``transcript_path``, ``cwd``,
``hook_event_name`` and ``timestamp``. Mapped events:

============  ==============================================================
SessionStart  open (or resume) the session; ``source`` startup/resume/clear
BeforeAgent   ``turn_start`` with ``prompt``; waiting messages as additionalContext
BeforeTool    ``tool_call`` (``tool_name``, ``tool_input``)
AfterTool     ``tool_result`` (``tool_response``: ``llmContent``, ``returnDisplay``, ``error``)
AfterAgent    ``agent_stop`` with ``prompt_response``; waiting messages answer
              ``{"decision": "deny", "reason": ...}``, which Gemini sends to the agent
              as a new prompt
SessionEnd    terminate the session (``reason``)
============  ==============================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.runtimes.common import (
    HookEvent,
    HookInputError,
    HookKind,
    Outcome,
    Runtime,
    compact,
    event_name,
    had_ids,
    opt_bool,
    opt_str,
    req_str,
    runtime_of,
    tool_call_text,
)

NAME = "gemini"
EVENTS = ("SessionStart", "BeforeAgent", "BeforeTool", "AfterTool", "AfterAgent", "SessionEnd")
_KINDS = {
    "SessionStart": HookKind.SESSION_START,
    "BeforeAgent": HookKind.PROMPT,
    "BeforeTool": HookKind.TOOL_CALL,
    "AfterTool": HookKind.TOOL_RESULT,
    "AfterAgent": HookKind.STOP,
    "SessionEnd": HookKind.SESSION_END,
}


def _tool_response(value: Any) -> str:
    if isinstance(value, Mapping):
        error = value.get("error")
        if error:
            return f"error: {compact(error)}"
        for key in ("llmContent", "returnDisplay"):
            if value.get(key) not in (None, ""):
                return compact(value[key])
    return compact(value if value is not None else "")


def parse(payload: Any) -> HookEvent:
    obj, name = event_name(payload, "hook_event_name")
    kind = _KINDS.get(name)
    if kind is None:
        raise HookInputError(f"gemini event {name!r} is not one backchannel maps")
    common: dict[str, Any] = {
        "runtime": NAME,
        "name": name,
        "kind": kind,
        "session_id": req_str(obj, "session_id"),
        "transcript_path": opt_str(obj, "transcript_path"),
        "had": had_ids(obj),
        "runtime_key": runtime_of(obj),
    }
    if kind is HookKind.PROMPT:
        return HookEvent(**common, text=opt_str(obj, "prompt") or "")
    if kind in (HookKind.TOOL_CALL, HookKind.TOOL_RESULT):
        tool = req_str(obj, "tool_name")
        text = (
            tool_call_text(tool, obj.get("tool_input"))
            if kind is HookKind.TOOL_CALL
            else _tool_response(obj.get("tool_response"))
        )
        return HookEvent(**common, text=text, tool=tool)
    if kind is HookKind.STOP:
        return HookEvent(
            **common,
            text=opt_str(obj, "prompt_response") or "",
            stop_hook_active=opt_bool(obj, "stop_hook_active"),
            extra={"input": opt_str(obj, "prompt") or ""},
            # Gemini names no turn, but stamps each call of its hooks: every hook of one
            # AfterAgent (and a call made again) gets the same input, another turn's end
            # another time
            stop_id=opt_str(obj, "timestamp") or None,
        )
    if kind is HookKind.SESSION_START:
        return HookEvent(**common, detail=opt_str(obj, "source", "trigger") or "")
    return HookEvent(**common, detail=opt_str(obj, "reason", "trigger") or "")


def render(event: HookEvent, outcome: Outcome) -> dict[str, Any]:
    """Gemini CLI's hook output: ``decision: deny`` on AfterAgent rejects the stop and
    sends ``reason`` to the agent as a new prompt; ``additionalContext`` is appended to a
    prompt (BeforeAgent) or opens the session's history (SessionStart)."""
    if outcome.continue_with and event.kind is HookKind.STOP:
        return {"decision": "deny", "reason": outcome.continue_with}
    if outcome.context and event.kind in (HookKind.PROMPT, HookKind.SESSION_START):
        return {
            "hookSpecificOutput": {
                "hookEventName": event.name,
                "additionalContext": outcome.context,
            }
        }
    return {}


RUNTIME = Runtime(NAME, parse, render, EVENTS)
