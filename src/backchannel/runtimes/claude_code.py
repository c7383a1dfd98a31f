"""Claude Code hooks: payloads in, hook output JSON out.

Every payload carries ``session_id``, ``transcript_path``, ``cwd`` and
``hook_event_name``. Mapped events:

=================  =========================================================
SessionStart       open (or resume) the session; ``source`` startup/resume/clear/compact
UserPromptSubmit   ``turn_start`` with ``prompt``; waiting messages as additionalContext
PreToolUse         ``tool_call`` (``tool_name``, ``tool_input``, ``tool_use_id``)
PostToolUse        ``tool_result`` (``tool_response``)
Stop               ``agent_stop`` with ``last_assistant_message`` (the command hook fills
                   it in from the transcript when it is missing, see :mod:`.transcripts`);
                   waiting messages answer ``decision: block``. What tells the same
                   ``Stop`` reported twice from a new turn's: the uuid of the turn's last
                   assistant message, which the command hook reads from the transcript
                   (``backchannel_stop_id``), and ``prompt_id``
SubagentStop       ``agent_output`` of a subagent, inside the parent's turn
SessionEnd         terminate the session (``reason``)
=================  =========================================================

Codex's hooks use the same payloads and answers (:mod:`.codex` reuses :func:`parse_event`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.runtimes.channel_tags import (
    SEEN_FIELD,
    STOP_CONTEXT_SINCE,
    STOP_ID_FIELD,
    VERSION_FIELD,
    channel_ids,
    version_tuple,
)
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

NAME = "claude-code"
EVENTS = (
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "Stop",
    "SubagentStop",
    "SessionEnd",
)
_KINDS = {
    "SessionStart": HookKind.SESSION_START,
    "UserPromptSubmit": HookKind.PROMPT,
    "PreToolUse": HookKind.TOOL_CALL,
    "PostToolUse": HookKind.TOOL_RESULT,
    "Stop": HookKind.STOP,
    "SubagentStop": HookKind.SUBAGENT_STOP,
    "SessionEnd": HookKind.SESSION_END,
}


def _seen(obj: Mapping[str, Any], prompt: str) -> tuple[str, ...]:
    listed = obj.get(SEEN_FIELD)
    extra = [i for i in listed if isinstance(i, str)] if isinstance(listed, list) else []
    return tuple(dict.fromkeys([*channel_ids(prompt), *extra]))[:100]


def _stop_id(obj: Mapping[str, Any]) -> str | None:
    """What names a stop: Codex's ``turn_id``; for Claude Code, whose payload names no
    turn, the uuid of the turn's last assistant message the command hook read from the
    transcript (:func:`~backchannel.runtimes.transcripts.last_assistant_uuid`)."""
    return opt_str(obj, "turn_id") or opt_str(obj, STOP_ID_FIELD) or None


def parse_event(runtime: str, payload: Any, kinds: Mapping[str, HookKind] = _KINDS) -> HookEvent:
    """A Claude-shaped hook payload (Claude Code, Codex hooks) as a :class:`HookEvent`."""
    obj, name = event_name(payload, "hook_event_name")
    kind = kinds.get(name)
    if kind is None:
        raise HookInputError(f"{runtime} event {name!r} is not one backchannel maps")
    sid = req_str(obj, "session_id")
    transcript = opt_str(obj, "transcript_path")
    prompt = (opt_str(obj, "prompt") or "") if kind is HookKind.PROMPT else ""
    common: dict[str, Any] = {
        "runtime": runtime,
        "name": name,
        "kind": kind,
        "session_id": sid,
        "transcript_path": transcript,
        "seen": _seen(obj, prompt),
        "had": had_ids(obj),
        "runtime_key": runtime_of(obj),
    }
    if kind is HookKind.PROMPT:
        return HookEvent(**common, text=prompt)
    if kind in (HookKind.TOOL_CALL, HookKind.TOOL_RESULT):
        tool = req_str(obj, "tool_name")
        text = (
            tool_call_text(tool, obj.get("tool_input"))
            if kind is HookKind.TOOL_CALL
            else compact(obj.get("tool_response", ""))
        )
        return HookEvent(**common, text=text, tool=tool, tool_id=opt_str(obj, "tool_use_id"))
    if kind in (HookKind.STOP, HookKind.SUBAGENT_STOP):
        # never read from transcript_path here: the hub parses payloads it received over
        # HTTP; the command hook fills the message in on the agent's machine (.transcripts)
        closing = opt_str(obj, "last_assistant_message")
        extra = {"agent_id": obj["agent_id"]} if isinstance(obj.get("agent_id"), str) else {}
        if isinstance(obj.get("agent_type"), str):
            extra["agent_type"] = obj["agent_type"]
        if kind is HookKind.STOP and isinstance(obj.get(VERSION_FIELD), str):
            extra["cli_version"] = obj[VERSION_FIELD]
        return HookEvent(
            **common,
            text=closing or "",
            stop_hook_active=opt_bool(obj, "stop_hook_active"),
            extra=extra,
            stop_id=_stop_id(obj) if kind is HookKind.STOP else None,
            prompt_id=(opt_str(obj, "prompt_id") or None) if kind is HookKind.STOP else None,
        )
    if kind is HookKind.SESSION_START:
        return HookEvent(**common, detail=opt_str(obj, "source") or "")
    return HookEvent(**common, detail=opt_str(obj, "reason") or "")


def parse(payload: Any) -> HookEvent:
    return parse_event(NAME, payload)


def render_event(event: HookEvent, outcome: Outcome) -> dict[str, Any]:
    """Claude Code's hook output: a stopping agent goes on with the waiting messages as its
    input, as plain feedback (``hookSpecificOutput.additionalContext``) where the version
    takes it, else ``decision: block`` (shown as a "stop hook problem"; older versions
    and Codex); ``additionalContext`` adds to a prompt or a session start."""
    if outcome.continue_with and event.kind is HookKind.STOP and event.answerable:
        if version_tuple(event.extra.get("cli_version")) >= STOP_CONTEXT_SINCE:
            return {
                "hookSpecificOutput": {
                    "hookEventName": event.name,
                    "additionalContext": outcome.continue_with,
                }
            }
        return {"decision": "block", "reason": outcome.continue_with}
    if outcome.context and event.kind in (HookKind.PROMPT, HookKind.SESSION_START):
        return {
            "hookSpecificOutput": {
                "hookEventName": event.name,
                "additionalContext": outcome.context,
            }
        }
    return {}


RUNTIME = Runtime(NAME, parse, render_event, EVENTS)
