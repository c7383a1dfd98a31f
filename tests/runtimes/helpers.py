"""Hook payload fixtures (each runtime's documented shape) and small helpers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from backchannel.hub import Hub
from backchannel.runtimes.receiver import HookResult, handle_hook

FIXTURES = Path(__file__).parent / "fixtures"

#: runtime -> its mapped events, in the order a session sees them
SEQUENCES = {
    "claude-code": [
        "SessionStart",
        "UserPromptSubmit",
        "PreToolUse",
        "PostToolUse",
        "SubagentStop",
        "Stop",
        "SessionEnd",
    ],
    "codex": [
        "SessionStart",
        "UserPromptSubmit",
        "PreToolUse",
        "PostToolUse",
        "Stop",
        "SessionEnd",
    ],
    "gemini": [
        "SessionStart",
        "BeforeAgent",
        "BeforeTool",
        "AfterTool",
        "AfterAgent",
        "SessionEnd",
    ],
}
STOP_EVENT = {"claude-code": "Stop", "codex": "Stop", "gemini": "AfterAgent"}
PROMPT_EVENT = {
    "claude-code": "UserPromptSubmit",
    "codex": "UserPromptSubmit",
    "gemini": "BeforeAgent",
}


def fixture(runtime: str, name: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / runtime / f"{name}.json").read_text())
    data.update(changes)
    return data


def session_of(runtime: str) -> str:
    return str(fixture(runtime, SEQUENCES[runtime][0])["session_id"])


async def call(hub: Hub, team: str, member: str, runtime: str, payload: Any) -> HookResult:
    m = await hub.get_member(team, member)
    return await handle_hook(hub, m, runtime, payload)
