"""Agent runtimes: hook payloads of Claude Code, Codex and Gemini CLI turned into hub
events (:mod:`.receiver`), their hook answers, and ``attach`` (:mod:`.attach`), which
writes a runtime's MCP and hook configuration into a project.

The names below load on first use: the lean command hook imports one small module of
this package (:mod:`.transcripts`, :mod:`.channel_tags`) and must not pay for the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backchannel.runtimes.common import (
        HookEvent,
        HookInputError,
        HookKind,
        Outcome,
        Runtime,
    )

__all__ = [
    "RUNTIMES",
    "HookEvent",
    "HookInputError",
    "HookKind",
    "Outcome",
    "Runtime",
    "get_runtime",
]

_COMMON = ("HookEvent", "HookInputError", "HookKind", "Outcome", "Runtime")
RUNTIMES: dict[str, Runtime]


def _runtimes() -> dict[str, Runtime]:
    from backchannel.runtimes import claude_code, codex, gemini

    return {rt.name: rt for rt in (claude_code.RUNTIME, codex.RUNTIME, gemini.RUNTIME)}


def get_runtime(name: str) -> Runtime:
    from backchannel.errors import InvalidRequest

    runtimes: dict[str, Runtime] = __getattr__("RUNTIMES")
    runtime = runtimes.get(name)
    if runtime is None:
        known = ", ".join(runtimes)
        raise InvalidRequest(f"unknown runtime {name!r}; use one of: {known}", field="runtime")
    return runtime


def __getattr__(name: str) -> Any:
    if name == "RUNTIMES":
        value: Any = _runtimes()
    elif name in _COMMON:
        value = getattr(importlib.import_module("backchannel.runtimes.common"), name)
    else:
        raise AttributeError(f"module 'backchannel.runtimes' has no attribute {name!r}")
    globals()[name] = value
    return value
