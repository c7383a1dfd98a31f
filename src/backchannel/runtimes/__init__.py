"""Agent runtimes: hook payloads of Claude Code, Codex and Gemini CLI turned into hub
events (:mod:`.receiver`), their hook answers, and ``attach`` (:mod:`.attach`), which
writes a runtime's MCP and hook configuration into a project."""

from __future__ import annotations

from backchannel.errors import InvalidRequest
from backchannel.runtimes import claude_code, codex, gemini
from backchannel.runtimes.common import HookEvent, HookInputError, HookKind, Outcome, Runtime

__all__ = [
    "RUNTIMES",
    "HookEvent",
    "HookInputError",
    "HookKind",
    "Outcome",
    "Runtime",
    "get_runtime",
]

RUNTIMES: dict[str, Runtime] = {
    rt.name: rt for rt in (claude_code.RUNTIME, codex.RUNTIME, gemini.RUNTIME)
}


def get_runtime(name: str) -> Runtime:
    runtime = RUNTIMES.get(name)
    if runtime is None:
        known = ", ".join(RUNTIMES)
        raise InvalidRequest(f"unknown runtime {name!r}; use one of: {known}", field="runtime")
    return runtime
